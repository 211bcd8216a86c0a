"""The real supporters' rate under the degenerate-reply rule, at the very prompts a GRPO run trained on.

The < 2% degenerate goal of issue 23 counts the replies `data_builder.policy_negatives.mark_reply` marks. This reads
a run's completions, takes each distinct prompt (dialogue id, round), marks ESConv's real supporter reply of that
round in its conversation with the same rule, and prints the share of prompts (and of completions) whose real reply
the rule counts as degenerate, by rule, beside the run's own share overall and on the prompts whose real reply is /
is not marked. Run from the repository root:

    .venv/bin/python -m data_builder.cli ingest --quiet --format esconv --out /tmp/ingest-train \\
        ../shared/data/esconv/train.json
    .venv/bin/python docs/runs/grpo-gpu-2026-11-30-h200-qwen15-policy/human_rate.py \\
        /tmp/ingest-train/dialogues.jsonl RUN_FOLDER...

RUN_FOLDER: a folder with completions-next_step.jsonl.xz (the runs' prompts are ESConv train rounds).
"""
from __future__ import annotations

import json
import lzma
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from data_builder.policy_negatives import is_degenerate, mark_reply
from data_builder.sample import make_round, rounds_of


def _mark(logged: Any) -> str | None:
    return None if logged in (None, "None") else str(logged)


def report(dialogues: dict[str, dict[str, Any]], folder: Path) -> str:
    """The lines for one run folder."""
    with lzma.open(folder / "completions-next_step.jsonl.xz", "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    real: dict[tuple[str, int], str | None] = {}
    for r in recs:
        key = (r["dialogue_id"], int(r["round_index"]))
        if key not in real:
            d = dialogues[key[0]]
            rnd = make_round(d, rounds_of(d["turns"]), key[1])  # the round as the data pipeline builds it
            real[key] = mark_reply(rnd["reference"], rnd["history"])
    marked = {k for k, m in real.items() if is_degenerate(m)}
    rules = Counter(m for m in real.values() if is_degenerate(m))
    at_marked = [(r["dialogue_id"], int(r["round_index"])) in marked for r in recs]
    degenerate = [is_degenerate(_mark(r.get("mark"))) for r in recs]
    on = [d for d, m in zip(degenerate, at_marked) if m]
    off = [d for d, m in zip(degenerate, at_marked) if not m]

    def pct(xs: list[bool]) -> str:
        return f"{100 * sum(xs) / len(xs):.1f}% of {len(xs)}" if xs else "-"

    return (f"{folder}\n  prompts {len(real)}: the real reply is marked degenerate at {len(marked)} "
            f"({100 * len(marked) / len(real):.1f}%; {100 * sum(at_marked) / len(recs):.1f}% of the completions' "
            f"prompts); rules {dict(sorted(rules.items()))}\n"
            f"  the run's degenerate share: all {pct(degenerate)}; where the real reply is marked {pct(on)}; "
            f"elsewhere {pct(off)}")


def main(argv: list[str]) -> None:
    """``DIALOGUES_JSONL RUN_FOLDER...``: one report per run folder."""
    dialogues: dict[str, dict[str, Any]] = {}
    with open(argv[0], encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            dialogues[d["id"]] = d
    for folder in argv[1:]:
        print(report(dialogues, Path(folder)))


if __name__ == "__main__":
    main(sys.argv[1:])
