"""The paper's reward rules (UnifiReward scores).

Each reasoning step: +1 judged True, -1 judged False. Preference: +1 when the candidate matches or beats the
reference (``second`` or ``both_good``), else -1. Format: +1 when all four parts are present and well formed,
else -1. A component whose verdict could not be obtained has no reward (None) and makes the total None:
never a made-up score.

Mode ``reply`` judges a plain reply point-wise: its one component is the reply verdict (+1 True, -1 False), and
its total is that alone. It has no reasoning steps and no format rule, so neither is scored (None), never filled
in.

Graded rewards (ours, beside the paper's; DESIGN.md "UnifiReward"): each judged component's reward is its expected
value under the judge's own probabilities of the verdict labels, instead of the value of the argmax verdict: a step
(or a mode-``reply`` verdict) is ``2 P(True) - 1``; the preference is the expectation of the +1/-1 preference reward,
``P(second) + P(both_good) - P(first) - P(neither)``; the format reward is the discrete one (it is no verdict). The
same missing-part rule applies (a part missing from the candidate counts -1) and the total sums the same components.
A component whose probabilities are missing has no graded reward (None), and makes the graded total None: it is
never filled in from the discrete verdict. cf. GenRM's P(Yes) and G-Eval's probability-weighted scores.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cer.modes import JudgeMode
from cer.reasoning import ParsedOutput
from cer.verdicts import Preference, favourable


class RewardKind(str, enum.Enum):
    """Which reward a consumer trains or reports on: ``graded`` (expected rewards under the judge's label
    probabilities; GRPO's default: candidates the judge is equally sure about still differ) or ``discrete`` (the
    paper's +1/-1 per verdict)."""

    GRADED = "graded"
    DISCRETE = "discrete"


STEP_TRUE, STEP_FALSE = 1.0, -1.0
PREF_WIN, PREF_LOSE = 1.0, -1.0
FORMAT_OK, FORMAT_BAD = 1.0, -1.0


def step_reward(verdict: bool | None) -> float | None:
    """+1 for True, -1 for False, None when the verdict is unknown."""
    if verdict is None:
        return None
    return STEP_TRUE if verdict else STEP_FALSE


def preference_reward(verdict: Preference | None) -> float | None:
    """+1 if the candidate (shown second) matches or beats the reference, -1 otherwise, None when unknown."""
    if verdict is None:
        return None
    return PREF_WIN if favourable(verdict) else PREF_LOSE


def graded_step_reward(p_true: float | None) -> float | None:
    """The expected step reward, ``2 P(True) - 1``; None when the probability is unknown."""
    if p_true is None:
        return None
    return STEP_TRUE * p_true + STEP_FALSE * (1.0 - p_true)


def graded_preference_reward(probs: Mapping[Preference, float] | None) -> float | None:
    """The expected preference reward over the label probabilities (favourable labels +1, the others -1); None when
    they are unknown."""
    if probs is None:
        return None
    return float(sum(p * (PREF_WIN if favourable(label) else PREF_LOSE) for label, p in probs.items()))


def format_reward(ok: bool) -> float:
    """+1 when all four parts are present and well formed, else -1."""
    return FORMAT_OK if ok else FORMAT_BAD


def total_reward(components: Sequence[float | None]) -> float | None:
    """Sum of the component rewards a mode uses; None as soon as one of them is None."""
    if any(c is None for c in components):
        return None
    return float(sum(c for c in components if c is not None))


@dataclass(frozen=True)
class CandidateRewards:
    """The reward components of one judged candidate in a mode, and their total (None unless all are known)."""

    steps: list[float | None]  # one per step when the mode judges steps, else empty
    preference: float | None  # None when the mode judges no preference, or its verdict is unknown
    format: float | None  # None in mode reply (no format rule there)
    total: float | None
    reply: float | None = None  # mode reply only: the point-wise reply verdict's reward


def _combine(parsed: ParsedOutput, mode: JudgeMode, steps: Sequence[float | None], preference: float | None,
             reply: float | None) -> CandidateRewards:
    """The components of ``mode`` from the judged components' rewards (a part missing from the candidate: -1) and
    their total."""
    if mode.judges_reply:
        r = STEP_FALSE if parsed.response is None else reply
        return CandidateRewards([], None, None, total_reward([r]), reply=r)
    judged_steps: list[float | None] = []
    if mode.judges_steps:
        judged_steps = [STEP_FALSE if parsed.step(i) is None else steps[i] for i in range(3)]
    pref: float | None = None
    if mode.judges_preference:
        pref = PREF_LOSE if parsed.response is None else preference
    fmt = format_reward(parsed.ok)
    used = judged_steps + ([pref] if mode.judges_preference else [])
    return CandidateRewards(judged_steps, pref, fmt, total_reward([*used, fmt]))


def candidate_rewards(parsed: ParsedOutput, mode: JudgeMode, step_verdicts: Sequence[bool | None],
                      preference: Preference | None, reply: bool | None = None) -> CandidateRewards:
    """The rewards of a candidate judged in ``mode`` (``step_verdicts``: one per step, None where unknown;
    ``reply``: the reply verdict of mode ``reply``).

    A part missing from the candidate was not judged and counts as failed (-1); a judged component without a verdict
    has no reward and makes the total None."""
    return _combine(parsed, mode, [step_reward(v) for v in step_verdicts] if mode.judges_steps else [],
                    preference_reward(preference), step_reward(reply))


def graded_candidate_rewards(parsed: ParsedOutput, mode: JudgeMode, step_p_true: Sequence[float | None],
                             preference_probs: Mapping[Preference, float] | None,
                             reply_p_true: float | None = None) -> CandidateRewards:
    """The graded rewards of a candidate judged in ``mode`` (``step_p_true``: P(True) per step, None where unknown;
    ``preference_probs``: the preference label probabilities; ``reply_p_true``: P(True) of mode ``reply``'s verdict).

    The same components and missing-part rule as :func:`candidate_rewards`; a judged component without its
    probabilities has no graded reward and makes the total None."""
    return _combine(parsed, mode, [graded_step_reward(p) for p in step_p_true] if mode.judges_steps else [],
                    graded_preference_reward(preference_probs), graded_step_reward(reply_p_true))


def total_range(mode: JudgeMode) -> tuple[float, float]:
    """The lowest and highest total a candidate can get in ``mode`` (unified: -5..5, prm: -4..4, orm: -2..2,
    reply: -1..1): every component is worth -1 or +1."""
    if mode.judges_reply:
        return STEP_FALSE, STEP_TRUE
    n = (3 if mode.judges_steps else 0) + (1 if mode.judges_preference else 0) + 1  # + the format
    return -float(n), float(n)
