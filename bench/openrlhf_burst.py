"""OpenRLHF's rollout burst against the real reward server on its defaults: every sample of a rollout posted at once.

    python -m bench.openrlhf_burst [--prompts 128] [--samples 8] [--server-arg=--backend=transformers ...]

Since openrlhf 0.9.1 each rollout sample is its own ``POST /get_reward`` with one query, so a rollout of P prompts x
N samples is P x N concurrent calls. This starts the server with its default settings (``--server-arg`` adds flags),
then posts them all at once as OpenRLHF's client does (a new aiohttp session per call, 180 s total timeout), distinct
responses so the cache does not answer. Each call is tried once: the figures are the first answers (OpenRLHF would
retry a failure up to 4 more times, 1 s apart). Reported: answers by outcome (200, 429 shed, 504 deadline, other,
client timeout, connection error), latency p50/p99 per outcome, and the time until the last answer. The goal of
issue 24: every call answered or shed with 429, none left to the client's timeout. Writes
bench/results/openrlhf_burst.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter, defaultdict
from typing import Any

import aiohttp

from bench.common import percentile, print_table, write_result
from bench.overload import candidate, launch, stop

SYSTEM = "<|im_start|>system\nYou are an emotional-support assistant.<|im_end|>\n"
CLIENT_TIMEOUT_S = 180.0  # openrlhf/utils/agent.py: aiohttp.ClientTimeout(total=180)


def prompt(p: int) -> str:
    return (SYSTEM + f"<|im_start|>user\nI failed my driving test again (attempt {p}).<|im_end|>\n"
            "<|im_start|>assistant\nI'm sorry. What happened?<|im_end|>\n"
            "<|im_start|>user\nI panicked at the roundabout.<|im_end|>\n<|im_start|>assistant\n")


async def one_call(url: str, p: int, s: int) -> tuple[str, float]:
    """One sample as OpenRLHF posts it; (outcome, seconds)."""
    t0 = time.perf_counter()
    body = {"query": [prompt(p) + candidate(p * 1000 + s) + "<|im_end|>"], "prompts": [prompt(p)],
            "labels": ["That must be frustrating."]}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as session, \
                session.post(url + "/get_reward", json=body) as r:
            await r.read()
            kind = {200: "ok (200)", 429: "shed (429)", 504: "deadline (504)"}.get(r.status, f"http {r.status}")
    except TimeoutError:
        kind = "client timeout"
    except aiohttp.ClientError as exc:
        kind = f"connection error ({type(exc).__name__})"
    return kind, time.perf_counter() - t0


async def burst(url: str, prompts: int, samples: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    answers = await asyncio.gather(*(one_call(url, p, s) for p in range(prompts) for s in range(samples)))
    by: dict[str, list[float]] = defaultdict(list)
    for kind, secs in answers:
        by[kind].append(secs)
    return {"calls": len(answers), "outcomes": dict(Counter(k for k, _ in answers)),
            "latency_s": {k: {"p50": percentile(v, 50), "p99": percentile(v, 99)} for k, v in by.items()},
            "last_answer_s": time.perf_counter() - t0,
            "goal_met": all(k in ("ok (200)", "shed (429)", "deadline (504)") for k in by)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=128, help="rollout batch size (OpenRLHF --rollout.batch_size)")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt (--rollout.n_samples_per_prompt)")
    ap.add_argument("--server-arg", action="append", default=[], help="a flag for the server, e.g. "
                                                                      "--server-arg=--backend=transformers")
    args = ap.parse_args(argv)
    proc, url = launch(args.server_arg)
    try:
        figures = asyncio.run(burst(url, args.prompts, args.samples))
    finally:
        stop(proc)
    figures.update(prompts=args.prompts, samples=args.samples, server_args=args.server_arg,
                   client_timeout_s=CLIENT_TIMEOUT_S)
    path = write_result("openrlhf_burst", figures)
    rows = [(k, n, f"p50 {figures['latency_s'][k]['p50']:.1f} s, p99 {figures['latency_s'][k]['p99']:.1f} s")
            for k, n in sorted(figures["outcomes"].items())]
    rows.append(("last answer after", f"{figures['last_answer_s']:.1f} s", "goal met" if figures["goal_met"]
                 else "goal missed: some calls were left to the client"))
    print_table(f"OpenRLHF burst: {args.prompts} x {args.samples} one-query calls at once", rows)
    print(f"written to {path}")
    return 0 if figures["goal_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
