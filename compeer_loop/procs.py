"""Processes and files the loop's driver watches: whether a process lives, whether it died out of GPU memory, and
the sha256 of the warm-up adapter every GRPO arm starts from."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


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
