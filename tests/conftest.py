"""Test-wide settings: one torch thread (2 threads ran 10x slower under load here) and no hub access."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from bench.common import free_port  # one definition for tests and benchmarks


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: the machine's on 127.0.0.1:6379 when it answers, else a redis-server started here."""
    if _redis_ping(6379):
        yield "redis://127.0.0.1:6379/15"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("no Redis answers on 127.0.0.1:6379 and redis-server is not installed "
                    "(apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not _redis_ping(port):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"redis-server did not start on port {port}")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
