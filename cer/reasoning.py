"""The CER policy output: three reasoning steps and a reply, as tagged text.

```
<analysis>...</analysis><emotion>...</emotion><strategy>...</strategy><response>...</response>
```
:func:`render` writes it, :func:`parse` reads it back and says which parts are missing or malformed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: The four parts, in the order the policy must write them. Steps 1-3 are the reasoning, then the reply.
PARTS: tuple[str, ...] = ("analysis", "emotion", "strategy", "response")
STEP_PARTS: tuple[str, ...] = PARTS[:3]
RESPONSE_PART = "response"
STRATEGY_PART = "strategy"

#: An opening or closing tag of a part (group 1: "/" for a closing tag, group 2: the part), any letter case.
TAG = re.compile(r"<(/?)(" + "|".join(PARTS) + r")>", re.IGNORECASE)


@dataclass(frozen=True)
class CerOutput:
    """A well-formed CER output."""

    analysis: str
    emotion: str
    strategy: str
    response: str

    def render(self) -> str:
        """The tagged text form, one part per line."""
        return render({p: getattr(self, p) for p in PARTS})


@dataclass(frozen=True)
class ParsedOutput:
    """What :func:`parse` found in a candidate.

    ``parts`` maps each part name to its stripped content, or ``None`` when that part is missing or
    malformed; ``missing`` lists those parts in canonical order. ``ok`` is the paper's format rule: all four
    parts present exactly once, in order, non-empty.
    """

    parts: dict[str, str | None]
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing

    def step(self, index: int) -> str | None:
        """Content of reasoning step ``index`` (0-based), or None when missing."""
        return self.parts[STEP_PARTS[index]]

    @property
    def response(self) -> str | None:
        return self.parts[RESPONSE_PART]


def render(parts: dict[str, str]) -> str:
    """Render the four parts as tagged text. Raises ``ValueError`` naming a missing part."""
    for p in PARTS:
        if p not in parts:
            raise ValueError(f"render: part {p!r} is required")
    return "\n".join(f"<{p}>{parts[p].strip()}</{p}>" for p in PARTS)


def strip_tags(text: str) -> str:
    """``text`` with every part tag replaced by a space, stripped (the plain text of a malformed output)."""
    return TAG.sub(" ", text).strip()


def reply_text(raw: str) -> tuple[str, ParsedOutput]:
    """The reply of a policy's raw output and its parse: the ``<response>`` part, or the tag-stripped output (spaces
    collapsed) when that part is missing (what a reader of a malformed output sees)."""
    parsed = parse(raw)
    return (parsed.response if parsed.response is not None else " ".join(strip_tags(raw).split())), parsed


def parse(text: str) -> ParsedOutput:
    """Parse a candidate's tagged text.

    A part counts as present when its open and close tag each occur exactly once, the open before the close,
    with non-blank content between, and it comes after the previous present part (order is part of the
    format). Nested or duplicated tags make that part malformed, hence missing.
    """
    positions: dict[str, list[tuple[int, int, bool]]] = {p: [] for p in PARTS}
    for m in TAG.finditer(text):
        positions[m.group(2).lower()].append((m.start(), m.end(), m.group(1) == "/"))
    parts: dict[str, str | None] = {}
    last_end = 0
    for p in PARTS:
        opens = [(s, e) for s, e, closing in positions[p] if not closing]
        closes = [(s, e) for s, e, closing in positions[p] if closing]
        content: str | None = None
        if len(opens) == 1 and len(closes) == 1 and opens[0][1] <= closes[0][0] and opens[0][0] >= last_end:
            inner = text[opens[0][1] : closes[0][0]]
            if inner.strip() and not TAG.search(inner):
                content = inner.strip()
                last_end = closes[0][1]
        parts[p] = content
    return ParsedOutput(parts=parts, missing=[p for p in PARTS if parts[p] is None])
