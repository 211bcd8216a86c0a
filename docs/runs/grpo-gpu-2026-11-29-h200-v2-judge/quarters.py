"""Recomputes this run's table (docs/evaluations/judge-esconv/qwen15/report.md, "GRPO against the 400-step judge")
from metrics.jsonl: each component's mean over the first and the last quarter of the logged steps, their difference,
and a two-sided permutation p of that difference (steps shuffled between the two quarters; 20,000 draws, seed 0),
then the degenerate share per quarter from completions.jsonl.xz. Run from this folder: python3 quarters.py."""

from __future__ import annotations

import json
import lzma
import random
from pathlib import Path

HERE = Path(__file__).parent
KEYS = {
    "degenerate share (the pipeline's rule)": "compeer/degenerate_share",
    "step reward mean": "compeer/step_reward_mean",
    "preference reward mean": "compeer/preference_reward_mean",
    "format reward mean": "compeer/format_reward_mean",
    "graded total (the trained reward, before reweighting)": "compeer/graded_total_mean",
    "completions cut at max_completion_length": "completions/clipped_ratio",
}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def permutation_p(a: list[float], b: list[float], draws: int = 20_000, seed: int = 0) -> float:
    observed = abs(mean(b) - mean(a))
    pool, rng, hits = a + b, random.Random(seed), 0
    for _ in range(draws):
        rng.shuffle(pool)
        hits += abs(mean(pool[len(a):]) - mean(pool[:len(a)])) >= observed - 1e-12
    return (hits + 1) / (draws + 1)


def main() -> None:
    rows = [json.loads(line) for line in (HERE / "metrics.jsonl").read_text().splitlines() if line.strip()]
    k = len(rows) // 4
    out = {"steps": len(rows), "quarter_steps": k, "rows": {}}
    for name, key in KEYS.items():
        first, last = [r[key] for r in rows[:k]], [r[key] for r in rows[-k:]]
        out["rows"][name] = {"first": mean(first), "last": mean(last), "whole": mean([r[key] for r in rows]),
                             "diff": mean(last) - mean(first), "p": permutation_p(first, last)}
    with lzma.open(HERE / "completions.jsonl.xz", "rt", encoding="utf-8") as fh:
        marks = [json.loads(line)["mark"] for line in fh if line.strip()]
    per_step = len(marks) // len(rows)
    kinds: dict[str, int] = {}
    for m in marks:
        kinds[str(m)] = kinds.get(str(m), 0) + 1
    out["completions"] = {"n": len(marks), "per_step": per_step, "marks": kinds}
    print(json.dumps(out, indent=1))
    for name, r in out["rows"].items():
        print(f"| {name} | {r['first']:.3f} | {r['last']:.3f} | {r['whole']:.3f} | {r['diff']:+.3f} (p {r['p']:.2f}) |")


if __name__ == "__main__":
    main()
