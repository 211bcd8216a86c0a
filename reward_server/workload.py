"""What a group costs the judge engine, and how fast this engine gets through such work: the two estimates admission
control bounds by (:mod:`reward_server.admission`).

The cost is in work units of one prompt token: a group's history and reference are prefilled once (prefix caching
shares them across its candidates and rounds), each candidate adds its own text and every round's instructions,
and each generated token counts :data:`DECODE_WEIGHT` units (decoding is sequential, prefill is not). The estimate
is rough on purpose; its scale does not matter, because the engine's rate is measured in the same units
(:class:`Throughput`: work finished per second the engine was busy), so ``cost / rate`` is seconds on this
machine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from cer.dialogue import Turn
from cer.modes import JudgeMode

#: characters per token of English text (the judge models' tokenizers)
CHARS_PER_TOKEN = 4.0
#: prompt tokens a judge round adds besides the candidate: its instructions and labels
ROUND_PROMPT_TOKENS = 150.0
#: tokens the judge writes per component: a rationale line of at most 100 characters and a verdict line
OUTPUT_TOKENS_PER_COMPONENT = 24.0
#: one generated token costs about as much engine time as this many prompt tokens
DECODE_WEIGHT = 8.0
#: (rounds, components judged) per mode
SHAPE = {JudgeMode.UNIFIED: (4, 4), JudgeMode.SINGLE_PASS: (1, 4), JudgeMode.PRM: (3, 3), JudgeMode.ORM: (1, 1),
         JudgeMode.REPLY: (1, 1)}


def group_cost(history: Sequence[Turn], reference: str | None, candidates: Sequence[str], mode: JudgeMode) -> float:
    """Estimated work units of judging ``candidates`` (those the cache does not answer) against ``history``; 0 for
    no candidate."""
    if not candidates:
        return 0.0
    rounds, components = SHAPE[mode]
    shared = (sum(len(t.text) for t in history) + len(reference or "")) / CHARS_PER_TOKEN
    each = rounds * ROUND_PROMPT_TOKENS + DECODE_WEIGHT * components * OUTPUT_TOKENS_PER_COMPONENT
    return shared + sum(len(c) / CHARS_PER_TOKEN + each for c in candidates)


class Throughput:
    """The engine's measured rate (work units per second it was busy): decayed sums of the work of groups judged to
    the end and of the time at least one group was in flight, so the rate follows the machine (its load, the
    prompt lengths the estimate misjudges) within a few dozen groups. ``None`` until a group has finished."""

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay {decay}: expected a fraction in (0, 1]")
        self.decay = decay
        self._done = 0.0  # decayed work units finished
        self._busy = 0.0  # decayed busy seconds
        self._pending_busy = 0.0  # busy seconds since the last finished group
        self._active = 0
        self._since = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        if self._active > 0:
            self._pending_busy += now - self._since
        self._since = now

    def started(self) -> None:
        """A group entered the engine."""
        self._tick()
        self._active += 1

    def finished(self, cost: float, completed: bool) -> None:
        """A group left the engine; ``completed`` False (cancelled, failed) counts its time but not its work, so
        the rate errs low."""
        self._tick()
        self._active = max(0, self._active - 1)
        if completed and cost > 0:
            self._done = self.decay * self._done + cost
            self._busy = self.decay * self._busy + self._pending_busy
            self._pending_busy = 0.0

    @property
    def rate(self) -> float | None:
        """Work units per busy second, or None before the first measurement."""
        return self._done / self._busy if self._done > 0 and self._busy > 0 else None
