"""Limits and load shedding of the reward service in-process (FAKE engine): the body-size limit (413 on HTTP,
RESOURCE_EXHAUSTED from gRPC's own message bound), the bounded admission queue on both fronts (429 + Retry-After,
RESOURCE_EXHAUSTED + retry hint, counted in metrics), and the client's retries on another replica."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from reward_server.admission import Admission
from reward_server.client import RewardCallError, RewardClient
from reward_server.config import ServerConfig
from reward_server.errors import RETRY_AFTER_KEY
from reward_server.grpc.servicer import RewardServicer
from reward_server.http.app import create_app
from reward_server.http.convert import group_from_json
from reward_server.metrics import Metrics
from reward_server.proto import pb_grpc
from reward_server.server import grpc_server_options
from tests.conftest import free_port
from tests.unit.test_reward_service import GOOD, Service, body, make_service


def _cand(i: int) -> str:
    """A distinct valid candidate (distinct cache keys, so each is judged)."""
    return GOOD.replace("discouraging", f"discouraging ({i})")


def _metric(text: str, line_start: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


async def _shedding(delay: float, max_in_flight: int, max_waiting: int | None) -> AsyncIterator[Service]:
    async for s in make_service(delay=delay):
        s.core.admission = Admission(max_in_flight, max_waiting, s.core.metrics)
        yield s


async def test_admission_sheds_past_the_waiting_room_over_http() -> None:
    async for s in _shedding(0.2, 1, 1):  # one judged, one waiting, the third refused at once
        t0 = time.monotonic()
        replies = await asyncio.gather(*(s.http.post("/v1/score", json=body([_cand(i)])) for i in range(3)))
        codes = sorted(r.status_code for r in replies)
        assert codes == [200, 200, 429]
        shed = next(r for r in replies if r.status_code == 429)
        assert shed.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
        assert int(shed.headers["retry-after"]) >= 1
        assert "overloaded" in shed.json()["error"]["message"]
        assert time.monotonic() - t0 < 10
        text = (await s.http.get("/metrics")).text
        assert _metric(text, 'compeer_shed_groups_total{reason="queue_full"}') == 1
        assert _metric(text, 'compeer_requests_total{code="RESOURCE_EXHAUSTED"') == 1
        assert "compeer_admission_waiting_groups" in text and "compeer_admission_in_flight_groups" in text


async def test_admission_sheds_over_grpc_with_a_retry_hint() -> None:
    async for s in _shedding(0.2, 1, 0):  # no waiting room: a second group while one is judged is refused
        results = await asyncio.gather(*(s.grpc_score(body([_cand(i)])) for i in range(2)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert len(errors) == 1 and errors[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        meta = dict(errors[0].trailing_metadata() or ())
        assert int(meta[RETRY_AFTER_KEY]) >= 1000 and meta["compeer-error-code"] == "RESOURCE_EXHAUSTED"


async def test_a_batch_over_the_bound_finishes_some_groups_and_refuses_the_rest() -> None:
    async for s in _shedding(0.05, 2, 2):
        batch = {"groups": [body([_cand(i)]) for i in range(6)]}
        r = await s.http.post("/v1/score:batch", json=batch)
        assert r.status_code == 200
        groups = r.json()["groups"]
        ok = [g for g in groups if "results" in g]
        shed = [g for g in groups if "error" in g]
        assert len(ok) == 4 and all(g["results"][0]["status"] == "ok" for g in ok)
        assert len(shed) == 2 and {g["error"]["code"] for g in shed} == {"RESOURCE_EXHAUSTED"}
        assert all(g["error"]["field"].startswith("groups[") for g in shed)
        # while the slots and the waiting room are full, a whole batch is refused as a call (the client retries it)
        busy = [asyncio.create_task(s.http.post("/v1/score", json=body([_cand(100 + i)]))) for i in range(4)]
        await asyncio.sleep(0.02)
        refused = await s.http.post("/v1/score:batch", json={"groups": [body([_cand(200)])]})
        assert refused.status_code == 429 and "retry-after" in refused.headers
        assert all(t.status_code == 200 for t in await asyncio.gather(*busy))


async def test_cache_hits_are_served_under_overload() -> None:
    async for s in _shedding(0.3, 1, 0):
        assert (await s.http.post("/v1/score", json=body([GOOD]))).status_code == 200
        busy = asyncio.create_task(s.http.post("/v1/score", json=body([_cand(1)])))
        await asyncio.sleep(0.05)
        hit = await s.http.post("/v1/score", json=body([GOOD]))
        assert hit.status_code == 200 and hit.json()["results"][0]["cache_hit"] is True
        assert (await busy).status_code == 200


async def test_a_queued_group_past_its_deadline_never_reaches_the_engine() -> None:
    async for s in _shedding(0.5, 1, 8):
        first = asyncio.create_task(s.http.post("/v1/score", json=body([_cand(1)])))
        await asyncio.sleep(0.05)
        late = await s.http.post("/v1/score", json=body([_cand(2)], timeout_ms=300))
        assert late.status_code == 504 and late.json()["error"]["code"] == "DEADLINE_EXCEEDED"
        assert (await first).status_code == 200
        assert not any("(2)" in str(c.messages) for c in s.engine.calls), "the timed-out waiter was judged"
        assert s.core.admission.waiting == 0 and s.core.admission.in_flight == 0


async def test_body_over_the_limit_is_413_before_parsing() -> None:
    async for s in make_service():
        s.core.config.max_body_bytes = 4096
        app = create_app(s.core)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            big = body([GOOD] * 30)
            r = await http.post("/v1/score", json=big)  # declared Content-Length
            assert r.status_code == 413
            err = r.json()["error"]
            assert err["field"] == "body" and "4096" in err["message"] and err["code"] == "INVALID_ARGUMENT"

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
                for _ in range(100):
                    yield b" " * 100

            r = await http.post("/v1/score:batch", content=chunks())
            assert r.status_code == 413 and r.json()["error"]["field"] == "body"
            assert (await http.post("/v1/score", json=body([GOOD]))).status_code == 200
        assert len(s.engine.calls) == 4  # only the small request was judged


async def test_grpc_message_limit_is_the_body_limit() -> None:
    config = ServerConfig(max_body_bytes=4096)
    server = grpc.aio.server(options=grpc_server_options(config))
    async for s in make_service():
        pb_grpc.add_RewardServiceServicer_to_server(RewardServicer(s.core), server)
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        await server.start()
        try:
            async with RewardClient([f"127.0.0.1:{port}"], timeout_s=10, backoff_s=0.01) as client:
                with pytest.raises(RewardCallError) as exc:
                    await client.score_group(group_from_json(body([GOOD] * 30)))
                assert exc.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert client.retries == 0  # the transport's refusal carries no retry hint: not retried
                assert (await client.score_group(group_from_json(body([GOOD])))).results[0].status.value == "ok"
        finally:
            await server.stop(None)


async def _two_replicas() -> AsyncIterator[tuple[Service, Service]]:
    async for a in _shedding(0.3, 1, 0):
        async for b in make_service():
            yield a, b


async def test_client_retries_a_shed_call_on_another_replica() -> None:
    async for a, b in _two_replicas():
        hold = asyncio.create_task(a.grpc_score(body([_cand(1)])))  # replica a is busy and has no waiting room
        await asyncio.sleep(0.05)
        async with RewardClient([a.address, b.address], timeout_s=10, backoff_s=0.01) as client:
            resp = await client.score_group(group_from_json(body([_cand(2)])))
            assert resp.results[0].status.value == "ok"
            assert client.retries == 1 and len(b.engine.calls) == 4
        await hold


async def test_client_resends_the_shed_groups_of_a_batch() -> None:
    async for a, b in _two_replicas():
        groups = [group_from_json(body([_cand(i)])) for i in range(3)]  # a judges one, sheds two
        async with RewardClient([a.address, b.address], timeout_s=10, backoff_s=0.01) as client:
            out = await client.score_batch(groups)
        assert [type(o).__name__ for o in out] == ["GroupResponse"] * 3
        assert len(a.engine.calls) == 4 and len(b.engine.calls) == 8


async def test_client_gives_up_within_its_deadline_honouring_the_hint() -> None:
    async for a in _shedding(2.0, 1, 0):
        a.core.admission._hold_s = 30.0  # a long drain estimate: the hint is longer than the caller's deadline
        hold = asyncio.create_task(a.grpc_score(body([_cand(1)])))
        await asyncio.sleep(0.05)
        async with RewardClient([a.address], timeout_s=1.0, backoff_s=0.01) as client:
            t0 = time.monotonic()
            with pytest.raises(RewardCallError) as exc:
                await client.score_group(group_from_json(body([_cand(2)])))
            assert exc.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() - t0 < 1.0  # it did not sleep past its deadline waiting for the hint
        hold.cancel()


def test_admission_and_limit_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_waiting_groups -2"):
        ServerConfig(max_waiting_groups=-2).validate()
    with pytest.raises(ValueError, match="max_body_bytes 10"):
        ServerConfig(max_body_bytes=10).validate()
    with pytest.raises(ValueError, match="max_in_flight"):
        Admission(0, None, Metrics())



async def test_a_big_batch_on_a_shared_engine_finishes_in_waves_instead_of_timing_out_together() -> None:
    """The issue's observation, simulated: an engine that shares its capacity among everything in flight (like a
    vLLM-CPU engine on two cores) makes each generation take longer the more run at once. 64 one-candidate groups
    admitted together all pass the per-candidate judge limit (every candidate ``timeout``); 8 at a time, all are
    judged ``ok``."""
    from tests.unit.fakes import scripted_judge

    judge = scripted_judge()

    async def shared(messages: Any, params: Any) -> Any:
        await asyncio.sleep(0.004 * engine.queue_depth())  # processor sharing: slower with more in flight
        return judge(messages, params)

    outcomes = {}
    for in_flight in (64, 8):
        async for s in make_service(shared):
            engine = s.engine
            s.core.config.judge_timeout_s = 0.6
            s.core.admission = Admission(in_flight, 256, s.core.metrics)
            batch = {"groups": [body([_cand(i)]) for i in range(64)]}
            groups = (await s.http.post("/v1/score:batch", json=batch)).json()["groups"]
            outcomes[in_flight] = Counter(g["results"][0]["status"] for g in groups)
    assert outcomes[64] == Counter({"timeout": 64})
    assert outcomes[8] == Counter({"ok": 64})
