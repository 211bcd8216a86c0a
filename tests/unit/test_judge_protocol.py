"""The judge protocol: rounds per mode, and judge SFT chats that always fit the constrained verdict grammar."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Kind, Preference, parse_verdicts
from judge.conversation import Judge
from judge.protocol import (
    JudgeSettings,
    load_template,
    plan_rounds,
    render_judge_chat,
    round_constraint,
    round_regex,
)
from tests.fake_engine import FakeEngine

CAND = ("<analysis>Exam stress; exploration.</analysis><emotion>negative; anxiety; 4</emotion>"
        "<strategy>Question: learn more.</strategy><response>What worries you most?</response>")
HISTORY = [Turn(Role.SEEKER, "I have exams next week and I can't sleep.")]
GOLD = {"step1": True, "step2": False, "step3": True, "preference": Preference.BOTH_GOOD, "reply": False}


@pytest.mark.parametrize("mode,rounds", [(JudgeMode.UNIFIED, [("step1",), ("step2",), ("step3",), ("preference",)]),
                                         (JudgeMode.SINGLE_PASS, [("step1", "step2", "step3", "preference")]),
                                         (JudgeMode.PRM, [("step1",), ("step2",), ("step3",)]),
                                         (JudgeMode.ORM, [("preference",)]),
                                         (JudgeMode.REPLY, [("reply",)])])
def test_rounds_per_mode(mode: JudgeMode, rounds: list[tuple[str, ...]]) -> None:
    plans = plan_rounds(load_template(), load_taxonomy(), mode, HISTORY, "Sleep matters.", parse(CAND))
    assert [p.components for p in plans] == rounds
    assert plans[0].user.startswith("Conversation so far:\nSeeker: I have exams")


def test_v2_shows_the_reply_beside_step_3_and_a_window_of_the_history() -> None:
    long_history = [Turn(Role.SEEKER if i % 2 == 0 else Role.SUPPORTER, f"turn number {i}") for i in range(21)]
    template = load_template("unifireward-v2")
    plans = plan_rounds(template, load_taxonomy(), JudgeMode.UNIFIED, long_history, "Sleep matters.", parse(CAND))
    assert template.history_turns == 16
    assert plans[0].user.startswith("Conversation so far:\n(5 earlier turns not shown)\nSupporter: turn number 5\n")
    assert "turn number 4\n" not in plans[0].user
    assert "What worries you most?" in plans[2].user and "What worries you most?" not in plans[1].user
    # v1 keeps its prompts: the whole history, no reply beside step 3, no reply round
    v1 = load_template("unifireward-v1")
    plans = plan_rounds(v1, load_taxonomy(), JudgeMode.UNIFIED, long_history, "Sleep matters.", parse(CAND))
    assert "turn number 0\n" in plans[0].user and "What worries you most?" not in plans[2].user
    with pytest.raises(ValueError, match="no reply_round"):
        plan_rounds(v1, load_taxonomy(), JudgeMode.REPLY, HISTORY, None, parse(CAND))


@pytest.mark.parametrize("mode", list(JudgeMode))
def test_sft_chat_fits_grammar_and_parses_back(mode: JudgeMode) -> None:
    long = {c: "a very long rationale " * 12 for c in GOLD}
    chat = render_judge_chat(load_template(), load_taxonomy(), mode, HISTORY, "Sleep matters.", parse(CAND), GOLD,
                             long)
    plans = plan_rounds(load_template(), load_taxonomy(), mode, HISTORY, "Sleep matters.", parse(CAND))
    answers = [m["content"] for m in chat if m["role"] == "assistant"]
    assert len(answers) == len(plans)
    for plan, answer in zip(plans, answers):
        assert re.fullmatch(round_regex(plan.components, JudgeSettings().rationale_max_chars), answer), answer
        got = parse_verdicts(answer, plan.kinds)
        assert got == [GOLD[c] for c in plan.components]
        assert all(k in (Kind.STEP, Kind.PREFERENCE) for k in plan.kinds)


_LINE = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=130)


@settings(max_examples=300, deadline=None)
@given(components=st.sampled_from([("step1",), ("preference",), ("step1", "step2", "step3", "preference")]),
       rationales=st.lists(_LINE, min_size=1, max_size=4), labels=st.lists(
           st.sampled_from(["True", "False", "first", "second", "both_good", "neither", "maybe"]), min_size=4,
           max_size=4), joiner=st.sampled_from(["\n", "\n\n", " "]))
def test_line_bound_constraint_accepts_exactly_the_counted_language(
        components: tuple[str, ...], rationales: list[str], labels: list[str], joiner: str) -> None:
    """An unbounded regex plus max_line_chars accepts the same answers as the counted repetition (in characters)."""
    answer = "\n".join(f"Rationale: {r}{joiner}Verdict: {v}" for r, v in zip(rationales, labels))
    counted = round_regex(components, 100)
    regex, line = round_constraint(components, 100, line_bound=True)
    assert line == len("Rationale: ") + 100 and regex == round_regex(components, None)
    bounded = re.fullmatch(regex, answer) is not None and all(len(x) <= line for x in answer.split("\n"))
    assert bounded == (re.fullmatch(counted, answer) is not None)


def test_round_constraint_keeps_the_counted_regex_without_a_line_bound() -> None:
    assert round_constraint(("step1",), 100, line_bound=False) == (round_regex(("step1",), 100), None)
    # a line bound under "Verdict: both_good" could not stand for a 5-character rationale: the count stays in the regex
    assert round_constraint(("preference",), 5, line_bound=True) == (round_regex(("preference",), 5), None)


@pytest.mark.parametrize("line_bound", [True, False])
async def test_judge_puts_the_rationale_bound_where_the_engine_takes_it(line_bound: bool) -> None:
    engine = FakeEngine(lambda messages, params: "Rationale: fine.\nVerdict: True", supports_regex=True,
                        supports_line_bound=line_bound)
    await engine.start()
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings())
    await judge.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.PRM)
    sent = {(c.params.regex, c.params.max_line_chars) for c in engine.calls}
    assert sent == {round_constraint(("step1",), 100, line_bound)} and len(engine.calls) == 3


async def test_independent_rounds_are_sent_at_once_each_with_the_conversation() -> None:
    """independent_rounds: every round after the system message and the conversation alone, all in flight at once;
    the same verdicts land on the same components, and the judgment's cache key differs from the sequential one."""
    def answer(messages: list[dict[str, str]], params: object) -> str:
        user = messages[-1]["content"]
        verdict = "both_good" if "Which reply better supports" in user else \
            ("False" if "Step 2, emotional state" in user else "True")
        return f"Rationale: ok.\nVerdict: {verdict}"

    template, taxonomy = load_template(), load_taxonomy()
    sequential = FakeEngine(answer, delay=0.05)
    independent = FakeEngine(answer, delay=0.05)
    await sequential.start()
    await independent.start()
    seq = Judge(sequential, template, taxonomy, JudgeSettings())
    ind = Judge(independent, template, taxonomy, JudgeSettings(independent_rounds=True))
    a = await seq.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)
    b = await ind.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)
    assert list(b.verdicts) == list(a.verdicts) == ["step1", "step2", "step3", "preference"]
    assert b.verdicts == a.verdicts
    # sequential: round k carries the k-1 earlier rounds (user + assistant); independent: system + one user each
    assert [len(c.messages) for c in sequential.calls] == [2, 4, 6, 8]
    assert [len(c.messages) for c in independent.calls] == [2, 2, 2, 2]
    assert all(c.messages[1]["content"].startswith("Conversation so far:\nSeeker: I have exams")
               for c in independent.calls)
    assert [c.messages[-1]["content"].split("\n\n", 1)[1] for c in independent.calls[1:]] == \
        [c.messages[-1]["content"] for c in sequential.calls[1:]]
    assert seq.judgment_key(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED) != \
        ind.judgment_key(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.UNIFIED)


async def test_independent_rounds_overlap_in_time() -> None:
    """The rounds of one candidate are in flight together: four rounds of 0.2 s take about one round's time."""
    import time

    engine = FakeEngine(lambda messages, params: "Rationale: ok.\nVerdict: True", delay=0.2)
    await engine.start()
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings(independent_rounds=True))
    t0 = time.perf_counter()
    await judge.judge(HISTORY, "Sleep matters.", parse(CAND), JudgeMode.PRM)
    assert time.perf_counter() - t0 < 0.5 and len(engine.calls) == 3
