"""The paper's reward rules (UnifiReward scores).

Each reasoning step: +1 judged True, -1 judged False. Preference: +1 when the candidate matches or beats the
reference (``second`` or ``both_good``), else -1. Format: +1 when all four parts are present and well formed,
else -1. A component whose verdict could not be obtained has no reward (None) and makes the total None:
never a made-up score.
"""

from __future__ import annotations

from collections.abc import Sequence

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
