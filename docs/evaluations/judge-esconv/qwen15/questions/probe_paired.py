"""Paired reading of the question probe (probe_groups.py): per judge, in how many groups the real reply's discrete total
beats the content-free question's and the content-free statement's (ties half), and the difference, paired over the
same groups (95% bootstrap interval over groups; McNemar's exact test on the groups where exactly one of the two
is beaten outright).

    python docs/evaluations/judge-esconv/qwen15/questions/probe_paired.py CONTRAST.json [CONTRAST.json ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np
from scipy.stats import binomtest


def win(pos: float | None, neg: float | None) -> float | None:
    """1 when the real reply's total is higher, 0.5 when equal, 0 when lower; None when either is unscored."""
    if pos is None or neg is None:
        return None
    return 1.0 if pos > neg else 0.5 if pos == neg else 0.0


def main(paths: list[str]) -> None:
    print("| judge (file) | groups | real beats the question (ties half) | real beats the statement | statement - "
          "question [95% CI] | only the statement beaten / only the question (McNemar p) |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        for judge, refs in data["totals"].items():
            rows = [(win(g["positive"]["discrete"], g["generic_question"]["discrete"]),
                     win(g["positive"]["discrete"], g["generic_statement"]["discrete"])) for g in refs["gold"]]
            rows = [(q, s) for q, s in rows if q is not None and s is not None]
            q, s = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
            d = s - q
            boot = d[rng.integers(0, len(d), (2000, len(d)))].mean(axis=1)
            lo, hi = np.percentile(boot, [2.5, 97.5])
            only_s = int(((s == 1.0) & (q < 1.0)).sum())
            only_q = int(((q == 1.0) & (s < 1.0)).sum())
            p = binomtest(only_s, only_s + only_q).pvalue if only_s + only_q else 1.0
            print(f"| {judge} ({path}) | {len(rows)} | {q.mean():.3f} | {s.mean():.3f} | {d.mean():+.3f} "
                  f"[{lo:+.3f}, {hi:+.3f}] | {only_s} / {only_q} (p {p:.2g}) |")


if __name__ == "__main__":
    main(sys.argv[1:])
