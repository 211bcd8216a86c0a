"""The one generate -> validate -> retry -> cache loop (``judge.generation``), on the FakeEngine double."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from judge.engines.base import Engine, EngineError, GenParams, Message
from judge.generation import DiskCache, RetryPolicy, attempt_key, generate_validated
from tests.fake_engine import FakeEngine

CHAT: list[Message] = [{"role": "user", "content": "Say ok."}]


def _digit(text: str) -> int | None:
    return int(text) if text.isdigit() else None


async def test_retries_hotter_with_distinct_seeds_until_valid() -> None:
    answers = iter(["no", "still no", "7"])
    engine = FakeEngine(lambda m, p: next(answers))
    await engine.start()
    r = await generate_validated(engine, CHAT, GenParams(temperature=0.2, seed=5), _digit,
                                 RetryPolicy(max_retries=2, retry_temperature=0.9), "call")
    assert (r.value, r.text, r.attempts, r.generations, r.cache_hits, r.error) == (7, "7", 3, 3, 0, None)
    sent = [c.params for c in engine.calls]
    assert [p.temperature for p in sent] == [0.2, 0.9, 0.9] and [p.seed for p in sent] == [5, 6, 7]
    assert [c.request_id for c in engine.calls] == ["call-a0", "call-a1", "call-a2"]
    # hotter means at least the first attempt's temperature; an unseeded call stays unseeded
    assert RetryPolicy(retry_temperature=0.5).params(GenParams(temperature=1.2), 1) == GenParams(temperature=1.2)


async def test_failure_is_reported_never_made_up_and_engine_errors_are_not_retried() -> None:
    engine = FakeEngine(lambda m, p: "nope")
    await engine.start()
    r = await generate_validated(engine, CHAT, GenParams(), _digit, RetryPolicy(max_retries=1), "x")
    assert r.value is None and not r.ok and r.error == "invalid_format" and r.attempts == 2 and r.text == "nope"

    def boom(messages: list[Message], params: GenParams) -> str:
        raise EngineError("the engine died")

    broken = FakeEngine(boom)
    await broken.start()
    r = await generate_validated(broken, CHAT, GenParams(), _digit, RetryPolicy(max_retries=3), "y")
    assert r.value is None and r.attempts == 1 and r.generations == 0
    assert r.error == "engine_error: the engine died" and isinstance(r.engine_error, EngineError)


async def test_cache_answers_every_attempt_and_the_engine_is_only_started_on_a_miss(tmp_path: Path) -> None:
    answers = iter(["bad", "3"])
    engine = FakeEngine(lambda m, p: next(answers))
    starts: list[int] = []

    async def start() -> Engine:
        starts.append(1)
        if not engine.healthy():
            await engine.start()
        return engine

    cache = DiskCache(tmp_path, {"model": "m", "revision": "r"})
    identity = {"backend": "fake", "model": "m", "revision": "r"}
    first = await generate_validated(start, CHAT, GenParams(seed=0), _digit, RetryPolicy(), "c", cache, identity)
    assert (first.value, first.generations, first.cache_hits) == (3, 2, 0) and len(starts) == 2
    again = await generate_validated(start, CHAT, GenParams(seed=0), _digit, RetryPolicy(), "c", cache, identity)
    assert (again.value, again.generations, again.cache_hits, again.attempts) == (3, 0, 2, 2) and len(starts) == 2
    stored = json.loads(next(tmp_path.rglob("*.json")).read_text())
    assert stored["model"] == "m" and stored["revision"] == "r" and stored["text"] in ("bad", "3")


def test_attempt_key_is_the_data_builder_cache_key() -> None:
    """Disk caches written before the loop was shared stay valid: the key hashes the same payload."""
    params = GenParams(max_tokens=9, temperature=0.8, top_p=1.0, seed=3, regex="x+")
    identity = {"backend": "transformers", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "rev"}
    old_payload = {**identity, "messages": CHAT,
                   "params": {"max_tokens": 9, "temperature": 0.8, "top_p": 1.0, "seed": 3, "regex": "x+"},
                   "attempt": 1}
    want = hashlib.sha256(json.dumps(old_payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
    assert attempt_key(identity, CHAT, params, 1) == want
    assert attempt_key(identity, CHAT, params, 2) != want


@pytest.mark.parametrize("seed", [None, 11])
async def test_judge_retries_an_unparsable_round_through_the_loop(seed: int | None) -> None:
    from cer.dialogue import Role, Turn
    from cer.modes import JudgeMode
    from cer.reasoning import parse
    from cer.taxonomy import load_taxonomy
    from judge.conversation import Judge
    from judge.protocol import JudgeSettings, load_template

    calls: list[int] = []

    def answer(messages: list[Message], params: GenParams) -> str:  # two unparsable answers, then valid ones
        calls.append(1)
        return "Rationale: hm." if len(calls) <= 2 else "Rationale: fine.\nVerdict: True"

    engine = FakeEngine(answer)
    await engine.start()
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings(seed=seed, max_retries=2))
    cand = parse("<analysis>a</analysis><emotion>b</emotion><strategy>c</strategy><response>d</response>")
    history = [Turn(Role.SEEKER, "I feel low.")]
    out = await judge.judge(history, None, cand, JudgeMode.PRM)  # step 1 takes three attempts, steps 2-3 one each
    assert out.verdicts == {"step1": True, "step2": True, "step3": True} and out.generations == 3 + 2
    seeds = [c.params.seed for c in engine.calls[:3]]
    assert seeds == ([None, None, None] if seed is None else [seed, seed + 1, seed + 2])
