"""The degenerate share of the GRPO runs against the 500-step judge (v3, this folder) beside the same command's runs
against the 400-step judge (v2, docs/runs/grpo-gpu-2026-11-30-h200-qwen15-policy), seeds 0-2 each: per run and
pooled, all marks of the pipeline's rule and the kinds ESConv's supporters do not write (everything but
generic/short_no_content), with a 95% bootstrap interval of the pooled v3 - v2 difference (steps resampled within
each run, 10,000 draws, seed 0). Run from the repository root:

    .venv/bin/python docs/runs/grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/compare.py
"""
from __future__ import annotations

import json
import lzma
import random
from collections import defaultdict
from pathlib import Path

from data_builder.policy_negatives import is_degenerate

HERE = Path(__file__).parent
RUNS = {"v3": [HERE / f"seed{s}" for s in range(3)],
        "v2": [HERE.parent / "grpo-gpu-2026-11-30-h200-qwen15-policy" / f"seed{s}" for s in range(3)]}
HUMAN_KIND = "generic/short_no_content"  # the one kind ESConv's supporters write too (human_rate.txt)


def steps(folder: Path) -> list[tuple[int, int, int]]:
    """Per logged step: (completions, degenerate ones, degenerate ones of a kind supporters do not write)."""
    per: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    with lzma.open(folder / "completions-next_step.jsonl.xz", "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                c = json.loads(line)
                row = per[c["step"]]
                row[0] += 1
                if is_degenerate(c.get("mark")):
                    row[1] += 1
                    row[2] += c.get("mark") != HUMAN_KIND
    return [tuple(v) for _, v in sorted(per.items())]  # type: ignore[misc]


def share(runs: list[list[tuple[int, int, int]]], col: int) -> float:
    return sum(s[col] for r in runs for s in r) / sum(s[0] for r in runs for s in r)


def main() -> None:
    data = {judge: [steps(f) for f in folders] for judge, folders in RUNS.items()}
    rng = random.Random(0)
    for col, name in ((1, "every mark"), (2, "kinds supporters do not write")):
        print(f"degenerate share, {name}:")
        for judge, runs in data.items():
            per_run = ", ".join(f"{100 * share([r], col):.1f}%" for r in runs)
            print(f"  {judge}: seeds 0/1/2 {per_run}; pooled {100 * share(runs, col):.2f}%")
        diffs = sorted(share([rng.choices(r, k=len(r)) for r in data["v3"]], col)
                       - share([rng.choices(r, k=len(r)) for r in data["v2"]], col) for _ in range(10_000))
        d = share(data["v3"], col) - share(data["v2"], col)
        print(f"  v3 - v2 pooled: {100 * d:+.2f} points [{100 * diffs[250]:+.2f}, {100 * diffs[9750]:+.2f}]")


if __name__ == "__main__":
    main()
