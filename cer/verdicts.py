"""Judge verdict labels and the one parser of a judge's verdict lines.

A judge round ends with lines ``Verdict: <label>``. Only the judge's own output is ever given to
:func:`parse_verdicts` (candidates are never parsed for verdicts), and only its *last* verdict lines count:
a round that judges k components is read from its last k ``Verdict:`` lines, in order.
"""

from __future__ import annotations

import enum
import re

VERDICT_KEY = "Verdict:"
_VERDICT_LINE = re.compile(r"^[ \t*#>-]*verdict[ \t*]*:[ \t*]*([A-Za-z_ ]+?)[ \t*.]*$", re.IGNORECASE | re.MULTILINE)


class Kind(str, enum.Enum):
    """What a verdict line judges."""

    STEP = "step"  # point-wise: True | False
    PREFERENCE = "preference"  # pair-wise, reference first, candidate second


class Preference(str, enum.Enum):
    """The paper's four reply-comparison options (the reference is shown first, the candidate second)."""

    FIRST = "first"
    SECOND = "second"
    BOTH_GOOD = "both_good"
    NEITHER = "neither"


#: The preferences under which the candidate's reply (shown second) matches or beats the reference: the outcome is
#: favourable (the paper's +1 preference reward).
FAVOURABLE: frozenset[Preference] = frozenset({Preference.SECOND, Preference.BOTH_GOOD})


def favourable(preference: Preference) -> bool:
    """True when the candidate's reply matches or beats the reference (``second`` or ``both_good``)."""
    return preference in FAVOURABLE


STEP_LABELS: tuple[str, ...] = ("True", "False")
PREFERENCE_LABELS: tuple[str, ...] = tuple(p.value for p in Preference)


def labels(kind: Kind) -> tuple[str, ...]:
    """The exact label strings a judge may write for ``kind``."""
    return STEP_LABELS if kind is Kind.STEP else PREFERENCE_LABELS


Verdict = bool | Preference


def parse_label(kind: Kind, raw: str) -> Verdict | None:
    """Read one label (case-insensitive; ``both good`` == ``both_good``); None when it is not a label of kind."""
    token = "_".join(raw.strip().lower().split())
    if kind is Kind.STEP:
        return {"true": True, "false": False}.get(token)
    try:
        return Preference(token)
    except ValueError:
        return None


def _last_lines(judge_output: str, n: int) -> list[re.Match[str] | None]:
    """The last ``n`` verdict lines, in order; None for the earliest entries when there are fewer."""
    found = list(_VERDICT_LINE.finditer(judge_output))
    tail = found[-n:] if n else []
    return [None] * (n - len(tail)) + tail


def verdict_label_starts(judge_output: str, n: int) -> list[int | None]:
    """Where the label of each of the last ``n`` verdict lines begins (a character offset into ``judge_output``), in
    order; None for the earliest entries when there are fewer than ``n`` lines. These are the lines
    :func:`parse_verdicts` reads."""
    return [None if m is None else m.start(1) for m in _last_lines(judge_output, n)]


def parse_verdicts(judge_output: str, kinds: list[Kind]) -> list[Verdict | None]:
    """Verdicts of one judge round, one per entry of ``kinds``; None where unparsable.

    The last ``len(kinds)`` verdict lines of ``judge_output`` are matched to ``kinds`` in order. With fewer
    lines than kinds, the earliest components are the ones left None.
    """
    lines = _last_lines(judge_output, len(kinds))
    return [None if m is None else parse_label(k, m.group(1)) for k, m in zip(kinds, lines)]
