"""``make bench``: run every benchmark, one after another (each starts what it measures), and list the files.

    python -m bench.run [NAME ...]     # default: all; names: judge_throughput, reward_fn_overhead, data_builder_ingest, eval_throughput
"""

from __future__ import annotations

import importlib
import sys
import time

BENCHMARKS = ("judge_throughput", "reward_fn_overhead", "data_builder_ingest", "eval_throughput")


def main(argv: list[str] | None = None) -> int:
    names = (sys.argv[1:] if argv is None else argv) or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    failed, took = [], {}
    start = time.perf_counter()
    for name in names:
        print(f"\n=== bench.{name} ===", flush=True)
        t = time.perf_counter()
        code = importlib.import_module(f"bench.{name}").main([])
        took[name] = time.perf_counter() - t
        if code:
            failed.append(name)
    print("\nwall time: " + ", ".join(f"{n} {s / 60:.1f} min" for n, s in took.items())
          + f"; total {(time.perf_counter() - start) / 60:.1f} min")
    print(f"results in bench/results/; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
