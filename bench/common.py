"""Helpers shared by the benchmarks: result files, tables, percentiles, process-tree memory and CPU time, the
machine."""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def write_result(name: str, figures: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with the figures plus the machine they were measured on."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}, **figures}
    out.write_text(json.dumps(payload, indent=2))
    return out


def machine_description() -> dict[str, Any]:
    """What the CPU is and how busy the machine is: model name, the flags that decide CPU kernels (AVX-512, its
    bfloat16 and VNNI extensions, AMX), memory, and the load averages now (Linux /proc; empty fields elsewhere)."""
    model, flags = "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    mem_kb = 0
    try:
        mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {"cpu_model": model, "cpus": os.cpu_count(), "cpu_flags": {f: f in flags for f in wanted},
            "mem_gib": round(mem_kb / (1 << 20), 1), "load_avg_1_5_15": list(os.getloadavg())}


def print_table(title: str, rows: list[tuple[str, Any, str]]) -> None:
    """Rows of (figure, value, goal or note)."""
    print(f"\n{title}")
    w = max(len(r[0]) for r in rows)
    for name, value, goal in rows:
        v = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"  {name:<{w}}  {v:>12}  {goal}")


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def tree_peak_rss_mb(pid: int) -> float:
    """Sum of VmHWM (peak resident set) over a process and its descendants (Linux /proc)."""
    return tree_memory_mb(pid, "VmHWM")


def tree_pids(pid: int) -> list[int]:
    """A process and its descendants, alive now (Linux /proc; the process first)."""
    def children(p: int) -> list[int]:
        try:
            out = []
            for task in Path(f"/proc/{p}/task").iterdir():
                txt = (task / "children").read_text().split()
                out += [int(x) for x in txt]
            return out
        except OSError:
            return []

    found: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        if p in found:
            continue
        found.append(p)
        stack += children(p)
    return found


def tree_memory_mb(pid: int, field: str = "VmRSS") -> float:
    """Sum of a /proc status memory ``field`` (VmRSS: resident now, VmHWM: peak) over a process and its
    descendants (Linux /proc)."""
    total_kb = 0
    for p in tree_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process and its live descendants have used so far (Linux /proc). The
    difference over a phase is the work the phase cost, whatever else shares the cores (wall time is not)."""
    total = 0
    for p in tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def http_ready(url: str) -> bool:
    """``GET <url>/readyz`` answers 200."""
    import httpx

    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
