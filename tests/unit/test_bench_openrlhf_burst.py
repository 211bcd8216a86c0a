"""bench/openrlhf_burst.py's client side against the in-process service (FAKE engine): outcomes are classified, and
a burst past admission is shed with 429, not left to the client's timeout."""

from __future__ import annotations

from bench.openrlhf_burst import burst
from cer.modes import JudgeMode
from reward_server.config import GetRewardSettings
from tests.fake_engine import verdict_logprobs
from tests.unit.test_dialogue_scoring import judge_with
from tests.unit.test_openrlhf_compat import serve_http
from tests.unit.test_reward_service import make_service


async def test_a_burst_is_answered_or_shed() -> None:
    async for s in make_service(judge_with(), delay=0.2, logprobs=verdict_logprobs(1.0),
                                server={"get_reward": GetRewardSettings(mode=JudgeMode.PRM),
                                        "max_in_flight_groups": 2, "max_waiting_groups": 2}):
        async with serve_http(s.core) as url:
            figures = await burst(url, prompts=4, samples=3)
    assert figures["calls"] == 12 and figures["goal_met"]
    assert figures["outcomes"]["ok (200)"] >= 4 and figures["outcomes"].get("shed (429)", 0) >= 1
    assert sum(figures["outcomes"].values()) == 12
