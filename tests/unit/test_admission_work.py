"""Admission by work (``--admission-window-s``): the cost estimate and the measured rate, FIFO admission bounded
by the work the engine finishes in the window, groups that cannot finish before their deadline refused early, and
the issue's overload case on a FAKE engine that shares its capacity among everything in flight."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from cer.dialogue import Turn
from cer.modes import JudgeMode
from reward_server.admission import Admission
from reward_server.errors import Overloaded
from reward_server.metrics import Metrics
from reward_server.workload import Throughput, group_cost
from tests.unit.test_reward_limits import _cand, _metric
from tests.unit.test_reward_service import body, make_service


def test_group_cost_grows_with_candidates_history_and_rounds() -> None:
    short = [Turn("seeker", "I failed my test.")]
    long = short * 40
    one = group_cost(short, "ref", ["c" * 400], JudgeMode.UNIFIED)
    assert group_cost(short, "ref", [], JudgeMode.UNIFIED) == 0.0
    assert group_cost(short, "ref", ["c" * 400] * 5, JudgeMode.UNIFIED) > 4.5 * one
    assert group_cost(long, "ref", ["c" * 400], JudgeMode.UNIFIED) > one
    assert group_cost(short, "ref", ["c" * 400], JudgeMode.ORM) < one / 2


def test_throughput_is_work_per_busy_second() -> None:
    t = Throughput()
    assert t.rate is None
    t.started()
    time.sleep(0.05)
    t.finished(100.0, completed=True)
    assert t.rate is not None and 100 / 0.2 < t.rate <= 100 / 0.05
    time.sleep(0.05)  # idle time is not busy time
    t.started()
    time.sleep(0.05)
    t.finished(100.0, completed=False)  # cancelled: its time counts, its work does not
    t.started()
    t.finished(100.0, completed=True)
    assert t.rate is not None and 200 / 0.3 < t.rate <= 200 / 0.1


def _measured(adm: Admission, rate: float) -> Admission:
    adm.throughput._done, adm.throughput._busy = rate, 1.0
    return adm


async def test_work_in_flight_is_bounded_by_the_window_and_admitted_in_order() -> None:
    adm = _measured(Admission(8, 8, Metrics(), window_s=1.0), rate=100.0)  # 100 units a second: 100 at once
    order: list[int] = []
    release = asyncio.Event()

    async def group(i: int) -> None:
        async with adm.slot(f"g{i}", cost=60.0):
            order.append(i)
            await release.wait()

    tasks = [asyncio.create_task(group(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    assert (order, adm.in_flight, adm.waiting) == ([0], 1, 2)  # 60 + 60 > 100: the second waits
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]


async def test_one_group_at_a_time_until_the_rate_is_measured() -> None:
    adm = Admission(8, 8, Metrics(), window_s=10.0)
    async with adm.slot("a", cost=1.0):
        waiter = asyncio.create_task(adm.slot("b", cost=1.0).__aenter__())
        await asyncio.sleep(0.01)
        assert adm.waiting == 1 and not waiter.done()
    await waiter
    assert adm.in_flight == 1 and adm.throughput.rate is not None


async def test_a_group_that_cannot_finish_before_its_deadline_is_refused_at_once() -> None:
    metrics = Metrics()
    adm = _measured(Admission(8, 8, metrics, window_s=10.0), rate=100.0)
    async with adm.slot("a", cost=80.0):
        with pytest.raises(Overloaded, match="within its deadline") as exc:  # (80 + 50) / 100 s > 1 s
            async with adm.slot("b", cost=50.0, deadline=time.monotonic() + 1.0):
                pass
        assert exc.value.field == "b" and exc.value.retry_after_s >= 1
        async with adm.slot("c", cost=10.0, deadline=time.monotonic() + 1.0):  # (80 + 10) / 100 s fits
            pass
    assert metrics.shed.labels("deadline")._value.get() == 1


async def test_a_waiting_group_whose_turn_comes_too_late_is_refused_then() -> None:
    adm = _measured(Admission(1, 8, Metrics(), window_s=10.0), rate=100.0)  # one group at a time
    async with adm.slot("a", cost=10.0):
        late = asyncio.create_task(adm.slot("b", cost=50.0, deadline=time.monotonic() + 0.7).__aenter__())
        await asyncio.sleep(0.3)  # on arrival: (10 + 50) / 100 = 0.6 s fits; when a leaves, 0.3 + 0.5 does not
    with pytest.raises(Overloaded, match="within its deadline"):
        await late
    assert adm.waiting == 0 and adm.in_flight == 0


async def test_the_issues_batch_is_mostly_scored_instead_of_all_timeout() -> None:
    """8 groups x 5 candidates in one batch on an engine that shares its capacity among everything in flight (each
    generation waits 10 ms per generation in flight): admitted together (by count, 8 at once) every candidate runs
    past the per-candidate limit; admitted by work, groups finish in order, and the one that could not finish
    before the batch's deadline is refused early, alone."""
    from tests.unit.fakes import scripted_judge

    judge = scripted_judge()

    async def shared(messages: Any, params: Any) -> Any:
        await asyncio.sleep(0.01 * engine.queue_depth())
        return judge(messages, params)

    outcomes: dict[float, Counter[str]] = {}
    for window_s in (0.0, 0.4):
        async for s in make_service(shared):
            engine = s.engine
            s.core.config.judge_timeout_s = 1.0
            s.core.admission = Admission(8, 256, s.core.metrics, window_s=window_s)
            batch = {"groups": [body([_cand(10 * g + c) for c in range(5)], timeout_ms=1500) for g in range(8)]}
            groups = (await s.http.post("/v1/score:batch", json=batch)).json()["groups"]
            seen: Counter[str] = Counter()
            for g in groups:
                if "error" in g:
                    seen[g["error"]["code"]] += 1
                else:
                    seen.update(r["status"] for r in g["results"])
            outcomes[window_s] = seen
            if window_s:
                scored = ["error" not in g for g in groups]
                assert scored == sorted(scored, reverse=True), scored  # the earliest groups are the ones judged
                text = (await s.http.get("/metrics")).text
                assert _metric(text, 'compeer_shed_groups_total{reason="deadline"}') == seen["RESOURCE_EXHAUSTED"]
    assert outcomes[0.0] == Counter({"timeout": 40})
    assert outcomes[0.4]["ok"] >= 25 and outcomes[0.4]["timeout"] == 0, outcomes
