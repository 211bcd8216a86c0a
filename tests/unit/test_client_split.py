"""The client's retry of a ScoreBatch that a replica shed as a whole (FAKE engine): the batch is split in halves sent
apart, never resent whole; what is still refused when the deadline or the retries run out comes back as each
group's own error (named by the caller's index), not as a failed call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from reward_server.client import RewardClient
from reward_server.http.convert import group_from_json
from reward_server.types import ErrorInfo, GroupResponse
from tests.unit.test_reward_limits import _cand, _shedding
from tests.unit.test_reward_service import Service, body


def _record_batches(s: Service) -> list[int]:
    """The sizes of the ScoreBatch calls that reach ``s``'s core."""
    sizes: list[int] = []
    score_batch = s.core.score_batch

    async def recording(groups: Any, timeout_s: float | None = None) -> Any:
        sizes.append(len(groups))
        return await score_batch(groups, timeout_s)

    s.core.score_batch = recording  # type: ignore[method-assign]
    return sizes


async def _busy_and_small() -> AsyncIterator[tuple[Service, Service]]:
    """Replica a judges one group and has no waiting room (it is kept busy); b judges 2 at once, no waiting room."""
    async for a in _shedding(0.3, 1, 0):
        async for b in _shedding(0.05, 2, 0):
            yield a, b


async def test_a_batch_shed_whole_is_split_into_halves_not_resent() -> None:
    async for a, b in _busy_and_small():
        hold = asyncio.create_task(a.grpc_score(body([_cand(100)])))
        await asyncio.sleep(0.05)
        sizes_a, sizes_b = _record_batches(a), _record_batches(b)
        groups = [group_from_json(body([_cand(i)])) for i in range(4)]
        async with RewardClient([a.address, b.address], timeout_s=20, backoff_s=0.01) as client:
            out = await client.score_batch(groups)
        assert all(isinstance(o, GroupResponse) and o.results[0].status.value == "ok" for o in out), out
        await hold
        # a shed the whole batch; after that only halves (and halves of halves) were sent, to either replica
        assert sizes_a[0] == 4 and max(sizes_a[1:] + sizes_b) <= 2 and sizes_b, (sizes_a, sizes_b)
        # each group judged once (the scripted judge: 4 rounds a candidate; a also judged the group that held it)
        assert len(a.engine.calls) + len(b.engine.calls) == 4 * 5


async def test_what_stays_shed_comes_back_as_each_groups_error() -> None:
    async for a in _shedding(2.0, 1, 0):
        a.core.admission._hold_s = 30.0  # the hint (30 s) is past the caller's deadline: no retry fits
        hold = asyncio.create_task(a.grpc_score(body([_cand(100)])))
        await asyncio.sleep(0.05)
        groups = [group_from_json(body([_cand(i)])) for i in range(3)]
        async with RewardClient([a.address], timeout_s=1.0, backoff_s=0.01) as client:
            out = await client.score_batch(groups)
        assert [(o.code, o.field) for o in out if isinstance(o, ErrorInfo)] == [
            ("RESOURCE_EXHAUSTED", f"groups[{j}]") for j in range(3)]
        hold.cancel()


async def test_groups_shed_inside_an_answer_keep_the_callers_index() -> None:
    async for a in _shedding(0.05, 1, 0):  # one slot, no waiting room: of a batch, one group is judged
        groups = [group_from_json(body([_cand(i)])) for i in range(3)]
        async with RewardClient([a.address], timeout_s=10.0, backoff_s=0.01, max_retries=1) as client:
            out = await client.score_batch(groups)
        # the first call judges groups[0]; the resent [1, 2] judges groups[1] and sheds groups[2] as its groups[1]
        assert isinstance(out[0], GroupResponse) and isinstance(out[1], GroupResponse)
        assert isinstance(out[2], ErrorInfo) and (out[2].code, out[2].field) == ("RESOURCE_EXHAUSTED", "groups[2]")
