"""The judge protocol: rounds per mode, and judge SFT chats that always fit the constrained verdict grammar."""

from __future__ import annotations

import re

import pytest

from cer.dialogue import Role, Turn
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Kind, Preference, parse_verdicts
from reward_server.judge import JudgeSettings, load_template, plan_rounds, render_judge_chat, round_regex
from reward_server.types import JudgeMode

CAND = ("<analysis>Exam stress; exploration.</analysis><emotion>negative; anxiety; 4</emotion>"
        "<strategy>Question: learn more.</strategy><response>What worries you most?</response>")
HISTORY = [Turn(Role.SEEKER, "I have exams next week and I can't sleep.")]
GOLD = {"step1": True, "step2": False, "step3": True, "preference": Preference.BOTH_GOOD}


@pytest.mark.parametrize("mode,rounds", [(JudgeMode.UNIFIED, [("step1",), ("step2",), ("step3",), ("preference",)]),
                                         (JudgeMode.SINGLE_PASS, [("step1", "step2", "step3", "preference")]),
                                         (JudgeMode.PRM, [("step1",), ("step2",), ("step3",)]),
                                         (JudgeMode.ORM, [("preference",)])])
def test_rounds_per_mode(mode: JudgeMode, rounds: list[tuple[str, ...]]) -> None:
    plans = plan_rounds(load_template(), load_taxonomy(), mode, HISTORY, "Sleep matters.", parse(CAND))
    assert [p.components for p in plans] == rounds
    assert plans[0].user.startswith("Conversation so far:\nSeeker: I have exams")


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
