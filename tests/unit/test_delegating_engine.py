"""Engines that wrap another (the benchmarks' counting and recording engines, the evaluator's shared engine) are, to
their callers, the engine they wrap: every capability, the identity and the requests pass through, so a wrapper
never silently turns off graded verdicts (logprobs) or the answer prefix."""

from __future__ import annotations

import asyncio

import pytest

from bench.judge_engines_gpu import CountingEngine
from bench.judge_throughput import RecordingEngine
from cer.taxonomy import load_taxonomy
from evaluator.backends import _SharedEngine
from judge.conversation import Judge
from judge.engines.base import DelegatingEngine, Engine, EngineConfig, GenParams
from judge.factory import LazyEngine
from judge.protocol import JudgeSettings, load_template
from tests.fake_engine import FakeEngine


def _inner() -> FakeEngine:
    engine = FakeEngine(lambda messages, params: "Verdict: True", supports_regex=True, supports_line_bound=True,
                        logprobs=lambda text, params: [], supports_prefix=True,
                        config=EngineConfig(backend="fake", model_id="fake-judge", adapter_id="adapter@sha256:ab"))
    engine.max_logprobs = 7
    return engine


WRAPPERS = {
    "delegating": DelegatingEngine,
    "counting (bench.judge_engines_gpu)": CountingEngine,
    "recording (bench.judge_throughput)": RecordingEngine,
    "shared (evaluator.backends)": lambda inner: _SharedEngine(LazyEngine(inner)),
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_a_wrapper_is_the_engine_it_wraps(name: str) -> None:
    inner = _inner()
    wrapped: Engine = WRAPPERS[name](inner)
    for attr in Engine.CAPABILITIES:
        assert getattr(wrapped, attr) == getattr(inner, attr), attr
    assert wrapped.identity() == inner.identity()
    assert wrapped.identity()["adapter"] == "adapter@sha256:ab"
    # what the capabilities decide: a judge over the wrapper reads the verdict probabilities
    assert Judge(wrapped, load_template(), load_taxonomy(), JudgeSettings()).graded

    async def go() -> str:
        await wrapped.start()
        messages = [{"role": "system", "content": "judge"}, {"role": "user", "content": "hi"}]
        result = await wrapped.generate(messages, GenParams(max_tokens=4), "r1")
        return result.text

    assert asyncio.run(go()) == "Verdict: True"
    assert [c.request_id for c in inner.calls] == ["r1"]
    assert wrapped.healthy()


def test_a_wrapper_of_an_engine_without_logprobs_says_so() -> None:
    inner = FakeEngine()
    for wrap in WRAPPERS.values():
        wrapped = wrap(inner)
        assert wrapped.supports_logprobs is False and wrapped.supports_prefix is False
        assert not Judge(wrapped, load_template(), load_taxonomy(), JudgeSettings()).graded
