"""The transformers engine (``judge.engines.hf``) on the default model folder (tiny generations), and what "auto"
means for device and dtype (``judge.device``).

Needs the default model folder (``python -m judge.model_store``); the transformers tests are skipped
without it. The whole file runs in well under a minute on one CPU thread.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from judge.device import resolve_device_dtype
from judge.engines import create_engine
from judge.engines.base import EngineConfig, EngineError, GenParams, GenResult
from judge.engines.hf.engine import TransformersEngine
from judge.engines.hf.runner import sampling_key
from judge.engines.hf.stats import GenerateStats
from judge.engines.settings import TransformersSettings
from judge.protocol import ANSWER_PREFIX, round_constraint, round_regex

# --------------------------------------------------------------------------- transformers


def _default_model_path() -> Path | None:
    from judge.model_store import cache_dir

    path = cache_dir() / "models" / "smollm2-135m-instruct-float32"
    return path if (path / "config.json").exists() else None


MODEL_PATH = _default_model_path()
needs_model = pytest.mark.skipif(MODEL_PATH is None, reason="run `python -m judge.model_store` first")


def _hf_config(rationale_bound: str = "auto", **kw: Any) -> EngineConfig:
    """The default model on CPU; ``kw`` are TransformersSettings fields."""
    settings = TransformersSettings(**{"max_wait_ms": 50.0, "max_batch": 8, **kw})
    return EngineConfig(backend="transformers", model_path=str(MODEL_PATH), model_id="smollm2", device="cpu",
                        transformers=settings, rationale_bound=rationale_bound)


def _chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Name a colour. ({i})"}]


async def _wait_running(engine: TransformersEngine, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not engine._running:
        assert time.monotonic() < deadline, "no batch started"
        await asyncio.sleep(0.002)


@pytest.fixture(scope="module")
async def hf_engine() -> AsyncIterator[TransformersEngine]:
    engine = create_engine(_hf_config())
    assert isinstance(engine, TransformersEngine)
    assert not engine.healthy()
    await engine.start()
    yield engine
    await engine.stop()


def test_sampling_key_and_device_resolution() -> None:
    assert sampling_key(GenParams(temperature=0.0, top_p=0.5, seed=3)) == sampling_key(GenParams())
    assert sampling_key(GenParams(temperature=0.7, seed=1)) != sampling_key(GenParams(temperature=0.7, seed=2))
    import torch

    assert resolve_device_dtype("cpu", "auto") == ("cpu", torch.float32)
    assert resolve_device_dtype("cpu", "bfloat16") == ("cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        resolve_device_dtype("cpu", "float99")


async def test_generate_before_start_fails() -> None:
    engine = TransformersEngine(_hf_config())
    assert not engine.healthy()
    with pytest.raises(EngineError, match="not running"):
        await engine.generate(_chat(0), GenParams(max_tokens=2), "r")


@needs_model
async def test_concurrent_requests_share_one_batch(hf_engine: TransformersEngine) -> None:
    before = hf_engine.stats.batches
    limits = [2, 4, 6]
    results = await asyncio.gather(*(hf_engine.generate(_chat(i), GenParams(max_tokens=n), f"b{i}")
                                     for i, n in enumerate(limits)))
    assert hf_engine.stats.batches - before == 1  # three requests, one generate() call
    assert hf_engine.stats.batch_sizes[-1] == 3
    for result, n in zip(results, limits):
        assert isinstance(result, GenResult) and result.text.strip()
        assert result.prompt_tokens > 0
        assert 1 <= result.output_tokens <= n
        assert result.finish_reason == ("length" if result.output_tokens == n else "stop")
        assert "<|im_end|>" not in result.text and "assistant" not in result.text[:12]
    # per-row max_tokens inside a batch gives what a solo greedy run gives
    solo = await hf_engine.generate(_chat(1), GenParams(max_tokens=4), "solo")
    assert solo.text == results[1].text
    assert hf_engine.queue_depth() == 0


@needs_model
async def test_regex_constrains_each_row_of_a_mixed_batch(hf_engine: TransformersEngine) -> None:
    assert hf_engine.supports_regex  # xgrammar is in the CPU lock
    step, pref = round_regex(("step1",), 60), round_regex(("preference",), 60)
    before = hf_engine.stats.batches
    a, b, free, cut = await asyncio.gather(
        hf_engine.generate(_chat(0), GenParams(max_tokens=40, regex=step), "g-step"),
        hf_engine.generate(_chat(1), GenParams(max_tokens=40, regex=pref), "g-pref"),
        hf_engine.generate(_chat(2), GenParams(max_tokens=6), "g-free"),
        hf_engine.generate(_chat(3), GenParams(max_tokens=3, regex=step), "g-cut"))
    assert hf_engine.stats.batches - before == 1  # different patterns share one generate() call
    assert hf_engine.stats.untapped_positions == 0  # every step's tokens reached the mask through its tap
    assert re.fullmatch(step, a.text), a.text
    assert re.fullmatch(pref, b.text), b.text
    assert not re.fullmatch(step, free.text)
    assert cut.finish_reason == "length" and "Rationale: ".startswith(cut.text[:11])  # stopped mid-grammar, no crash


@needs_model
async def test_cancelled_queued_request_is_never_generated(hf_engine: TransformersEngine) -> None:
    # a sampled request has another sampling key than the greedy one, so it would need its own batch
    running = asyncio.create_task(hf_engine.generate(_chat(0), GenParams(max_tokens=8), "running"))
    await _wait_running(hf_engine)
    requests_before, dropped_before = hf_engine.stats.requests, hf_engine.stats.dropped_cancelled
    queued = asyncio.create_task(hf_engine.generate(_chat(1), GenParams(max_tokens=8, temperature=0.9), "queued"))
    await asyncio.sleep(0)  # let it enqueue
    assert hf_engine.queue_depth() == 2
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert hf_engine.queue_depth() == 1
    assert (await running).output_tokens >= 1
    await asyncio.sleep(0.1)  # longer than max_wait_ms: the worker would have batched it by now
    assert hf_engine.stats.requests == requests_before
    assert hf_engine.stats.dropped_cancelled == dropped_before + 1
    assert hf_engine.queue_depth() == 0 and hf_engine.healthy()


@needs_model
async def test_cancelling_a_running_request_stops_its_row(hf_engine: TransformersEngine) -> None:
    # greedy SmolLM2 writes this story without EOS for 300+ tokens: only cancellation can end the row early
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    long = asyncio.create_task(hf_engine.generate(story, GenParams(max_tokens=512), "long"))
    await _wait_running(hf_engine)
    await asyncio.sleep(0.2)
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    next_result = await hf_engine.generate(_chat(1), GenParams(max_tokens=2), "next")
    assert next_result.output_tokens <= 2
    assert hf_engine.stats.decode_steps[-2] < 100  # the cancelled batch stopped long before 512 steps


@needs_model
async def test_static_cache_pads_to_one_batch_shape(hf_engine: TransformersEngine) -> None:
    # the GPU default (compiled decode needs one batch shape); on CPU it runs eagerly, so this checks the padding
    static = TransformersEngine(_hf_config(max_batch=4, static_cache=True))
    await static.start()
    try:
        chats = [_chat(5), [{"role": "user", "content": "Say hello to my friend Ann, please."}]]
        got = await asyncio.gather(*(static.generate(c, GenParams(max_tokens=3 + i), f"p{i}")
                                     for i, c in enumerate(chats)))
        assert static._runner is not None and static._runner.kv is not None
        kv = static._runner.kv
        cache, length = kv.cache, kv.length
        # later calls reuse (reset) the one cache while it is long enough: its tensors keep their addresses
        again = await asyncio.gather(*(static.generate(chats[i], GenParams(max_tokens=3 + i), f"q{i}")
                                       for i in reversed(range(len(chats)))))
        assert kv.cache is cache and length % 256 == 0
        longer = await static.generate([{"role": "user", "content": "word " * 300}], GenParams(max_tokens=2), "long")
        assert kv.length > length and longer.output_tokens >= 1  # a longer call grows it
    finally:
        await static.stop()
    assert static.stats.batch_sizes[-2] == 2  # two real requests, two filler rows never resolved
    want = await asyncio.gather(*(hf_engine.generate(c, GenParams(max_tokens=3 + i), f"d{i}")
                                  for i, c in enumerate(chats)))
    assert [r.text for r in got] == [r.text for r in want] == [r.text for r in reversed(again)]
    assert [r.output_tokens for r in got] == [r.output_tokens for r in want]


@pytest.mark.parametrize("option,value,expected", [("grammar_kernel", "warp", "expected one of auto, "),
                                                   ("grammar_backend", "outlines", "expected one of guidance, xgrammar"),
                                                   ("grammar_threads", 0, "expected an integer >= 1")])
def test_unknown_grammar_option_is_refused_naming_it(option: str, value: Any, expected: str) -> None:
    with pytest.raises(ValueError, match=f"{option} {value!r}: {expected}"):
        TransformersSettings(**{option: value})


@needs_model
async def test_guidance_backend_without_llguidance_fails_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llguidance" else real(name, *a))
    engine = TransformersEngine(_hf_config(grammar_backend="guidance"))
    with pytest.raises(EngineError, match="grammar_backend 'guidance' needs llguidance installed"):
        await engine.start()
    await engine.stop()


@needs_model
async def test_both_grammar_backends_constrain_every_row(hf_engine: TransformersEngine) -> None:
    """xgrammar (the default) and llguidance each hold every row of a mixed batch to its pattern. Their masks differ
    at the edges (llguidance keeps forced text to its canonical tokens and never lets a special token stand for
    text), so greedy outputs may differ; both must match."""
    other = TransformersEngine(_hf_config(grammar_backend="guidance"))
    await other.start()
    try:
        assert hf_engine.settings.grammar_backend == "xgrammar" and other.supports_regex
        patterns = [round_regex(("step1",), 40), round_regex(("preference",), 40), r"[a-z]{1,3}( [a-z]{1,3}){0,2}"]
        params = [GenParams(max_tokens=32, regex=p) for p in patterns]
        for engine in (hf_engine, other):
            before = engine.stats.batches
            got = await asyncio.gather(*(engine.generate(_chat(i), q, f"g{i}") for i, q in enumerate(params)))
            assert engine.stats.batches - before == 1
            for pattern, r in zip(patterns, got):
                assert r.finish_reason == "stop" and re.fullmatch(pattern, r.text), (engine.settings.grammar_backend, r)
    finally:
        await other.stop()


@needs_model
async def test_guidance_vocabulary_that_misreads_tokens_fails_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vocabulary whose bytes llguidance reads wrongly (spaces as byte-level markers, as seen on a GPU machine)
    must stop the engine at start, not silently leave every constrained row unconstrained."""
    from judge.engines.hf import grammar as module

    class MisreadVocabulary(module._GuidanceVocabulary):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.tokens = [t.replace(b" ", "\u0120".encode()) for t in self.tokens]

    monkeypatch.setattr(module, "_GuidanceVocabulary", MisreadVocabulary)
    engine = TransformersEngine(_hf_config(grammar_backend="guidance"))
    with pytest.raises(EngineError, match="llguidance reads this tokenizer's tokens differently"):
        await engine.start()
    assert not engine.healthy()
    await engine.stop()


@needs_model
async def test_regex_the_grammar_library_rejects_fails_its_batch_with_the_reason(hf_engine: TransformersEngine) -> None:
    with pytest.raises(EngineError, match="regex rejected by xgrammar: .*Invalid repetition count"):
        await hf_engine.generate(_chat(0), GenParams(max_tokens=4, regex="[a-z]{1,3"), "bad-regex")
    ok = await hf_engine.generate(_chat(1), GenParams(max_tokens=2), "after")  # the engine keeps serving
    assert ok.output_tokens >= 1
    guidance = TransformersEngine(_hf_config(grammar_backend="guidance"))
    await guidance.start()
    try:
        with pytest.raises(EngineError, match="regex rejected by llguidance: .*unclosed counted repetition"):
            await guidance.generate(_chat(0), GenParams(max_tokens=4, regex="[a-z]{1,3"), "bad-regex")
    finally:
        await guidance.stop()


@needs_model
async def test_line_bound_holds_each_row_to_the_counted_language(hf_engine: TransformersEngine) -> None:
    """Rows with an unbounded regex + max_line_chars (the judge's form on this engine) share a batch with a counted
    regex row and a free row; every bounded answer is one the counted repetition accepts, and the bound binds."""
    assert hf_engine.supports_line_bound
    components = [("step1",), ("preference",), ("step1",)]
    chats = [[{"role": "user", "content": f"Explain at length why people feel lonely after moving ({i})."}]
             for i in range(3)]
    constrained = [GenParams(max_tokens=48, regex=regex, max_line_chars=line)
                   for regex, line in (round_constraint(c, 24, line_bound=True) for c in components)]
    counted = GenParams(max_tokens=48, regex=round_regex(("step1",), 24))
    before = hf_engine.stats.batches
    *bounded, same, free = await asyncio.gather(
        *(hf_engine.generate(c, q, f"lb{i}") for i, (c, q) in enumerate(zip(chats, constrained))),
        hf_engine.generate(chats[2], counted, "counted"), hf_engine.generate(_chat(4), GenParams(max_tokens=40), "free"))
    assert hf_engine.stats.batches - before == 1
    for c, r in zip(components, bounded):
        assert r.finish_reason == "stop" and re.fullmatch(round_regex(c, 24), r.text), r
    assert max(len(r.text.split("\n")[0]) for r in bounded) >= len("Rationale: ") + 20  # the bound did bind
    assert same.text == bounded[2].text  # counted regex and line bound: the same greedy answer for this ASCII prompt
    assert not free.text.startswith("Rationale: ")  # the free row stays unconstrained


@needs_model
async def test_an_answer_prefix_is_returned_and_counted_on_the_first_line(hf_engine: TransformersEngine) -> None:
    """GenParams.prefix: prefix + continuation fit the round's counted pattern; the line bound counted the prefix."""
    regex, line = round_constraint(("step1",), 24, line_bound=True, prefix=ANSWER_PREFIX)
    chat = [{"role": "user", "content": "Explain at length why people feel lonely after moving (p)."}]
    r = await hf_engine.generate(chat, GenParams(48, regex=regex, max_line_chars=line, prefix=ANSWER_PREFIX), "p")
    assert r.finish_reason == "stop" and re.fullmatch(round_regex(("step1",), 24), r.text), r
    assert len(r.text.split("\n")[0]) >= len("Rationale: ") + 20  # the bound bound at the whole line's length


@needs_model
async def test_line_bound_is_refused_where_it_cannot_hold(hf_engine: TransformersEngine) -> None:
    with pytest.raises(EngineError, match="max_line_chars must be >= 1 and come with a regex"):
        await hf_engine.generate(_chat(0), GenParams(max_tokens=4, max_line_chars=20), "no-regex")
    off = TransformersEngine(_hf_config(rationale_bound="counted"))
    assert off.supports_regex and not off.supports_line_bound
    await off.start()
    try:
        with pytest.raises(EngineError, match="max_line_chars is not supported by the transformers engine"):
            await off.generate(_chat(0), GenParams(max_tokens=4, regex="[a-z]+", max_line_chars=20), "off")
    finally:
        await off.stop()


def test_line_table_counts_bytes_per_line_and_masks_what_would_overflow() -> None:
    import torch
    import xgrammar as xgr

    from judge.engines.hf.line_bound import LineTable

    vocab = [b"ab", b"\n", b"abc\nd", b"xyz\n", b"<eos>", "\u00e9".encode(), b"abcd"] + [b"q"] * 30
    table = LineTable(vocab, len(vocab), special={4})
    assert table.head[:7] == [2, 0, 3, 3, 0, 2, 4] and table.tail[:7] == [-1, 0, 1, 0, -1, -1, -1]
    assert table.longest == 4 and table.within.shape == (4, 2)
    lengths = [0, 5]
    table.advance(lengths, [0, 1], [0, 2])  # "ab" extends row 0's line; "abc\nd" starts a new one on row 1
    table.advance(lengths, [0, 1], [5, 3])  # "é" is 2 bytes; "xyz\n" ends row 1's line
    assert lengths == [4, 0]
    mask = xgr.allocate_token_bitmask(2, len(vocab))
    table.restrict(mask, [0, 1], [2, 9])  # row 0 has 2 bytes left, row 1 room for any token
    allowed = [[bool(mask[r, v // 32] >> (v % 32) & 1) for v in range(7)] for r in range(2)]
    assert allowed == [[True, True, False, False, True, True, False], [True] * 7]
    assert torch.equal(mask[1], xgr.allocate_token_bitmask(1, len(vocab))[0])


@needs_model
def test_left_pad_matches_the_tokenizers_left_padding() -> None:
    import torch
    from transformers import AutoTokenizer

    from judge.engines.hf.runner import left_pad

    tok = AutoTokenizer.from_pretrained(str(MODEL_PATH), local_files_only=True)
    tok.padding_side = "left"
    ids = tok(["Hello there, how are you?", "Hi", "A somewhat longer prompt than the others, by a few tokens."],
              add_special_tokens=False)["input_ids"]
    want = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    got_ids, got_mask = left_pad(ids, tok.pad_token_id, "cpu")
    assert torch.equal(got_ids, want["input_ids"]) and torch.equal(got_mask, want["attention_mask"])


def test_generate_stats_keep_the_latest_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GenerateStats, "keep", 3)
    stats = GenerateStats(batches=6)
    stats.batch_sizes.extend(range(5))
    stats.prep_s.extend([0.5] * 2)
    stats.trim()
    assert stats.batch_sizes == [0, 1, 2, 3, 4] and stats.prep_s == [0.5, 0.5]  # under 2 x keep: untouched
    stats.batch_sizes.append(5)
    stats.trim()
    assert stats.batch_sizes == [3, 4, 5] and stats.batches == 6  # counters are never trimmed


@needs_model
async def test_stop_fails_running_and_queued_requests() -> None:
    engine = TransformersEngine(_hf_config(max_batch=1))
    await engine.start()
    assert engine.healthy()
    tasks = [asyncio.create_task(engine.generate(_chat(i), GenParams(max_tokens=8), f"s{i}")) for i in range(3)]
    await _wait_running(engine)
    assert engine.queue_depth() == 3
    await engine.stop()
    for task in tasks:
        with pytest.raises(EngineError, match="stopped"):
            await task
    assert not engine.healthy() and engine.queue_depth() == 0
    assert engine.stats.requests == 1  # only the first ever reached generate()
    with pytest.raises(EngineError):
        await engine.generate(_chat(9), GenParams(max_tokens=2), "after-stop")
    await engine.stop()  # idempotent


def test_auto_dtype_is_half_precision_on_a_gpu_and_float32_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for "auto" (judge.device): the server's default-model conversion and the engines both use it."""
    import torch

    from judge.device import dtype_name

    assert resolve_device_dtype("auto", "auto") == ("cpu", torch.float32) or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_device_dtype("auto", "auto") == ("cuda", torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # e.g. a V100 or a T4
    assert resolve_device_dtype("cuda:1", "auto") == ("cuda:1", torch.float16)
    assert resolve_device_dtype("cpu", "float16") == ("cpu", torch.float16) and dtype_name(torch.float16) == "float16"
