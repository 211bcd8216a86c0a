"""``compeer-data cues ITEMS``: whether a surface cue of the candidate reply tells its label in judge training items.

A judge learns whatever separates the replies its items label good from those they label bad. When the negatives
(hacks, other rounds' replies) lack a surface feature that real replies often have, that feature becomes a cue: in
v3's silver train items (issue 23, 2026-12-08) a short candidate that asks a question was the real reply in 53% of
the preference items against 22% for a short one that does not (the rule-made and policy-made hacks almost never ask
a question), and the trained judge paid for a short question wherever one was written, which GRPO then wrote
everywhere. This command measures that for any judge items file (a ``silver`` output's ``items.jsonl``):

- preference items (``labels.preference``): per cell of (asks a question) x (at most ``--short-words`` words), how
  often the candidate is a real reply of the round (its ``construction.negative`` is not the candidate's) and how
  often it is preferred (``second``: the reference is reply 1);
- reply items (``labels.reply``, mode ``reply``): per cell, how often the reply is labelled True.

The gap lines give, among short and among longer replies, the share with a question minus the share without (a
judge-free figure: 0 when the cue says nothing about the label). Prints a markdown table; ``--json`` writes it too.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cer.reasoning import reply_text
from data_builder.records import Record, read_jsonl

#: a reply of at most this many words is "short" (the loop report's "Questions out of place" uses the same 10)
SHORT_WORDS = 10
CELLS = (("question", "short"), ("question", "longer"), ("no question", "short"), ("no question", "longer"))


def asks_question(text: str) -> bool:
    """Whether a reply asks a question: it holds a question mark (ASCII or full-width)."""
    return "?" in text or "\uff1f" in text


def cell_of(text: str, short_words: int = SHORT_WORDS) -> tuple[str, str]:
    """``(question | no question, short | longer)`` of a reply."""
    return ("question" if asks_question(text) else "no question",
            "short" if len(text.split()) <= short_words else "longer")


def _candidate_is_real(item: Record) -> bool:
    negative = (item.get("construction") or {}).get("negative") or {}
    return negative.get("role") != "candidate"


def _tally(rows: Iterable[tuple[str, tuple[bool, ...]]], flags: int, short_words: int) -> dict[str, list[int]]:
    """Per cell name (:data:`CELLS`): ``[items, then the sum of each of the ``flags`` flags]`` over ``rows`` of
    (reply, flags)."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * (flags + 1))
    for text, values in rows:
        c = counts[cell_of(text, short_words)]
        c[0] += 1
        for i, value in enumerate(values, 1):
            c[i] += value
    return {f"{q}, {s}": counts[(q, s)] for q, s in CELLS}


def _cells(counts: dict[str, list[int]], pcts: dict[str, int], sums: dict[str, int] | None = None,
           items: str = "items") -> dict[str, dict[str, Any]]:
    """Per cell: its items, each of ``pcts`` (name: flag index) as a percentage of them, each of ``sums`` as a
    count."""
    return {name: {items: c[0], **{k: _pct(c[i], c[0]) for k, i in pcts.items()},
                   **{k: c[i] for k, i in (sums or {}).items()}} for name, c in counts.items()}


def _gaps(cells: dict[str, dict[str, Any]], keys: tuple[str, ...]) -> dict[str, dict[str, float | None]]:
    """Per length (short, longer): each of ``keys``, with a question minus without."""
    return {s: {k: _gap(cells[f"question, {s}"][k], cells[f"no question, {s}"][k]) for k in keys}
            for s in ("short", "longer")}


def cue_table(items: Iterable[Record], short_words: int = SHORT_WORDS) -> dict[str, Any]:
    """The cells and gaps of the module docstring for judge items ``items``."""
    pref: list[tuple[str, tuple[bool, ...]]] = []  # (reply, (the candidate is real, it is preferred))
    reply: list[tuple[str, tuple[bool, ...]]] = []  # (reply, (labelled True,))
    for item in items:
        labels = item.get("labels") or {}
        text = reply_text(item["candidate"])[0]
        if "preference" in labels:
            pref.append((text, (_candidate_is_real(item), labels["preference"] == "second")))
        elif "reply" in labels:
            reply.append((text, (labels["reply"] is True,)))
    p = _cells(_tally(pref, 2, short_words), {"real_pct": 1, "preferred_pct": 2}, items="preference_items")
    r = _cells(_tally(reply, 1, short_words), {"reply_true_pct": 1}, items="reply_items")
    cells = {name: {**p[name], **r[name]} for name in p}
    return {"short_words": short_words, "cells": cells,
            "gap_question_minus_not": _gaps(cells, ("real_pct", "preferred_pct", "reply_true_pct"))}


def judged_cue_table(rows: Iterable[tuple[str, bool, bool]], short_words: int = SHORT_WORDS) -> dict[str, Any]:
    """How a judge follows the same cue: ``rows`` of (candidate reply, the label says positive, the judge says
    positive), e.g. "reply 2 preferred" or "reply True". Per cell: items, the labels' positive %, the judge's, and the
    discordant counts (``over``: the judge positive where the label is not; ``under``: the reverse); per length, the
    gap (question minus no question) of the labels and of the judge. A judge that learned the labels and not the cue
    has a judge gap near the labels' gap and as many ``over`` as ``under`` items in each cell."""
    flagged = ((text, (label, said, said and not label, label and not said)) for text, label, said in rows)
    cells = _cells(_tally(flagged, 4, short_words), {"label_pct": 1, "judge_pct": 2}, {"over": 3, "under": 4})
    return {"short_words": short_words, "cells": cells,
            "gap_question_minus_not": _gaps(cells, ("label_pct", "judge_pct"))}


def _pct(k: int, n: int) -> float | None:
    return round(100.0 * k / n, 1) if n else None


def _gap(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else round(float(a) - float(b), 1)


def markdown(table: dict[str, Any], title: str) -> str:
    """The table of :func:`cue_table` as markdown under ``title``."""
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = [f"{title} (short: at most {table['short_words']} words)", "",
             ("| candidate reply | preference items | candidate is the real reply % | candidate preferred % | "
              "reply items | reply True % |"), "|---|---|---|---|---|---|"]
    for name, c in table["cells"].items():
        lines.append(f"| {name} | {c['preference_items']} | {f(c['real_pct'])} | {f(c['preferred_pct'])} | "
                     f"{c['reply_items']} | {f(c['reply_true_pct'])} |")
    for s, g in table["gap_question_minus_not"].items():
        lines.append(f"| gap, {s}: question - no question | | {f(g['real_pct'])} | {f(g['preferred_pct'])} | | "
                     f"{f(g['reply_true_pct'])} |")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``compeer-data cues``."""
    p = sub.add_parser("cues", help="whether a question / short reply tells the label in judge items (no judge)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="+", help="judge items JSONL files (e.g. OUT/silver-train/items.jsonl)")
    p.add_argument("--short-words", type=int, default=SHORT_WORDS, help="a short reply's most words (default 10)")
    p.add_argument("--json", type=Path, help="also write the tables here (one per file, by path)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, **_: Any) -> int:
    """Print the table of each items file; 0."""
    if args.short_words < 1:
        raise ValueError(f"--short-words must be at least 1, got {args.short_words}")
    out = {}
    for path in args.items:
        out[path] = cue_table(read_jsonl(path), args.short_words)
        print(markdown(out[path], f"`{path}`") + "\n")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0
