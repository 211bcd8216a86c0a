"""deploy/compose/compose.yaml run for real: Redis, two reward replicas, a GRPO smoke trainer pointed at both.

One scenario, in order: both replicas start from the image (cold start to ready measured); a group scored on
replica A is a cache hit on replica B; the trainer starts (4 steps, both replicas round-robin); after its first
step, with a fresh group in flight on A, A is SIGKILLed. Checked: the in-flight group is answered (by B, after the
client's retry) with every item either judged or explicitly unscored, and each judged total is the one B's cache
holds (a replica's judgment, not one made up); the trainer finishes all its steps with no failed reward call and
every unscored item counted with a reason. Figures go to ``bench/results/deploy_compose.json``.

Memory: the replicas use the transformers engine (~1.5 GB each; vLLM-CPU needs ~5.7 GB each), the trainer ~3 GB.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from reward_server.client import RewardClient
from reward_server.http.convert import group_from_json
from reward_server.types import GroupResponse, Status
from tests.deploy.conftest import ROOT, Images, compose_command

pytestmark = [pytest.mark.deploy, pytest.mark.slow]
COMPOSE_FILE = ROOT / "deploy" / "compose" / "compose.yaml"
EXAMPLE = json.loads((ROOT / "examples" / "group.json").read_text())
READY_TIMEOUT_S = 600
TRAINER_TIMEOUT_S = 1500
SMOKE_STEPS = 4
REPORT = ROOT / "bench" / "results" / "deploy_compose.json"


@dataclass
class Stack:
    """A running compose project: its CLI, environment, and the replicas' published addresses."""

    compose: list[str]
    env: dict[str, str]
    grpc: dict[str, str] = field(default_factory=dict)
    http: dict[str, str] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*self.compose, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                             check=False)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def running(self, service: str) -> bool:
        cid = self.container(service)
        state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", cid], capture_output=True, text=True,
                               check=False).stdout.strip() if cid else ""
        return state == "true"

    def port(self, service: str, port: int) -> str:
        host_port = self.run("port", service, str(port)).stdout.strip().rsplit(":", 1)[-1]
        return f"127.0.0.1:{host_port}"

    def logs(self, *services: str) -> str:
        return self.run("logs", "--no-color", "--tail", "60", *services, check=False).stdout


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def _wait_ready(stack: Stack, service: str, deadline: float) -> None:
    http = stack.http[service]
    while time.monotonic() < deadline:
        assert stack.running(service), f"{service} exited before it was ready:\n{stack.logs(service)}"
        try:
            if httpx.get(f"http://{http}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{service} not ready in time:\n{stack.logs(service)}")


@pytest.fixture(scope="module")
def stack(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    compose = compose_command()
    assert compose is not None
    out_dir = tmp_path_factory.mktemp("compose-runs")
    out_dir.chmod(0o777)  # the trainer runs as uid 10001
    env = {**os.environ, "COMPEER_IMAGE": images.reward, "COMPEER_TRAINER_IMAGE": images.trainer,
           "REDIS_IMAGE": images.redis, "COMPEER_BACKEND": "transformers", "REWARD_MEM_LIMIT": "3g",
           "SMOKE_STEPS": str(SMOKE_STEPS), "SMOKE_OUT": str(out_dir)}
    s = Stack([*compose, "-f", str(COMPOSE_FILE), "-p", f"compeer-test-{os.getpid()}", "--profile", "smoke"], env)
    s.figures["image_build_s"] = images.build_s
    try:
        t0 = time.monotonic()
        s.run("up", "-d", "redis", "reward-a", "reward-b", timeout=300)
        for name in ("reward-a", "reward-b"):
            s.grpc[name], s.http[name] = s.port(name, 50051), s.port(name, 8000)
        for name in ("reward-a", "reward-b"):
            _wait_ready(s, name, t0 + READY_TIMEOUT_S)
            s.figures[f"cold_start_to_ready_s_{name}"] = time.monotonic() - t0
        s.env["SMOKE_OUT_HOST"] = str(out_dir)
        yield s
    except BaseException:
        print(s.logs())
        raise
    finally:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(json.dumps(s.figures, indent=2) + "\n")
        s.run("down", "-v", "--remove-orphans", "--timeout", "10", timeout=300, check=False)


def _fresh_group(tag: str) -> dict[str, object]:
    """The example group with candidates no earlier run has judged (nothing of it can be in the cache)."""
    body = json.loads(json.dumps(EXAMPLE))
    body["candidates"] = [c.replace("</response>", f" ({tag})</response>") for c in body["candidates"][:2]]
    return body


async def _score(addresses: list[str], body: dict[str, object]) -> GroupResponse:
    async with RewardClient(addresses, timeout_s=300) as client:
        return await client.score_group(group_from_json(body))


def test_a_group_scored_on_replica_a_is_a_cache_hit_on_replica_b(stack: Stack) -> None:
    body = _fresh_group(f"cache-{time.time_ns()}")
    on_a = asyncio.run(_score([stack.grpc["reward-a"]], body))
    on_b = asyncio.run(_score([stack.grpc["reward-b"]], body))
    assert [r.cache_hit for r in on_a.results] == [False, False]
    ok = [i for i, r in enumerate(on_a.results) if r.status is Status.OK]
    assert ok, f"replica A judged nothing ok: {[r.status for r in on_a.results]}"
    for i in ok:
        assert on_b.results[i].cache_hit, f"candidate {i} judged on A was not a cache hit on B"
        assert on_b.results[i].rewards.total == on_a.results[i].rewards.total
    assert on_b.meta.cache_hits == len(ok)


def _metrics_rows(out: Path) -> list[dict[str, float]]:
    path = out / "smoke" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _kill_a_mid_call(stack: Stack, out: Path, body: dict[str, object]) -> tuple[GroupResponse, float, float]:
    """Wait for the trainer's first step, put ``body`` in flight on A, SIGKILL A; the probe's answer, the seconds
    from the kill to it, and the server-side part of them."""
    deadline = time.monotonic() + TRAINER_TIMEOUT_S
    while not _metrics_rows(out):
        assert time.monotonic() < deadline, "the trainer logged no step in time:\n" + stack.logs("trainer")
        assert stack.running("trainer"), "the trainer stopped before its first step:\n" + stack.logs("trainer")
        await asyncio.sleep(1)
    client = RewardClient([stack.grpc["reward-a"], stack.grpc["reward-b"]], timeout_s=300)  # first call: A
    probe = asyncio.create_task(client.score_group(group_from_json(body)))
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            text = (await http.get(f"http://{stack.http['reward-a']}/metrics")).text
            if _metric(text, "compeer_in_flight_requests") >= 1 and time.monotonic() - started > 0.5:
                break
            assert not probe.done(), "the probe finished before A was killed: nothing was in flight"
            await asyncio.sleep(0.05)
    container_a = stack.container("reward-a")
    t_kill = time.monotonic()
    kill = await asyncio.create_subprocess_exec("docker", "kill", "--signal", "KILL", container_a,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert await kill.wait() == 0, "docker kill failed"
    assert not probe.done(), "the probe was answered before the kill"
    response = await probe
    failover_s = time.monotonic() - t_kill
    await client.close()
    return response, failover_s, (response.meta.queue_ms + response.meta.inference_ms) / 1000


def test_replica_killed_mid_run_trainer_finishes_nothing_lost_or_made_up(stack: Stack) -> None:
    out = Path(stack.env["SMOKE_OUT_HOST"])
    stack.run("up", "-d", "--no-deps", "trainer", timeout=300)
    body = _fresh_group(f"kill-{time.time_ns()}")
    response, failover_s, server_s = asyncio.run(_kill_a_mid_call(stack, out, body))
    stack.figures.update(failover_answer_s=failover_s, failover_server_side_s=server_s,
                         failover_detect_and_retry_s=failover_s - server_s)

    # The group in flight on A was answered by B: each item judged, or unscored with its status; never a total
    # without "ok". Each judged total is what B's shared cache holds for it: a replica's judgment, not made up.
    results = response.results
    assert len(results) == 2
    for r in results:
        assert r.status in (Status.OK, Status.PARSE_FAILED, Status.TIMEOUT), r.status
        assert (r.rewards.total is not None) == (r.status is Status.OK)
    again = asyncio.run(_score([stack.grpc["reward-b"]], body))
    for first, second in zip(results, again.results):
        if first.status is Status.OK:
            assert second.cache_hit and second.rewards.total == first.rewards.total

    # The trainer finishes every step on the surviving replica: no failed call, every unscored item counted.
    container = stack.container("trainer") or ""
    wait = subprocess.run(["docker", "wait", container], capture_output=True, text=True, timeout=TRAINER_TIMEOUT_S,
                          check=False) if container else None
    trainer_log = stack.logs("trainer")
    assert wait is not None and wait.stdout.strip() == "0", f"trainer exit {wait and wait.stdout}:\n{trainer_log}"
    rows = _metrics_rows(out)
    assert [r["step"] for r in rows] == list(range(1, SMOKE_STEPS + 1)), trainer_log
    lost = 0.0
    for row in rows:
        assert row["compeer/reward_call_failures"] == 0.0, row
        counted = row["compeer/parse_failure_rate"] + row["compeer/timeout_rate"] + row["compeer/engine_error_rate"]
        lost += row["compeer/unscored_rate"] - counted
        assert abs(row["compeer/unscored_rate"] - counted) < 1e-9, f"unscored items without a reason: {row}"
    assert any(r.get("compeer/reward_raw_mean") is not None for r in rows), "the judge scored nothing"
    assert "reward call failed" not in trainer_log
    assert (out / "smoke" / "final" / "adapter_model.safetensors").exists()
    stack.figures.update(trainer_steps=len(rows), rewards_lost=lost,
                         unscored_counted=sum(r["compeer/unscored_rate"] for r in rows))

