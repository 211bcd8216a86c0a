"""Recomputes the tables of docs/policy_trainer.md ("measured on an H200") from a run folder's metrics files: every
``metrics-<arm>.jsonl`` in the ``plots-logs.tar.xz`` of its subfolders (this folder by default).

    python docs/runs/grpo-gpu-2026-11-29-h200-overlap/table.py
    python docs/runs/grpo-gpu-2026-11-29-h200-overlap/table.py docs/runs/grpo-gpu-2026-11-29-h200-overlap-max_tokens
    python docs/runs/grpo-gpu-2026-11-29-h200-overlap/table.py docs/runs/grpo-gpu-2026-11-29-h200-one-epoch-256/seed0

A folder with a ``plots-logs.tar.xz`` of its own is read alone (one call's runs).
"""
from __future__ import annotations

import io
import json
import statistics
import sys
import tarfile
from pathlib import Path

ORDER = ("off", "same_step", "next_step")
KEYS = ("step_time", "compeer/reward_wait_s", "compeer/reward_call_latency_s", "compeer/reward_prefetched",
        "frac_reward_zero_std", "compeer/graded_total_mean", "entropy")


def arms(folder: Path) -> dict[str, list[dict[str, float]]]:
    """arm -> its logged steps (rows with a step time), from ``folder``'s archive or every archive under it."""
    out: dict[str, list[dict[str, float]]] = {}
    own = folder / "plots-logs.tar.xz"
    for archive in [own] if own.is_file() else sorted(folder.glob("*/plots-logs.tar.xz")):
        with tarfile.open(archive) as tar:
            for name in tar.getnames():
                if name.startswith("metrics-") and name.endswith(".jsonl"):
                    member = tar.extractfile(name)
                    assert member is not None
                    rows = [json.loads(line) for line in io.TextIOWrapper(member, encoding="utf-8") if line.strip()]
                    out[name[len("metrics-"):-len(".jsonl")]] = [r for r in rows if "step_time" in r]
    return dict(sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    print("arm        steps  " + "  ".join(f"{k.split('/')[-1]:>22}" for k in KEYS) + "  wait share (from step 2)")
    for arm, rows in arms(folder).items():
        for label, part in (("all", rows), ("from 2", rows[1:])):
            means = [statistics.fmean(r.get(k, float("nan")) for r in part) for k in KEYS]
            share = sum(r["compeer/reward_wait_s"] for r in part) / sum(r["step_time"] for r in part)
            print(f"{arm:<10} {len(part):>3} {label:<7}" + "  ".join(f"{m:>22.4f}" for m in means) + f"  {share:.4f}")


if __name__ == "__main__":
    main()
