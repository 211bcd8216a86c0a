"""Wait for a server started in the background by a GPU script to answer its readiness URL, failing fast when the
server process has exited (the log's tail printed) instead of waiting out the whole budget.

    python3 tools/gpu/wait_ready.py URL PID LOG [BUDGET_S]

or ``from wait_ready import wait_ready`` with ``tools/gpu`` on ``sys.path``. Exit status / ``SystemExit`` on failure.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

from compeer_loop.procs import alive  # the repository root is on PYTHONPATH in the GPU scripts


def tail(path: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``path`` ("" when it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_ready(url: str, pid: int, log: str, budget_s: float = 300.0, poll_s: float = 1.0) -> float:
    """Poll ``url`` until it answers 200; return the seconds waited. Raise ``SystemExit`` with the log's tail when
    process ``pid`` exits first or ``budget_s`` passes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < budget_s:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    waited = time.monotonic() - t0
                    print(f"ready after {waited:.0f} s", flush=True)
                    return waited
        except (urllib.error.URLError, OSError):
            pass
        if not alive(pid):
            raise SystemExit(f"the server (pid {pid}) exited after {time.monotonic() - t0:.0f} s before it was "
                             f"ready; {log}, last lines:\n{tail(log)}")
        time.sleep(poll_s)
    raise SystemExit(f"the server (pid {pid}) not ready after {budget_s:.0f} s; {log}, last lines:\n{tail(log)}")


if __name__ == "__main__":
    wait_ready(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 300.0)
