"""Processes and files the loop's driver watches: the processes it started or adopted (:class:`Job`), whether a
process lives, whether it died out of GPU memory, the sha256 of the warm-up adapter every GRPO arm starts from,
whether a reward server is ready, and stopping the reward servers a loop started."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compeer_loop.plan import JudgeServer

log = logging.getLogger(__name__)


def file_sha256(path: Path) -> str | None:
    """The sha256 of a file (None when it is missing)."""
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def out_of_gpu_memory(log_file: Path) -> bool:
    """Whether a process's log ends with a CUDA out-of-memory error (its last 16 KB)."""
    if not log_file.is_file():
        return False
    with log_file.open("rb") as fh:
        fh.seek(max(0, log_file.stat().st_size - 16384))
        tail = fh.read().decode("utf-8", "replace")
    return "torch.OutOfMemoryError" in tail or "CUDA out of memory" in tail


@dataclass
class Job:
    """A process the driver started or adopted (arm, warm-up or evaluation)."""

    name: str
    pid: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.time)

    def poll(self) -> int | None:
        """The exit code, or None while it runs (an adopted process reports -1 when gone: its files decide)."""
        if self.proc is not None:
            return self.proc.poll()
        return None if alive(self.pid) else -1


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs. A zombie (exited, not reaped) counts as gone, and is reaped when it is
    our child; shared by the loop's driver and ``tools/gpu/wait_ready.py``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: ask /proc
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def ready(server: JudgeServer, timeout_s: float = 2.0) -> bool:
    """Whether the server answers ``GET /readyz`` with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/readyz", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop_servers(root: Path, wait_s: float = 30.0) -> None:
    """SIGTERM the reward servers this loop started (pids in ``ROOT/servers``) and wait until they are gone (SIGKILL
    after ``wait_s``), so that a finished driver leaves no server shutting down (and holding GPU memory) behind."""
    stopping = []
    for pid_file in sorted((root / "servers").glob("*.pid")):
        pid = int(pid_file.read_text().strip() or 0)
        if pid > 0 and alive(pid):
            os.kill(pid, signal.SIGTERM)
            stopping.append((pid_file.stem, pid))
    deadline = time.time() + wait_s
    for name, pid in stopping:
        while alive(pid) and time.time() < deadline:
            time.sleep(0.2)
        if alive(pid):
            log.warning("%s (pid %d) still running %.0f s after SIGTERM: SIGKILL", name, pid, wait_s)
            os.kill(pid, signal.SIGKILL)
        log.info("stopped %s (pid %d)", name, pid)
