"""Recomputes the table of docs/policy_trainer.md ("measured on an H200") from this folder's metrics files.

    python docs/runs/grpo-gpu-2026-11-29-h200-overlap/table.py
"""
from __future__ import annotations

import io
import json
import statistics
import tarfile
from pathlib import Path

HERE = Path(__file__).parent
ARCHIVES = {"off": "off-same_step", "same_step": "off-same_step", "next_step": "next_step"}
KEYS = ("step_time", "compeer/reward_wait_s", "compeer/reward_call_latency_s", "compeer/reward_prefetched",
        "frac_reward_zero_std", "compeer/graded_total_mean", "entropy")


def metrics(arm: str) -> list[dict[str, float]]:
    with tarfile.open(HERE / ARCHIVES[arm] / "plots-logs.tar.xz") as tar:
        member = tar.extractfile(f"metrics-{arm}.jsonl")
        assert member is not None
        rows = [json.loads(line) for line in io.TextIOWrapper(member, encoding="utf-8") if line.strip()]
    return [r for r in rows if "step_time" in r]


def main() -> None:
    print("arm        steps  " + "  ".join(f"{k.split('/')[-1]:>22}" for k in KEYS) + "  wait share (from step 2)")
    for arm in ARCHIVES:
        rows = metrics(arm)
        for label, part in (("all", rows), ("from 2", rows[1:])):
            means = [statistics.fmean(r.get(k, float("nan")) for r in part) for k in KEYS]
            share = sum(r["compeer/reward_wait_s"] for r in part) / sum(r["step_time"] for r in part)
            print(f"{arm:<10} {len(part):>3} {label:<7}" + "  ".join(f"{m:>22.4f}" for m in means) + f"  {share:.4f}")


if __name__ == "__main__":
    main()
