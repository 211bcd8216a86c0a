"""The paper's reward rules (UnifiReward scores).

Each reasoning step: +1 judged True, -1 judged False. Preference: +1 when the candidate matches or beats the
reference (``second`` or ``both_good``), else -1. Format: +1 when all four parts are present and well formed,
else -1. A component whose verdict could not be obtained has no reward (None) and makes the total None:
never a made-up score.

Mode ``reply`` judges a plain reply point-wise: its one component is the reply verdict (+1 True, -1 False), and
its total is that alone. It has no reasoning steps and no format rule, so neither is scored (None), never filled
in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cer.modes import JudgeMode
from cer.reasoning import ParsedOutput
from cer.verdicts import Preference, favourable

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


def candidate_rewards(parsed: ParsedOutput, mode: JudgeMode, step_verdicts: Sequence[bool | None],
                      preference: Preference | None, reply: bool | None = None) -> CandidateRewards:
    """The rewards of a candidate judged in ``mode`` (``step_verdicts``: one per step, None where unknown;
    ``reply``: the reply verdict of mode ``reply``).

    A part missing from the candidate was not judged and counts as failed (-1); a judged component without a verdict
    has no reward and makes the total None."""
    if mode.judges_reply:
        r = STEP_FALSE if parsed.response is None else step_reward(reply)
        return CandidateRewards([], None, None, total_reward([r]), reply=r)
    steps: list[float | None] = []
    if mode.judges_steps:
        steps = [STEP_FALSE if parsed.step(i) is None else step_reward(step_verdicts[i]) for i in range(3)]
    pref: float | None = None
    if mode.judges_preference:
        pref = PREF_LOSE if parsed.response is None else preference_reward(preference)
    fmt = format_reward(parsed.ok)
    used = steps + ([pref] if mode.judges_preference else [])
    return CandidateRewards(steps, pref, fmt, total_reward([*used, fmt]))


def total_range(mode: JudgeMode) -> tuple[float, float]:
    """The lowest and highest total a candidate can get in ``mode`` (unified: -5..5, prm: -4..4, orm: -2..2,
    reply: -1..1): every component is worth -1 or +1."""
    if mode.judges_reply:
        return STEP_FALSE, STEP_TRUE
    n = (3 if mode.judges_steps else 0) + (1 if mode.judges_preference else 0) + 1  # + the format
    return -float(n), float(n)
