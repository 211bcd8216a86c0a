"""bench.judge_throughput's cache-latency phase: it repeats only a candidate it knows was cached (judged ok) and
reports what it could not measure instead of failing (``make bench`` raised ``expected a cache hit`` when the
repeated candidate had not been judged ok, so never cached)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.judge_throughput import cache_hit_latency, make_groups
from reward_server.types import GroupRequest


class FakeClient:
    """FAKE RewardClient: answers every call with one result whose cache_hit is ``hit``."""

    def __init__(self, hit: bool) -> None:
        self.hit = hit
        self.calls = 0

    async def score_group(self, group: GroupRequest) -> Any:
        self.calls += 1
        return SimpleNamespace(results=[SimpleNamespace(cache_hit=self.hit)])


async def test_no_ok_candidate_is_reported_not_measured() -> None:
    client = FakeClient(hit=True)
    out = await cache_hit_latency(client, [], 10)
    assert out["cache_hit_p50_ms"] is None and "no throughput candidate was judged ok" in out["cache_not_measured"]
    assert client.calls == 0


async def test_misses_are_reported_not_measured() -> None:
    out = await cache_hit_latency(FakeClient(hit=False), make_groups(1, 1, seed=0), 5)
    assert out["cache_hit_p50_ms"] is None and out["cache_not_measured"].startswith("5 of 5 repeats")


async def test_hits_give_latencies() -> None:
    client = FakeClient(hit=True)
    out = await cache_hit_latency(client, make_groups(1, 1, seed=0), 20)
    assert client.calls == 20 and out["cache_hit_p50_ms"] >= 0 and "cache_not_measured" not in out
