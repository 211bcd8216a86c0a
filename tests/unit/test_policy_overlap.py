"""reward_overlap (policy_trainer.overlap, CompeerReward.prefetch): the reward call started before TRL asks for it.
Real TRL and LoRA on a tiny random Llama; the judge is FakeRewardClient (the real service: tests/integration)."""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from policy_trainer.config import ConfigError, LengthUnit, RewardOverlap
from policy_trainer.overlap import OverlappedGRPOTrainer, OverlapUnsupported
from policy_trainer.report import read_metrics
from policy_trainer.rewards import MAX_PREFETCHED, CompeerReward, RewardSettings
from policy_trainer.runner import run
from reward_server.types import GroupRequest, GroupResponse
from tests.unit.test_policy_fakes import FakeRewardClient, FakeScore
from tests.unit.test_policy_runner import _config, tiny_policy  # noqa: F401 (the fixture)

HIST = [{"role": "seeker", "text": "I lost my job and I cannot sleep."}]


def _by_text(text: str) -> FakeScore:
    h = zlib.crc32(text.encode())
    return FakeScore(steps=[1.0 if h & 1 else -1.0, 1.0, -1.0], preference=1.0 if h & 2 else -1.0, format=1.0,
                     s_in=0.1, s_hi=0.2)


def _fake_total(text: str) -> float | None:
    request = GroupRequest(history=[], reference=None, candidates=[text])
    (answer,) = asyncio.run(FakeRewardClient(default=_by_text).score_batch([request]))
    assert isinstance(answer, GroupResponse)
    return answer.results[0].rewards.total


def _completions(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]


def _train(policy: str, out: Path, overlap: str, fakes: list[FakeRewardClient], **extra: Any) -> None:
    def factory() -> FakeRewardClient:
        fakes.append(FakeRewardClient(default=_by_text))
        return fakes[-1]

    run(_config(policy, out, reward_overlap=overlap, max_steps=2, log_completions_file=True, seed=7, **extra), out,
        client_factory=factory)


def _asked(fake: FakeRewardClient) -> list[list[str]]:
    """The candidate texts of each ScoreBatch the judge was sent, in the order it was sent them."""
    return [[c for g in call for c in g.candidates] for call in fake.calls]


def test_same_step_trains_on_the_same_rewards_as_off_with_every_call_prefetched(
        tiny_policy: str, tmp_path: Path) -> None:  # noqa: F811
    fakes_off: list[FakeRewardClient] = []
    fakes_same: list[FakeRewardClient] = []
    _train(tiny_policy, tmp_path / "off", "off", fakes_off)
    _train(tiny_policy, tmp_path / "same", "same_step", fakes_same)
    off, same = _completions(tmp_path / "off"), _completions(tmp_path / "same")
    assert [(r["call"], r["text"], r["reward"]) for r in same] == [(r["call"], r["text"], r["reward"]) for r in off]
    assert len({r["call"] for r in same}) == 2
    # each line names the optimizer step it trains (from TRL's trainer_state), which a resumed run truncates by
    assert [r["step"] for r in same] == [r["call"] for r in same] and [r["step"] for r in off] == [r["call"] for r in off]
    assert [m["compeer/reward_prefetched"] for m in read_metrics(tmp_path / "same")] == [1.0, 1.0]
    assert [m["compeer/reward_prefetched"] for m in read_metrics(tmp_path / "off")] == [0.0, 0.0]
    # one judge call per step in both: the prefetch replaces TRL's call, it does not add one
    assert len(fakes_same[0].calls) == len(fakes_off[0].calls) == 2
    for m in read_metrics(tmp_path / "same"):
        assert 0.0 <= m["compeer/reward_wait_s"] and m["step_time"] > 0


def test_next_step_trains_the_batch_judged_while_the_previous_step_trained(
        tiny_policy: str, tmp_path: Path) -> None:  # noqa: F811
    fakes: list[FakeRewardClient] = []
    out = tmp_path / "next"
    _train(tiny_policy, out, "next_step", fakes)
    asked = _asked(fakes[0])
    # boundary 1: the batch trained now + the one judged ahead (same prompts); boundary 2: the next one ahead
    assert len(asked) == 3
    trained = _completions(out)
    by_call = [[r["text"] for r in trained if r["call"] == c] for c in (1, 2)]
    assert by_call == asked[:2], "step k trains the batch sent to the judge k-th, in that order"
    histories = [[g.history for g in call] for call in fakes[0].calls]
    assert histories[0] == histories[1], "the first boundary samples its prompts twice"
    for row in trained:  # each trained completion carries the judge's answer for its own text
        assert row["total"] == _fake_total(row["text"])
    assert [m["compeer/reward_prefetched"] for m in read_metrics(out)] == [1.0, 1.0]


def test_prefetch_is_taken_once_and_old_prefetches_are_cancelled() -> None:
    fake = FakeRewardClient(default=_by_text)
    reward = CompeerReward(RewardSettings(num_generations=2, length_unit=LengthUnit.WORDS), lambda: fake)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        prompts = [[{"role": "user", "content": "p"}]] * 2
        batches = [[f"reply {i} a", f"reply {i} b"] for i in range(MAX_PREFETCHED + 1)]
        columns = {"history": [HIST, HIST], "reference": [None, None]}
        for b in batches:
            reward.prefetch(prompts, b, None, columns, loop)
        assert len(reward._prefetched) == MAX_PREFETCHED  # the oldest was dropped (and its call cancelled)

        def ask(texts: list[str]) -> list[float | None]:
            coro = reward(prompts, texts, None, **columns)
            return asyncio.run_coroutine_threadsafe(coro, loop).result(10)

        ask(batches[-1])
        assert reward.last_stats is not None and reward.last_stats.prefetched
        calls_before = len(fake.calls)
        ask(batches[-1])  # taken once: asked again, it is judged again
        assert len(fake.calls) == calls_before + 1 and not reward.last_stats.prefetched
        asyncio.run_coroutine_threadsafe(reward.aclose(), loop).result(10)
        assert not reward._prefetched and fake.closed
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_overlap_setting_is_checked_and_the_trainer_refuses_what_it_cannot_replay(
        tiny_policy: str, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises((ValueError, ConfigError), match="reward_overlap must be one of off"):
        _config(tiny_policy, tmp_path, reward_overlap="sometimes")
    assert _config(tiny_policy, tmp_path).reward_overlap == RewardOverlap.SAME_STEP.value
    reward = CompeerReward(RewardSettings(num_generations=2), FakeRewardClient)
    with pytest.raises(OverlapUnsupported, match="does not support tools"):
        OverlappedGRPOTrainer(reward=reward, overlap=RewardOverlap.NEXT_STEP, tools=[print])
    with pytest.raises(OverlapUnsupported, match="use trl.GRPOTrainer"):
        OverlappedGRPOTrainer(reward=reward, overlap=RewardOverlap.OFF)


def test_the_wait_share_counts_what_a_step_waited_not_the_calls_own_latency() -> None:
    from policy_trainer.report import summarise

    rows = [{"step": s, "step_time": 10.0, "compeer/reward_call_latency_s": 4.0, "compeer/reward_wait_s": 0.5}
            for s in (1, 2)]
    assert summarise(rows)["reward_wait_share"] == pytest.approx(0.05)
    # a metrics file from before reward_overlap logged only the call's latency, which was then the wait
    legacy = [{k: v for k, v in r.items() if k != "compeer/reward_wait_s"} for r in rows]
    assert summarise(legacy)["reward_wait_share"] == pytest.approx(0.4)
