"""GRPO step time and the share of it spent waiting on the reward, per ``reward_overlap``, side by side in one run.

    python -m bench.grpo_overlap [--esconv ../shared/data/esconv] [--steps 6] [--rounds 2] [--warmup-steps N]
        [--arms off,same_step,next_step] [--server HOST:PORT] [--config cpu-smoke] [--set KEY=VALUE ...]

Builds GRPO prompts from real ESConv training dialogues (``compeer_loop.prompts.build_prompt_sets``: whole
conversations up to a seeker turn, what a trainer sends), starts the real reward server (default judge, vLLM
engine, result cache off: arms of one seed write the same first completions, which a cache would answer for free)
unless ``--server`` names one (turn its cache off), then trains each arm for ``--steps`` GRPO steps with
``compeer-train grpo``'s own code (``policy_trainer.runner.run``), the arms interleaved ``--rounds`` times (off,
same_step, next_step, off, ...) so drift on a noisy machine spreads over all of them. Same profile, prompts, seed
and judge for every arm; only ``reward_overlap`` differs (next_step trains each batch a step after it was sampled,
docs/policy_trainer.md). With ``--warmup-steps`` every arm starts from one SFT warm-up trained first, so that the
policy writes replies the judge really judges. Per arm, over the steps after the first (the first has no batch
judged ahead): mean step time, time waited on the reward (``compeer/reward_wait_s``), its share of the step, the
reward call's own latency, and ratios to ``off``.
Writes bench/results/grpo_overlap.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, machine_description, print_table, write_result
from bench.judge_throughput import start_server
from compeer_loop.prompts import TRAIN_FILE, WARMUP_FILE, build_prompt_sets
from policy_trainer.config import RewardOverlap, load_config, parse_override
from policy_trainer.report import read_metrics
from policy_trainer.report import summarise as summarise_run
from policy_trainer.runner import load_policy, lora_config, run
from policy_trainer.warmup import run_warmup, warmup_adapter_path

ESCONV = Path(__file__).resolve().parents[2] / "shared" / "data" / "esconv"


def _train(arm: str, config: str, overrides: dict[str, Any], out: Path, warmup: Path | None) -> list[dict[str, Any]]:
    if warmup is not None:  # every arm starts from the one warm-up (the runner reuses OUT/warmup/adapter)
        shutil.copytree(warmup, warmup_adapter_path(out))
    cfg = load_config(config, {**overrides, "reward_overlap": arm, "output_dir": str(out), "save_strategy": "no"})
    run(cfg, out)
    return read_metrics(out)


def _warmup(config: str, overrides: dict[str, Any], out: Path) -> Path:
    """The SFT warm-up once, so the policy writes CER replies the judge really judges (a reply without the four
    parts is failed on format without a judge round, which would make every arm's reward wait trivially small)."""
    cfg = load_config(config, {**overrides, "output_dir": str(out)})
    model, tokenizer, _ = load_policy(cfg)
    run_warmup(cfg, model, tokenizer, out, lora_config(cfg))
    return warmup_adapter_path(out)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over steps 2.. of one arm's metric rows (step 1 has nothing judged ahead in any arm)."""
    later = [r for r in rows if r["step"] > 1]
    run_summary = summarise_run(later)  # the trainer's own step-time and wait-share figures, on these steps
    return {"steps": len(later), "step_time_s": run_summary["step_time_mean_s"],
            "reward_wait_s": run_summary["reward_wait_mean_s"], "reward_wait_share": run_summary["reward_wait_share"],
            "reward_call_s": statistics.fmean(r["compeer/reward_call_latency_s"] for r in later),
            "unscored_rate": statistics.fmean(r["compeer/unscored_rate"] for r in later)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--esconv", type=Path, default=ESCONV, help="folder with ESConv train.json and valid.json")
    ap.add_argument("--steps", type=int, default=6, help="GRPO steps per arm and round (>= 2)")
    ap.add_argument("--rounds", type=int, default=2, help="times every arm is trained, interleaved")
    ap.add_argument("--arms", default=",".join(m.value for m in RewardOverlap))
    ap.add_argument("--server", help="a running reward server's gRPC address (default: start one)")
    ap.add_argument("--config", default="cpu-smoke", help="GRPO profile (compeer-train grpo --config)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="SFT warm-up steps run once (on the ESConv warm-up rows unless --set sft_warmup_dataset=...); "
                         "every arm starts from it (0: none)")
    ap.add_argument("--name", default="grpo_overlap", help="result file name under bench/results/")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2: step 1 is left out of the means")
    arms = [RewardOverlap(a).value for a in args.arms.split(",")]
    logging.basicConfig(level=logging.WARNING)
    proc, address = None, args.server
    if address is None:  # cache off: arms of one seed write the same first completions, which a cache answers free
        grpc_port = free_port()
        proc, address = start_server(grpc_port, free_port(), None, extra=["--cache", "off"]), f"127.0.0.1:{grpc_port}"
    try:
        with tempfile.TemporaryDirectory(prefix="grpo-overlap-") as tmp:
            work = Path(tmp)
            manifest = build_prompt_sets(args.esconv / "train.json", args.esconv / "valid.json", work / "prompts",
                                         max_eval=1)
            overrides = {"prompt_set": str(work / "prompts" / TRAIN_FILE), "reward_server": [address],
                         "max_steps": args.steps, **dict(parse_override(s) for s in args.set)}
            warmup = None
            if args.warmup_steps:
                overrides["sft_warmup_steps"] = args.warmup_steps  # on the ESConv warm-up rows unless --set says
                overrides.setdefault("sft_warmup_dataset", str(work / "prompts" / WARMUP_FILE))
                t0 = time.perf_counter()
                warmup = _warmup(args.config, overrides, work / "warmup")
                print(f"warm-up ({args.warmup_steps} steps): {time.perf_counter() - t0:.0f} s", flush=True)
            runs: dict[str, list[list[dict[str, Any]]]] = {a: [] for a in arms}
            for r in range(args.rounds):
                for arm in arms:
                    t0 = time.perf_counter()
                    runs[arm].append(_train(arm, args.config, overrides, work / f"{arm}-{r}", warmup))
                    print(f"round {r + 1}/{args.rounds} {arm}: {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    figures = {a: summarise([row for rows in runs[a] for row in rows]) for a in arms}
    base = figures.get(RewardOverlap.OFF.value)
    if base:
        for f in figures.values():
            f["step_time_vs_off"] = f["step_time_s"] / base["step_time_s"]
            f["reward_wait_vs_off"] = f["reward_wait_s"] / base["reward_wait_s"]
    for arm, f in figures.items():
        print_table(f"reward_overlap {arm} (steps 2..{args.steps}, {args.rounds} rounds)", [
            ("step time (s)", f["step_time_s"], ""), ("reward wait (s)", f["reward_wait_s"], "the step blocked on it"),
            ("reward wait share", f["reward_wait_share"], "goal < 0.05 (issue 27)"),
            ("reward call (s)", f["reward_call_s"], "the judge's own latency"),
            ("step time vs off", f.get("step_time_vs_off", float("nan")), "ratio in this run"),
            ("reward wait vs off", f.get("reward_wait_vs_off", float("nan")), "ratio in this run")])
    out = write_result(args.name, {
        "settings": {"config": args.config, "overrides": args.set, "steps": args.steps, "rounds": args.rounds,
                     "warmup_steps": args.warmup_steps,
                     "prompts": manifest["counts"]["grpo_train"], "esconv_train_sha256":
                     manifest["inputs"]["train"]["sha256"], "server": args.server or "started (default judge, vllm)"},
        "machine_detail": machine_description(), "arms": figures,
        "per_step": {a: [[{k: row.get(k) for k in ("step", "step_time", "compeer/reward_wait_s",
                                                     "compeer/reward_call_latency_s", "compeer/reward_prefetched")}
                          for row in rows] for rows in runs[a]] for a in arms}})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
