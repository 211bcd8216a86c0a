"""Per mark of the pipeline's rule: how many completions, their mean graded total, and how often one outscores an
unmarked completion of its rollout group (pairs, ties half; the rule and pairing of ``summary-next_step.json``'s
``degenerate_wins_share``, split by mark). Reads each seed folder's ``completions-next_step.jsonl.xz``.

    .venv/bin/python docs/runs/grpo-gpu-2026-11-30-h200-round3-judge/by_mark.py \\
        docs/runs/grpo-gpu-2026-11-29-h200-one-epoch-256/seed0 docs/runs/grpo-gpu-2026-11-30-h200-round3-judge/seed0
"""
from __future__ import annotations

import json
import lzma
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from policy_trainer.report import is_degenerate


def by_mark(folder: Path) -> dict[str, dict[str, float]]:
    """mark ("none" for unmarked) -> completions scored, their mean graded total and, for degenerate marks, the pair win share."""
    groups: dict[tuple[int, int, int], list[dict]] = defaultdict(list)
    with lzma.open(folder / "completions-next_step.jsonl.xz", "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                c = json.loads(line)
                groups[(c["step"], c["call"], c["group"])].append(c)  # a resumed run counts its calls from 1 again
    totals: dict[str, list[float]] = defaultdict(list)
    wins: dict[str, list[float]] = defaultdict(list)
    for group in groups.values():
        good = [c["reward"] for c in group if not is_degenerate(c["mark"]) and c["reward"] is not None]
        for c in group:
            mark = c["mark"] or "none"
            if c["graded_total"] is not None:
                totals[mark].append(c["graded_total"])
            if is_degenerate(c["mark"]) and c["reward"] is not None:
                wins[mark] += [1.0 if c["reward"] > o else 0.5 if c["reward"] == o else 0.0 for o in good]
    return {m: {"scored": len(v), "mean_graded_total": round(statistics.fmean(v), 2),
                **({"wins_share": round(statistics.fmean(wins[m]), 3), "pairs": len(wins[m])} if wins[m] else {})}
            for m, v in sorted(totals.items())}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(arg, json.dumps(by_mark(Path(arg)), indent=1))
