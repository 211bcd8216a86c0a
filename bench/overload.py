"""Latency and memory of the real reward server under 4x overload, load shedding on vs off, side by side in one run.

    python -m bench.overload [--backend vllm] [--in-flight 4] [--waiting 4] [--overload 4] [--duration-s 60]

For each setting a fresh server process is started (same engine, cache off so every group is judged): first a
calibration measures its capacity (groups/s with ``--in-flight`` groups at a time), then one-candidate groups
arrive open-loop at ``--overload`` times that rate for ``--duration-s`` seconds, each with the deadline a trainer
would give (``--deadline-s``). Shedding on: ``--max-waiting-groups N``; off: ``-1`` (every request queues).
Reported per setting: answers by outcome, p50/p99 latency of judged groups and of all answers, goodput, and the
server's resident memory (peak and at the end). Writes bench/results/overload.json.
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

from bench.common import free_port, http_ready, percentile, print_table, tree_memory_mb, tree_peak_rss_mb, write_result

EXAMPLE_HISTORY = [{"role": "seeker", "text": "I failed my driving test again."},
                   {"role": "supporter", "text": "I'm sorry. What happened?"},
                   {"role": "seeker", "text": "I panicked at the roundabout."}]


def candidate(i: int) -> str:
    return ("<analysis>The seeker failed a test again; exploration.</analysis><emotion>negative; shame; 4</emotion>"
            "<strategy>Reflection of Feelings: name the shame.</strategy>"
            f"<response>That sounds so discouraging (take {i}).</response>")


def group(i: int, deadline_s: float) -> dict[str, Any]:
    return {"history": EXAMPLE_HISTORY, "reference": "That must be frustrating.", "candidates": [candidate(i)],
            "options": {"timeout_ms": int(deadline_s * 1000), "include_similarity": False}}


def start_server(backend: str, in_flight: int, waiting: int,
                 extra: list[str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """The server on ``backend`` with the given admission limits, no cache and no embeddings; (process, HTTP URL)."""
    return launch(["--backend", backend, "--cache", "off", "--embedding-model", "off", "--max-in-flight-groups",
                   str(in_flight), "--max-waiting-groups", str(waiting), *(extra or [])])


def launch(server_args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """``compeer-reward serve`` on free local ports with ``server_args``, waited for (600 s); (process, HTTP URL)."""
    http_port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "reward_server.cli", "serve", "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
           "--http-port", str(http_port), "--log-level", "WARNING", *server_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} during start-up: {' '.join(cmd)}")
        if http_ready(url):
            return proc, url
        time.sleep(1.0)
    stop(proc)
    raise RuntimeError("server not ready within 600 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def outcome(r: httpx.Response) -> str:
    if r.status_code == 200:
        return str(r.json()["results"][0]["status"])
    return {429: "shed (429)", 504: "deadline (504)"}.get(r.status_code, f"http {r.status_code}")


async def calibrate(url: str, in_flight: int, n: int, deadline_s: float, base: int) -> float:
    """Groups per second the server judges with ``in_flight`` groups at a time (closed loop)."""
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s + 30) as http:
        await http.post("/v1/score", json=group(base - 1, deadline_s))  # warm-up
        todo = list(range(base, base + n))

        async def worker() -> None:
            while todo:
                r = await http.post("/v1/score", json=group(todo.pop(), deadline_s))
                assert r.status_code == 200, r.text

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return n / (time.perf_counter() - t0)


async def overload(url: str, pid: int, rate: float, duration_s: float, deadline_s: float,
                   base: int) -> dict[str, Any]:
    """Open-loop arrivals at ``rate`` groups/s for ``duration_s``; every answer is waited for."""
    latencies: dict[str, list[float]] = {}
    rss: list[float] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s + 30, limits=limits) as http:
        async def one(i: int) -> None:
            t = time.perf_counter()
            try:
                kind = outcome(await http.post("/v1/score", json=group(base + i, deadline_s)))
            except httpx.HTTPError as exc:
                kind = f"client {type(exc).__name__}"
            latencies.setdefault(kind, []).append(time.perf_counter() - t)

        async def sample() -> None:
            while True:
                rss.append(tree_memory_mb(pid))
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample())
        tasks = []
        t0 = time.perf_counter()
        n = int(rate * duration_s)
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        sampler.cancel()
    judged = latencies.get("ok", [])
    every = [x for v in latencies.values() for x in v]
    return {"requests": n, "outcomes": {k: len(v) for k, v in sorted(latencies.items())},
            "judged_p50_s": percentile(judged, 50), "judged_p99_s": percentile(judged, 99),
            "all_p50_s": percentile(every, 50), "all_p99_s": percentile(every, 99),
            "goodput_groups_per_s": len(judged) / wall, "wall_s": wall,
            "rss_peak_mb": max(rss) if rss else float("nan"), "rss_end_mb": rss[-1] if rss else float("nan"),
            "rss_hwm_mb": tree_peak_rss_mb(pid)}


async def measure(args: argparse.Namespace, waiting: int, base: int) -> dict[str, Any]:
    proc, url = start_server(args.backend, args.in_flight, waiting)
    try:
        capacity = await calibrate(url, args.in_flight, args.calibration_groups, args.deadline_s, base)
        figures = await overload(url, proc.pid, capacity * args.overload, args.duration_s, args.deadline_s,
                                 base + 10_000)
        return {"max_waiting_groups": waiting, "capacity_groups_per_s": capacity,
                "offered_groups_per_s": capacity * args.overload, **figures}
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    ap.add_argument("--in-flight", type=int, default=4, help="--max-in-flight-groups of both servers")
    ap.add_argument("--waiting", type=int, default=4, help="--max-waiting-groups with shedding on")
    ap.add_argument("--overload", type=float, default=4.0, help="offered load / measured capacity")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--deadline-s", type=float, default=30.0, help="each request's options.timeout_ms")
    ap.add_argument("--calibration-groups", type=int, default=16)
    args = ap.parse_args(argv)
    on = asyncio.run(measure(args, args.waiting, 0))
    off = asyncio.run(measure(args, -1, 100_000))
    rows: list[tuple[str, Any, str]] = []
    for label, r in (("shedding on", on), ("shedding off", off)):
        rows += [(f"{label}: capacity (groups/s)", r["capacity_groups_per_s"], "calibrated, closed loop"),
                 (f"{label}: offered (groups/s)", r["offered_groups_per_s"], f"{args.overload:g}x capacity"),
                 (f"{label}: outcomes", r["outcomes"], f"of {r['requests']} requests"),
                 (f"{label}: judged p50 / p99 (s)", f"{r['judged_p50_s']:.2f} / {r['judged_p99_s']:.2f}", ""),
                 (f"{label}: all answers p50 / p99 (s)", f"{r['all_p50_s']:.2f} / {r['all_p99_s']:.2f}", ""),
                 (f"{label}: goodput (groups/s)", r["goodput_groups_per_s"], "judged ok per second"),
                 (f"{label}: RSS peak / end (MB)", f"{r['rss_peak_mb']:.0f} / {r['rss_end_mb']:.0f}",
                  "server process tree")]
    ratio = {"judged_p99_off_over_on": off["judged_p99_s"] / on["judged_p99_s"] if on["judged_p99_s"] else None,
             "goodput_on_over_off": (on["goodput_groups_per_s"] / off["goodput_groups_per_s"]
                                     if off["goodput_groups_per_s"] else None),
             "rss_peak_off_over_on": off["rss_peak_mb"] / on["rss_peak_mb"]}
    rows += [(k, v if v is not None else "n/a", "") for k, v in ratio.items()]
    print_table(f"Overload ({args.overload:g}x, {args.backend}, {args.in_flight} in flight): shedding on vs off", rows)
    write_result("overload", {"args": vars(args), "shedding_on": on, "shedding_off": off, "ratios": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
