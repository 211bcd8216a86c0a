"""The answer prefix (``GenParams.prefix``, ``JudgeSettings.answer_prefix``): the continuation's regex, the engines
that take a prefix and those that refuse it, the judge sending it only where it is taken, the label probabilities read
after it, the cache key and ``Info``. Engines are the FAKE ones (tests/fake_engine.py, a fake AsyncLLM)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Kind
from judge.conversation import Judge, round_params, verdict_top_k
from judge.engines.base import EngineConfig, EngineError, GenParams, TokenLogprobs
from judge.engines.hf.engine import TransformersEngine
from judge.engines.hf.line_bound import prefix_line_bytes
from judge.engines.openai_engine import OpenAIEngine
from judge.engines.vllm_engine import VllmEngine
from judge.generation import sampling_fields
from judge.protocol import ANSWER_PREFIX, RATIONALE_KEY, JudgeSettings, load_template, round_constraint, round_regex
from judge.verdict_probs import label_distributions
from reward_server.grpc import convert
from reward_server.proto import pb as reward_pb
from tests.fake_engine import FakeEngine, verdict_logprobs
from tests.unit.test_judge_protocol import CAND, HISTORY
from tests.unit.test_reward_service import GOOD, body, make_service


def test_the_prefix_ends_before_the_space() -> None:
    assert ANSWER_PREFIX == "Rationale:" and RATIONALE_KEY == ANSWER_PREFIX + " "


@pytest.mark.parametrize("components", [("step1",), ("preference",), ("step1", "step2", "step3", "preference")])
@pytest.mark.parametrize("bound", [None, 20])
def test_the_continuation_regex_is_the_round_regex_without_the_prefix(components: tuple[str, ...],
                                                                      bound: int | None) -> None:
    full = round_regex(components, bound)
    rest = round_regex(components, bound, prefix=ANSWER_PREFIX)
    assert full == ANSWER_PREFIX + rest and rest.startswith(" ")
    answers = ["Rationale: fine.\nVerdict: True", "Rationale: x\nVerdict: both_good", "Rationale:\nVerdict: True",
               "Rationale: " + "y" * 30 + "\nVerdict: False", "\n".join(f"Rationale: r{i}.\nVerdict: True"
                                                                      for i in range(3)) + "\nRationale: p\nVerdict: first"]
    for answer in answers:  # an answer fits the round exactly when its continuation fits the continuation's pattern
        assert (re.fullmatch(full, answer) is not None) == \
            (answer.startswith(ANSWER_PREFIX) and re.fullmatch(rest, answer[len(ANSWER_PREFIX):]) is not None)
    assert round_regex(components, bound, prefix=RATIONALE_KEY).startswith(r"[^\n]")
    with pytest.raises(ValueError, match="answer prefix 'Verdict:'"):
        round_regex(components, bound, prefix="Verdict:")


def test_round_constraint_with_a_prefix_keeps_the_whole_line_bound() -> None:
    regex, line = round_constraint(("step1",), 100, line_bound=True, prefix=ANSWER_PREFIX)
    assert (regex, line) == (round_regex(("step1",), None, ANSWER_PREFIX), len(RATIONALE_KEY) + 100)
    assert round_constraint(("step1",), 100, line_bound=False, prefix=ANSWER_PREFIX) == \
        (round_regex(("step1",), 100, ANSWER_PREFIX), None)


def test_prefix_line_bytes_counts_the_last_line() -> None:
    assert [prefix_line_bytes(p) for p in (None, "", "Rationale:", "a\nbc", "\u00e9")] == [0, 0, 10, 2, 2]


def test_engines_declare_and_refuse_the_prefix() -> None:
    assert VllmEngine.supports_prefix and TransformersEngine.supports_prefix and not OpenAIEngine.supports_prefix
    openai = OpenAIEngine(EngineConfig(backend="openai"))
    openai.check_prefix(GenParams())  # no prefix: nothing to refuse
    with pytest.raises(EngineError, match="answer prefix is not supported by the openai engine"):
        openai.check_prefix(GenParams(prefix=ANSWER_PREFIX))
    with pytest.raises(EngineError, match="must not be empty"):
        FakeEngine(supports_prefix=True).check_prefix(GenParams(prefix=""))
    assert "prefix" not in sampling_fields(GenParams()) and sampling_fields(GenParams(prefix="R"))["prefix"] == "R"


async def test_a_fake_engine_without_support_raises_and_with_it_honours_the_prefix() -> None:
    without = FakeEngine(lambda m, p: " ok")
    await without.start()
    with pytest.raises(EngineError, match="not supported by the fake engine"):
        await without.generate([{"role": "user", "content": "x"}], GenParams(prefix=ANSWER_PREFIX), "a")
    taking = FakeEngine(lambda m, p: " ok.\nVerdict: True", supports_prefix=True, logprobs=verdict_logprobs())
    await taking.start()
    r = await taking.generate([{"role": "user", "content": "x"}], GenParams(prefix=ANSWER_PREFIX, logprobs=5), "b")
    assert r.text == "Rationale: ok.\nVerdict: True" and taking.calls[-1].params.prefix == ANSWER_PREFIX
    assert r.tokens is not None and "".join(t.token for t in r.tokens) == r.text[len(ANSWER_PREFIX):]


@pytest.mark.parametrize("supports,setting,sent", [(True, True, True), (False, True, False), (True, False, False)])
async def test_the_judge_sends_the_prefix_only_where_it_is_taken_and_on(supports: bool, setting: bool,
                                                                        sent: bool) -> None:
    """Same verdicts, texts and later-round messages either way; the prefix and the continuation's regex only to an
    engine that takes it, with the setting on."""
    answer = (lambda messages, params: "Rationale: fine.\nVerdict: " +
              ("both_good" if "Which reply better supports" in messages[-1]["content"] else "True"))
    engine = FakeEngine(answer, supports_regex=True, supports_prefix=supports, logprobs=verdict_logprobs(0.9))
    plain = FakeEngine(answer, supports_regex=True, logprobs=verdict_logprobs(0.9))
    await engine.start()
    await plain.start()
    settings = JudgeSettings(answer_prefix=setting)
    judge, baseline = Judge(engine, load_template(), load_taxonomy(), settings), \
        Judge(plain, load_template(), load_taxonomy(), JudgeSettings(answer_prefix=False))
    a = await judge.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)
    b = await baseline.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)
    assert judge.prefixed is sent and a.verdicts == b.verdicts and a.texts == b.texts
    assert [c.params.prefix for c in engine.calls] == [ANSWER_PREFIX if sent else None] * 4
    assert all(c.params.regex is not None and c.params.regex.startswith(" " if sent else "Rationale: ")
               for c in engine.calls)
    assert [c.messages for c in engine.calls] == [c.messages for c in plain.calls]  # earlier answers: whole texts
    for c in a.verdicts:  # the label probabilities are read at the verdict token, after the prefix too
        assert a.probs[c] == pytest.approx(b.probs[c])
        assert a.probs[c] is not None
    params = round_params(settings, engine, ("step1",))
    assert params.prefix == (ANSWER_PREFIX if sent else None)


def test_the_judgment_key_changes_with_the_setting_where_the_prefix_is_sent() -> None:
    def key(supports: bool, on: bool) -> str | None:
        judge = Judge(FakeEngine(supports_regex=True, supports_prefix=supports), load_template(), load_taxonomy(),
                      JudgeSettings(answer_prefix=on))
        return judge.judgment_key(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)

    assert key(True, True) != key(True, False)
    assert key(False, True) == key(False, False) == key(True, False)  # nothing sent differs: the same judgment


def test_label_distributions_read_tokens_that_begin_after_the_prefix() -> None:
    text = "Rationale: ok.\nVerdict: True"
    tokens = [TokenLogprobs(" ok.\nVerdict:", {" ok.\nVerdict:": 0.0}, 0.0),
              TokenLogprobs(" True", {" True": -0.1, " False": -2.4}, -0.1)]
    (dist,) = label_distributions(text, tokens, [Kind.STEP], start=len(ANSWER_PREFIX))
    assert dist is not None and dist["True"] > 0.9
    # a verdict inside a multi-line answer: the forward chain places it (the backward one stops at the U+FFFD piece)
    text2 = "Rationale: caf\u00e9\nVerdict: False\nRationale: b\nVerdict: first"
    pieces = [" caf", "\ufffd", "\ufffd", "\nVerdict:", " False", "\nRationale: b\nVerdict:", " first"]
    tokens2 = [TokenLogprobs(p, {p: 0.0} if p != " False" else {" False": -0.2, " True": -1.8}, 0.0) for p in pieces]
    first, _ = label_distributions(text2, tokens2, [Kind.STEP, Kind.PREFERENCE], start=len(ANSWER_PREFIX))
    assert first is not None and first["False"] > 0.7


async def test_info_says_whether_the_prefix_is_served() -> None:
    async for s in make_service(prefix=True, answer_prefix=True):
        r = await s.http.post("/v1/score", json=body([GOOD]))
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "ok"
        assert {c.params.prefix for c in s.engine.calls} == {ANSWER_PREFIX}
        assert (await s.http.get("/v1/info")).json()["answer_prefix"] is True
        assert convert.info_from_pb(await s.stub.Info(reward_pb.InfoRequest())).answer_prefix is True
    async for s in make_service(prefix=True):  # off by default
        assert (await s.http.get("/v1/info")).json()["answer_prefix"] is False
        assert JudgeSettings().answer_prefix is False


async def test_the_judge_asks_for_verdict_top_k_alternatives_and_keys_the_cache_on_it() -> None:
    """``JudgeSettings.verdict_top_k`` is what the engine is asked for (at most the engine's own limit), and it is part
    of the judgment's cache key (fewer alternatives can give other label probabilities)."""
    def judge(k: int) -> Judge:
        engine = FakeEngine(lambda m, p: "Rationale: ok.\nVerdict: True", supports_regex=True,
                            logprobs=verdict_logprobs())
        return Judge(engine, load_template(), load_taxonomy(), JudgeSettings(verdict_top_k=k))

    five = judge(5)
    await five.engine.start()
    await five.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)
    assert {c.params.logprobs for c in five.engine.calls} == {5}
    capped = judge(20)
    capped.engine.max_logprobs = 8  # an engine that returns fewer than asked for is asked for what it returns
    await capped.engine.start()
    await capped.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)
    assert {c.params.logprobs for c in capped.engine.calls} == {8}
    keys = {k: judge(k).judgment_key(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED) for k in (5, 20)}
    assert keys[5] != keys[20]
    with pytest.raises(ValueError, match="verdict_top_k 21: expected 1..20"):
        JudgeSettings(verdict_top_k=21)


async def test_info_says_how_many_logprobs_a_token_the_judge_asks_for_on_both_fronts() -> None:
    """``Info.verdict_top_k``: what the engine is asked for (the setting, or the engine's default), the same over HTTP
    and gRPC; 0 where no graded rewards are served."""
    async def top_k(s: Any) -> tuple[int, int]:
        http = (await s.http.get("/v1/info")).json()["verdict_top_k"]
        return http, convert.info_from_pb(await s.stub.Info(reward_pb.InfoRequest())).verdict_top_k

    async for s in make_service(logprobs=verdict_logprobs()):  # the fake engine's logprobs are unmasked
        assert await top_k(s) == (20, 20)
        await s.http.post("/v1/score", json=body([GOOD]))
        assert {c.params.logprobs for c in s.engine.calls} == {20}
    async for s in make_service(logprobs=verdict_logprobs(), verdict_top_k=7):
        assert await top_k(s) == (7, 7)
    async for s in make_service():  # no logprobs: no graded rewards
        assert await top_k(s) == (0, 0)


@pytest.mark.parametrize(("masked", "constrain", "regex", "asked"), [
    (True, True, True, 5),     # vLLM on constrained rounds: only the labels' spellings are left at a verdict
    (True, False, True, 20),   # unconstrained rounds: the mask is not there, whatever the engine
    (True, True, False, 20),   # an engine that takes no regex cannot mask
    (False, True, True, 20)])  # the transformers engine: the model's unmasked distribution
def test_verdict_top_k_defaults_to_5_only_where_the_grammar_masked_the_logprobs(masked: bool, constrain: bool,
                                                                              regex: bool, asked: int) -> None:
    """``verdict_top_k`` none: 5 alternatives where the engine computes them after the verdict grammar's mask (vLLM,
    measured: every verdict the same and the label probabilities to 1e-5 against 20 on an H200), 20 elsewhere; an
    explicit value wins; never more than the engine returns."""
    engine = FakeEngine(lambda m, p: "Rationale: ok.\nVerdict: True", supports_regex=regex, logprobs=verdict_logprobs())
    engine.masked_logprobs = masked
    assert verdict_top_k(JudgeSettings(constrain=constrain), engine) == asked
    assert verdict_top_k(JudgeSettings(constrain=constrain, verdict_top_k=12), engine) == 12
    engine.max_logprobs = 3
    assert verdict_top_k(JudgeSettings(constrain=constrain), engine) == 3
