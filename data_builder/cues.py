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


def cue_table(items: Iterable[Record], short_words: int = SHORT_WORDS) -> dict[str, Any]:
    """The cells and gaps of the module docstring for judge items ``items``."""
    pref: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])  # items, real, preferred
    reply: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # items, True
    for item in items:
        labels = item.get("labels") or {}
        text = reply_text(item["candidate"])[0]
        cell = cell_of(text, short_words)
        if "preference" in labels:
            c = pref[cell]
            c[0] += 1
            c[1] += _candidate_is_real(item)
            c[2] += labels["preference"] == "second"
        elif "reply" in labels:
            r = reply[cell]
            r[0] += 1
            r[1] += labels["reply"] is True

    cells = {f"{q}, {s}": {"preference_items": pref[(q, s)][0], "real_pct": _pct(pref[(q, s)][1], pref[(q, s)][0]),
                           "preferred_pct": _pct(pref[(q, s)][2], pref[(q, s)][0]), "reply_items": reply[(q, s)][0],
                           "reply_true_pct": _pct(reply[(q, s)][1], reply[(q, s)][0])} for q, s in CELLS}
    gaps = {s: {k: _gap(cells[f"question, {s}"][k], cells[f"no question, {s}"][k])
                for k in ("real_pct", "preferred_pct", "reply_true_pct")} for s in ("short", "longer")}
    return {"short_words": short_words, "cells": cells, "gap_question_minus_not": gaps}


def judged_cue_table(rows: Iterable[tuple[str, bool, bool]], short_words: int = SHORT_WORDS) -> dict[str, Any]:
    """How a judge follows the same cue: ``rows`` of (candidate reply, the label says positive, the judge says
    positive), e.g. "reply 2 preferred" or "reply True". Per cell: items, the labels' positive %, the judge's, and the
    discordant counts (``over``: the judge positive where the label is not; ``under``: the reverse); per length, the
    gap (question minus no question) of the labels and of the judge. A judge that learned the labels and not the cue
    has a judge gap near the labels' gap and as many ``over`` as ``under`` items in each cell."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])  # n, label+, judge+, over, under
    for text, label, said in rows:
        c = counts[cell_of(text, short_words)]
        c[0] += 1
        c[1] += label
        c[2] += said
        c[3] += said and not label
        c[4] += label and not said

    cells = {f"{q}, {s}": {"items": counts[(q, s)][0], "label_pct": _pct(counts[(q, s)][1], counts[(q, s)][0]),
                           "judge_pct": _pct(counts[(q, s)][2], counts[(q, s)][0]), "over": counts[(q, s)][3],
                           "under": counts[(q, s)][4]} for q, s in CELLS}
    gaps = {s: {k: _gap(cells[f"question, {s}"][k], cells[f"no question, {s}"][k]) for k in ("label_pct", "judge_pct")}
            for s in ("short", "longer")}
    return {"short_words": short_words, "cells": cells, "gap_question_minus_not": gaps}


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
