"""Recomputes this run's table (docs/evaluations/judge-esconv/qwen15/report.md, "GRPO against the 400-step judge")
from metrics.jsonl: each component's mean over the first and the last quarter of the logged steps, their difference,
and a two-sided permutation p of that difference (steps shuffled between the two quarters; 20,000 draws, seed 0),
then the marks of completions.jsonl.xz as logged and, where the repository is importable (run from its root:
python3 docs/runs/grpo-gpu-2026-11-29-h200-v2-judge/quarters.py), as the degenerate-reply rule reads them since the
cut-off check comes first (the logged lines marked stage_label or judge_wording read again; the other rules, which
look at the conversation, are unchanged and come after it).

Another run's folder as the argument reads that run instead: its metrics.jsonl, or the metrics-*.jsonl inside its
plots-logs.tar.xz (what tools/gpu/device_evidence.sh overlap returns), and its completions.jsonl.xz or
completions-*.jsonl.xz."""

from __future__ import annotations

import json
import lzma
import random
import sys
import tarfile
from collections.abc import Iterable
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


def count(marks: Iterable[str | None]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for m in marks:
        kinds[str(m)] = kinds.get(str(m), 0) + 1
    return kinds


def metrics_text(run: Path) -> str:
    if (run / "metrics.jsonl").is_file():
        return (run / "metrics.jsonl").read_text()
    with tarfile.open(run / "plots-logs.tar.xz") as tar:
        member = next(m for m in tar.getmembers() if m.name.startswith("metrics") and m.name.endswith(".jsonl"))
        fh = tar.extractfile(member)
        assert fh is not None
        return fh.read().decode()


def main() -> None:
    run = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    rows = [json.loads(line) for line in metrics_text(run).splitlines() if line.strip()]
    k = len(rows) // 4
    out = {"steps": len(rows), "quarter_steps": k, "rows": {}}
    for name, key in KEYS.items():
        first, last = [r[key] for r in rows[:k]], [r[key] for r in rows[-k:]]
        out["rows"][name] = {"first": mean(first), "last": mean(last), "whole": mean([r[key] for r in rows]),
                             "diff": mean(last) - mean(first), "p": permutation_p(first, last)}
    with lzma.open(next(run.glob("completions*.jsonl.xz")), "rt", encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh if line.strip()]
    out["completions"] = {"n": len(lines), "per_step": len(lines) // len(rows), "marks": count(c["mark"] for c in lines)}
    try:
        from policy_trainer.batches import mark_completion
    except ImportError:
        pass
    else:
        again = [mark_completion(c["text"], []) if str(c["mark"]).endswith(("/stage_label", "/judge_wording"))
                 else c["mark"] for c in lines]
        out["completions"]["marks_cut_off_first"] = count(again)
    print(json.dumps(out, indent=1))
    for name, r in out["rows"].items():
        print(f"| {name} | {r['first']:.3f} | {r['last']:.3f} | {r['whole']:.3f} | {r['diff']:+.3f} (p {r['p']:.2f}) |")


if __name__ == "__main__":
    main()
