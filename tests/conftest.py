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


#: test modules that share a session-wide real process, by the fixture that starts it: under pytest-xdist they run on
#: one worker, so that the process starts once (checked at collection: a test using one of these fixtures from a
#: module not listed here is an error, not a second server start)
SHARED_PROCESS_MODULES: dict[str, tuple[str, ...]] = {
    "reward_server": ("tests/integration/test_reward_server.py", "tests/integration/test_grpo.py"),
    "images": ("tests/deploy/test_compose_failover.py",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the collection when a test uses a shared-process fixture from a module :data:`SHARED_PROCESS_MODULES`
    does not list (it would start that process again on another worker)."""
    for item in items:
        path = item.nodeid.split("::")[0]
        for fixture, modules in SHARED_PROCESS_MODULES.items():
            if fixture in getattr(item, "fixturenames", ()) and path not in modules:
                raise pytest.UsageError(f"{path} uses the `{fixture}` fixture: add it to SHARED_PROCESS_MODULES "
                                        f"in tests/conftest.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown (and unused) where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` (``make test``), plus the groups of :data:`SHARED_PROCESS_MODULES`: each test module runs
    whole on one worker (its module fixtures set up once), and the modules of one group on the same worker. (xdist's
    own ``--dist loadgroup`` cannot do it under pytest 9: it renames node ids through an attribute pytest 9 no
    longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    group_of = {module: group for group, modules in SHARED_PROCESS_MODULES.items() for module in modules}

    class SharedProcessScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return group_of.get(path, path)

    return SharedProcessScheduling(config, log)  # type: ignore[arg-type]


def _worker_index() -> int:
    """This pytest-xdist worker's index (``gw3`` -> 3), 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: the machine's on 127.0.0.1:6379 when it answers (database 15 less the xdist worker's index, so
    that workers never flush each other's keys), else a redis-server started here."""
    if _redis_ping(6379):
        yield f"redis://127.0.0.1:6379/{15 - _worker_index() % 15}"
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
