"""The GRPO reward function's own overhead per rollout group vs the reward RPC time, side by side in one run.

    python -m bench.reward_fn_overhead [--groups 8] [--group-size 4] [--warm-calls 5] [--server HOST:PORT]

Starts the real reward server (vLLM engine, default model, in-process cache) unless ``--server`` names a running
one, then calls ``policy_trainer.rewards.CompeerReward`` exactly as TRL does, with the real gRPC client, on one
generation batch (default 8 groups x G=4, the paper's batch of 32):
  - a cold call (every candidate judged) and ``--warm-calls`` repeats of the same batch (every candidate judged
    ``ok`` cold is a cache hit on the server, so the RPC time is transport + server core + similarities: the floor;
    only ``ok`` judgments are cached, so candidates not ``ok`` cold are judged again on every repeat: their count
    is reported as ``rejudged_per_warm_call`` and the cached figure is a floor only where it is 0);
  - the reward function's own time = its wall time minus the time inside ``score_batch`` (grouping, request
    building, result handling, Eq.5-7 reweighting, metrics);
  - client-side serialisation alone (neutral types -> protobuf -> bytes and back) and ``reweight`` alone.
Writes bench/results/reward_fn_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from bench.common import free_port, percentile, print_table, write_result
from bench.judge_throughput import make_groups
from cer.redundancy import reweight
from judge.model_store import resolve_model
from policy_trainer.config import LengthUnit
from policy_trainer.rewards import CompeerReward, RewardBatchStats, RewardSettings
from reward_server.client import RewardClient
from reward_server.grpc import convert
from reward_server.proto import pb
from reward_server.types import GroupRequest

START_TIMEOUT_S = 600.0


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """``compeer-reward serve`` on the default model (vLLM), memory cache; returns (process, gRPC address)."""
    grpc_port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "reward_server.cli", "serve", "--backend", os.environ.get("COMPEER_BENCH_BACKEND",
           "vllm"), "--model", "default", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port",
           str(http_port), "--cache", "memory", "--max-model-len", "4096"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reward server exited with {proc.returncode} during start-up")
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/readyz", timeout=2).status_code == 200:
                return proc, f"127.0.0.1:{grpc_port}"
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"reward server not ready after {START_TIMEOUT_S:.0f} s")


def trl_batch(groups: list[GroupRequest], tokenizer: Any) -> dict[str, Any]:
    """The keyword arguments TRL passes to a reward function for this batch (G consecutive per prompt)."""
    prompts, completions, ids, histories, refs = [], [], [], [], []
    for g in groups:
        hist = [t.to_dict() for t in g.history]
        for c in g.candidates:
            prompts.append([{"role": "user", "content": hist[-1]["text"]}])
            completions.append([{"role": "assistant", "content": c}])
            ids.append(tokenizer(c, add_special_tokens=False)["input_ids"])
            histories.append(hist)
            refs.append(g.reference)
    return {"prompts": prompts, "completions": completions, "completion_ids": ids, "history": histories,
            "reference": refs}


def time_serialisation(groups: list[GroupRequest], responses: list[Any], reps: int) -> tuple[float, float]:
    """Seconds per batch: request to bytes, and response bytes back to neutral types (client side only)."""
    t0 = time.perf_counter()
    for _ in range(reps):
        pb.ScoreBatchRequest(groups=[convert.group_request_to_pb(g) for g in groups]).SerializeToString()
    enc = (time.perf_counter() - t0) / reps
    wire = convert.batch_to_pb(responses).SerializeToString()
    t0 = time.perf_counter()
    for _ in range(reps):
        convert.batch_from_pb(pb.ScoreBatchResponse.FromString(wire))
    dec = (time.perf_counter() - t0) / reps
    return enc, dec


def time_reweight(group_size: int, reps: int) -> float:
    """Seconds per group for Eq.5-7 alone."""
    rewards = [float(i % 3 - 1) * 2 + 1 for i in range(group_size)]
    s = [0.1 * (i + 1) for i in range(group_size)]
    lengths = [100.0 + i for i in range(group_size)]
    t0 = time.perf_counter()
    for _ in range(reps):
        reweight(rewards, s, s, lengths, alpha=0.5, beta=5.0, mode="paper")
    return (time.perf_counter() - t0) / reps


async def measure(address: str, groups: list[GroupRequest], kwargs: dict[str, Any], warm_calls: int,
                  group_size: int) -> tuple[RewardBatchStats, list[RewardBatchStats], list[Any]]:
    settings = RewardSettings(num_generations=group_size, length_unit=LengthUnit.TOKENS, timeout_s=600.0)
    reward = CompeerReward(settings, lambda: RewardClient([address], timeout_s=600.0))
    await reward(**kwargs)  # cold: every candidate judged
    assert reward.last_stats is not None
    cold = reward.last_stats
    warm: list[RewardBatchStats] = []
    for _ in range(warm_calls):
        await reward(**kwargs)
        assert reward.last_stats is not None
        warm.append(reward.last_stats)
    client = RewardClient([address], timeout_s=600.0)
    responses = await client.score_batch(groups)
    await client.close()
    await reward.aclose()
    return cold, warm, responses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reward_fn_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--warm-calls", type=int, default=5)
    p.add_argument("--server", help="use a running server's gRPC address instead of starting one")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("default").path)
    groups = make_groups(args.groups, args.group_size, seed=7)
    kwargs = trl_batch(groups, tokenizer)
    proc = None
    address = args.server
    if address is None:
        proc, address = start_server()
    try:
        cold, warm, responses = asyncio.run(measure(address, groups, kwargs, args.warm_calls, args.group_size))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    enc_s, dec_s = time_serialisation(groups, responses, reps=200)
    rw_s = time_reweight(args.group_size, reps=5000)
    n = args.groups
    own_warm = [max(0.0, s.total_s - s.rpc_s) for s in warm]
    rpc_warm = [s.rpc_s for s in warm]
    own_ms = percentile(own_warm, 50) * 1e3 / n
    figures = {
        "groups": n, "group_size": args.group_size, "warm_calls": args.warm_calls,
        "own_overhead_ms_per_group_p50": own_ms,
        "own_overhead_ms_per_group_cold": max(0.0, cold.total_s - cold.rpc_s) * 1e3 / n,
        "serialise_request_ms_per_group": enc_s * 1e3 / n,
        "deserialise_response_ms_per_group": dec_s * 1e3 / n,
        "reweight_us_per_group": rw_s * 1e6,
        "rpc_ms_per_group_cold_judge": cold.rpc_s * 1e3 / n,
        "rpc_ms_per_group_cached_p50": percentile(rpc_warm, 50) * 1e3 / n,
        "scored_cold": cold.scored, "items": cold.items, "rejudged_per_warm_call": cold.items - cold.scored,
    }
    figures["own_over_rpc_cold"] = figures["own_overhead_ms_per_group_p50"] / figures["rpc_ms_per_group_cold_judge"]
    figures["own_over_rpc_cached"] = figures["own_overhead_ms_per_group_p50"] / figures["rpc_ms_per_group_cached_p50"]
    figures["serialisation_over_rpc_cold"] = ((figures["serialise_request_ms_per_group"]
                                               + figures["deserialise_response_ms_per_group"])
                                              / figures["rpc_ms_per_group_cold_judge"])
    path = write_result("reward_fn_overhead", figures)
    print_table(f"GRPO reward function overhead per group ({n} groups x G={args.group_size}) -> {path}", [
        ("own overhead ms/group (p50, cached calls)", own_ms, "grouping, requests, results, Eq.5-7, metrics"),
        ("serialise request ms/group", figures["serialise_request_ms_per_group"], "client side, protobuf"),
        ("deserialise response ms/group", figures["deserialise_response_ms_per_group"], "client side"),
        ("reweight us/group", figures["reweight_us_per_group"], "Eq.5-7 alone"),
        ("RPC ms/group, cold (judge runs)", figures["rpc_ms_per_group_cold_judge"], ""),
        ("RPC ms/group, cached (floor)", figures["rpc_ms_per_group_cached_p50"],
         "transport + core + similarity" if cold.items == cold.scored
         else f"not a floor: {cold.items - cold.scored} of {cold.items} candidates not ok cold, judged again"),
        ("own / RPC cold", f"{figures['own_over_rpc_cold']:.2e}", "goal: << 1"),
        ("own / RPC cached", f"{figures['own_over_rpc_cached']:.2e}", ""),
    ])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
