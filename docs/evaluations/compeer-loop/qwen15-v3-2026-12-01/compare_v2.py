"""Seed 0 of this run (judge v3) beside seed 0 of the 2026-11-30 run (judge v2), prompt by prompt: the same 585 valid
prompts, plan and seed; each run trained its own warm-up, so (a) - (a) shows how far two warm-ups of one seed differ.
Paired by prompt id: mean difference of the independent scorer's win (1 / 0.5 / 0) and of strategy accuracy, with a
bootstrap 95% interval over prompts; the share of the most frequent named strategy per arm.
    python compare_v2.py V3_SEED0 V2_SEED0     # folders with eval/<arm>/records.jsonl (inputs/results.tar.xz of each)"""
import collections
import json
import random
import sys
from pathlib import Path


def records(root: str, arm: str) -> dict[str, dict]:
    path = Path(root) / "eval" / arm / "records.jsonl"
    return {r["id"]: r for r in map(json.loads, path.open())}


def score(r: dict, what: str) -> float | None:
    if what == "independent_win":
        return r.get("independent_win") if r.get("independent_status") == "ok" else None
    return 100.0 * (r.get("strategy") == r.get("gold_strategy"))


def paired(a: dict, b: dict, what: str) -> str:
    pairs = [(score(a[k], what), score(b[k], what)) for k in a if k in b]
    d = [x - y for x, y in pairs if x is not None and y is not None]
    rng = random.Random(0)
    boots = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(2000))
    return f"{sum(d) / len(d):+.3f} [{boots[50]:+.3f}, {boots[1949]:+.3f}] (n {len(d)})"


def top_strategy(r: dict) -> str:
    c = collections.Counter(x.get("strategy") for x in r.values())
    s, n = c.most_common(1)[0]
    return f"{s} {100 * n / len(r):.1f}%"


v3, v2 = sys.argv[1], sys.argv[2]
for arm_a, arm_b, label in (("a", "a", "(a) v3 run - (a) v2 run (two warm-ups, one seed)"),
                            ("c", "c", "(c) against v3 - (c) against v2"),
                            ("c", "a", "(c) against v3 - (a) of its own run")):
    A, B = records(v3, arm_a), records(v2 if arm_b == arm_a else v3, arm_b)
    print(label)
    for what in ("independent_win", "strategy_correct"):
        print(f"  {what:17s} {paired(A, B, what)}")
for root, name in ((v3, "v3 run"), (v2, "v2 run")):
    for arm in ("a", "c"):
        print(f"most frequent strategy, {name} ({arm}): {top_strategy(records(root, arm))}")
