"""Seed 0 of this run (judge v3) beside seed 0 of the 2026-11-30 run (judge v2), prompt by prompt: the same 585 valid
prompts, plan and seed; each run trained its own warm-up, so (a) - (a) shows how far two warm-ups of one seed differ.
Paired by prompt with the loop report's own functions (``compeer_loop.stats.per_prompt`` / ``paired_difference``:
mean difference, paired bootstrap 95% interval, sign-flip permutation p) on the independent scorer's win (1 / 0.5 / 0)
and strategy accuracy; and the share of the most frequent named strategy per arm.
    PYTHONPATH=. python docs/evaluations/compeer-loop/qwen15-v3-2026-12-01/compare_v2.py V3_SEED0 V2_SEED0
    # loop folders with eval/<arm>/records.jsonl (inputs/results.tar.xz of each run)"""
import collections
import sys
from pathlib import Path

from compeer_loop.prompts import read_jsonl
from compeer_loop.stats import paired_difference, per_prompt


def records(root: str, arm: str) -> list[dict]:
    return read_jsonl(Path(root) / "eval" / arm / "records.jsonl")


def top_strategy(rs: list[dict]) -> str:
    s, n = collections.Counter(r.get("strategy") for r in rs).most_common(1)[0]
    return f"{s} {100 * n / len(rs):.1f}%"


v3, v2 = sys.argv[1], sys.argv[2]
for (root_a, arm_a), (root_b, arm_b), label in (
        ((v3, "a"), (v2, "a"), "(a) v3 run - (a) v2 run (two warm-ups, one seed)"),
        ((v3, "c"), (v2, "c"), "(c) against v3 - (c) against v2"),
        ((v3, "c"), (v3, "a"), "(c) against v3 - (a) of its own run")):
    print(label)
    for key in ("independent_win", "strategy_correct"):
        d = paired_difference(per_prompt(records(root_a, arm_a), key), per_prompt(records(root_b, arm_b), key))
        print(f"  {key:17s} {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] (n {d['n']}, p {d['p']:.4f})")
for root, name in ((v3, "v3 run"), (v2, "v2 run")):
    for arm in ("a", "c"):
        print(f"most frequent strategy, {name} ({arm}): {top_strategy(records(root, arm))}")
