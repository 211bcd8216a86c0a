"""Fault soak of the reward service: two real server processes sharing one Redis, several concurrent trainer
clients sending ScoreBatch for a fixed set of groups, while Redis is killed and restarted and one replica is
SIGKILLed and restarted. Checked at the end (``SoakReport.problems``): every item is either scored, and equal to
what an undisturbed run scores with greedy judging, or explicitly unscored with a counted reason; no call outlived
its deadline; every cache entry written during the run decodes; the server logs carry no dialogue text.

Deadlines follow the machine: before the faults, one undisturbed call (``batch`` groups, one replica, empty cache) is
timed, and each call's deadline is the larger of ``--deadline-s`` and :data:`DEADLINE_PER_CALIBRATED_CALL` times that
call's time and the clients per replica, so that a loaded machine (a CI worker beside another) stretches the soak
instead of timing every call out; the report carries both figures.

    python -m bench.soak [--backend transformers] [--duration-s 240] [--clients 4] [--groups 8]

The integration test ``tests/integration/test_soak.py`` runs the same soak, shortened. Writes
bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import free_port, http_ready, print_table, write_result
from reward_server.client import RewardCallError, RewardClient
from reward_server.http.convert import group_from_json
from reward_server.types import ErrorInfo, GroupRequest, GroupResponse, Status

#: a call's deadline, at least, in undisturbed calls per client on one replica (see the module's docstring)
DEADLINE_PER_CALIBRATED_CALL = 4.0
EXAMPLE = json.loads((Path(__file__).parents[1] / "examples" / "group.json").read_text())


def soak_groups(n: int, mode: str = "unified") -> list[GroupRequest]:
    """``n`` distinct groups of two candidates each, derived from ``examples/group.json`` (greedy judging)."""
    groups = []
    for i in range(n):
        a, b = EXAMPLE["candidates"][i % 3], EXAMPLE["candidates"][(i + 1) % 4]
        body = dict(EXAMPLE, candidates=[a.replace("</response>", f" ({i})</response>"), b],
                    options={"mode": mode, "include_similarity": False})
        groups.append(group_from_json(body))
    return groups


def dialogue_snippets(groups: list[GroupRequest]) -> list[str]:
    """Pieces of dialogue text that must never appear in a log above DEBUG."""
    g = groups[0]
    return [t.text[:40] for t in g.history] + [c[60:100] for gr in groups for c in gr.candidates]


class Process:
    """A child process (not a daemon: it dies with the soak) with its log file."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd, self.log = cmd, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def terminate(self, wait_s: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def _redis_up(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def wait_for(pred: Any, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{what} not ready within {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - t0


@dataclass
class Replica:
    process: Process
    grpc: str
    http: str


@dataclass
class SoakReport:
    """What the soak measured; ``problems`` is empty when every check passed."""

    calls: int = 0
    items: int = 0
    scored: int = 0
    unscored: Counter[str] = field(default_factory=Counter)
    faults: list[str] = field(default_factory=list)
    max_call_over_deadline_s: float = 0.0
    mismatches: int = 0
    cache_entries_checked: int = 0
    cache_entries_bad: int = 0
    log_leaks: int = 0
    restart_s: float = 0.0
    reference_s: float = 0.0
    calibration_s: float = 0.0  # the undisturbed call timed before the faults
    deadline_s: float = 0.0  # each call's deadline, as used (see the module's docstring)
    clients_scored_after_restart: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Items neither scored nor explicitly unscored with a reason (must be 0)."""
        return self.items - self.scored - sum(self.unscored.values())

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "items": self.items, "scored": self.scored, "unscored": dict(self.unscored),
                "lost": self.lost, "faults": self.faults, "mismatches": self.mismatches,
                "max_call_over_deadline_s": self.max_call_over_deadline_s,
                "cache_entries_checked": self.cache_entries_checked, "cache_entries_bad": self.cache_entries_bad,
                "log_leaks": self.log_leaks, "replica_restart_s": self.restart_s,
                "reference_run_s": self.reference_s, "calibration_call_s": self.calibration_s,
                "deadline_s": self.deadline_s,
                "clients_scored_after_restart": self.clients_scored_after_restart, "problems": self.problems}


def _intact(raw: bytes | str | None) -> bool:
    """A cache entry decodes to a whole judgment record: verdicts, judged components and judge texts (one text per
    round: four in unified mode, one in single-pass for all four components)."""
    try:
        rec = json.loads(raw or b"")
    except ValueError:
        return False
    return (isinstance(rec, dict) and {"verdicts", "judged", "texts"} <= rec.keys()
            and all(v is None or isinstance(v, bool | str) for v in rec["verdicts"].values())
            and set(rec["judged"]) <= rec["verdicts"].keys() and all(isinstance(t, str) for t in rec["texts"])
            and (len(rec["texts"]) > 0) == (len(rec["judged"]) > 0))


def _fingerprint(r: Any) -> tuple[Any, ...]:
    """What must match an undisturbed greedy run: status, verdicts and rewards."""
    return (r.status, tuple(s.verdict for s in r.steps), r.preference.verdict if r.preference else None,
            r.rewards.total)


class Soak:
    def __init__(self, workdir: Path, backend: str, deadline_s: float) -> None:
        self.workdir, self.backend, self.deadline_s = workdir, backend, deadline_s
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.redis = Process([binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], workdir / "redis.log")
        self.replicas = [self._replica(i) for i in range(2)]
        # (group, candidate) -> the distinct results it was scored with during the soak
        self.seen: dict[tuple[int, str], set[tuple[Any, ...]]] = {}
        self.restarted_at: float | None = None  # monotonic time the killed replica was ready again
        self.scored_after_restart: set[int] = set()  # clients with a call sent after that time and scored

    def _replica(self, i: int) -> Replica:
        g, h = free_port(), free_port()
        cmd = [sys.executable, "-m", "reward_server.cli", "serve", "--backend", self.backend, "--model", "default",
               "--host", "127.0.0.1", "--grpc-port", str(g), "--http-port", str(h), "--redis-url", self.redis_url,
               "--embedding-model", "off", "--max-model-len", "4096", "--log-level", "INFO"]
        return Replica(Process(cmd, self.workdir / f"replica{i}.log"), f"127.0.0.1:{g}", f"http://127.0.0.1:{h}")

    def start(self, start_timeout_s: float) -> None:
        self.redis.start()
        wait_for(lambda: _redis_up(self.redis_port), 20, "redis")
        for r in self.replicas:
            r.process.start()
        for r in self.replicas:
            wait_for(lambda r=r: http_ready(r.http), start_timeout_s, f"replica {r.http}")

    def stop(self) -> list[int | None]:
        codes = [r.process.terminate() for r in self.replicas]
        self.redis.kill()
        return codes

    async def client_loop(self, groups: list[GroupRequest], stop: asyncio.Event, report: SoakReport,
                          batch: int, client_id: int) -> None:
        """One trainer: ScoreBatch over the fixed set, ``batch`` groups per call, until ``stop``."""
        async with RewardClient([r.grpc for r in self.replicas], timeout_s=self.deadline_s,
                                backoff_s=0.2) as client:
            k = client_id * batch  # clients start at different groups
            while not stop.is_set():
                chosen = [groups[(k + j) % len(groups)] for j in range(batch)]
                k += batch
                t0 = time.monotonic()
                try:
                    out: list[GroupResponse | ErrorInfo] | RewardCallError = await client.score_batch(chosen)
                except RewardCallError as exc:
                    out = exc
                took = time.monotonic() - t0
                report.calls += 1
                report.max_call_over_deadline_s = max(report.max_call_over_deadline_s, took - self.deadline_s)
                if self.record(chosen, out, report) and self.restarted_at is not None and t0 > self.restarted_at:
                    self.scored_after_restart.add(client_id)

    def record(self, chosen: list[GroupRequest], out: list[GroupResponse | ErrorInfo] | RewardCallError,
               report: SoakReport) -> bool:
        """Count one call's items; True when it scored any."""
        scored = report.scored
        for j, g in enumerate(chosen):
            report.items += len(g.candidates)
            if isinstance(out, RewardCallError):
                report.unscored[f"call {out.code.name}"] += len(g.candidates)
                continue
            o = out[j]
            if isinstance(o, ErrorInfo):
                report.unscored[f"group {o.code}"] += len(g.candidates)
                continue
            for c, r in zip(g.candidates, o.results):
                if r.status is Status.OK and r.rewards.total is not None:
                    report.scored += 1
                    self.seen.setdefault((id(g), c), set()).add(_fingerprint(r))
                else:
                    report.unscored[f"candidate {r.status.value}"] += 1
        return report.scored > scored

    async def faults(self, report: SoakReport, at: list[float], restart_timeout_s: float) -> None:
        """Kill Redis, restart it; SIGKILL replica 0, restart it; each at the given offsets (seconds)."""
        t0 = time.monotonic()

        async def until(t: float) -> None:
            await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))

        await until(at[0])
        self.redis.kill()
        report.faults.append(f"{time.monotonic() - t0:.0f}s redis SIGKILL")
        await until(at[1])
        self.redis.start()
        await asyncio.to_thread(wait_for, lambda: _redis_up(self.redis_port), 20, "redis")
        report.faults.append(f"{time.monotonic() - t0:.0f}s redis restarted (empty)")
        await until(at[2])
        victim = self.replicas[0]
        victim.process.kill()
        report.faults.append(f"{time.monotonic() - t0:.0f}s replica 0 SIGKILL")
        victim.process.start()
        report.restart_s = await asyncio.to_thread(wait_for, lambda: http_ready(victim.http), restart_timeout_s,
                                                   "restarted replica")
        self.restarted_at = time.monotonic()
        report.faults.append(f"{time.monotonic() - t0:.0f}s replica 0 restarted and ready")

    async def calibrate(self, groups: list[GroupRequest], batch: int, clients: int, report: SoakReport) -> None:
        """Time one undisturbed call of ``batch`` groups on one replica (empty cache, emptied again after) and set
        the calls' deadline from it (see the module's docstring)."""
        import redis

        t0 = time.monotonic()
        async with RewardClient([self.replicas[0].grpc], timeout_s=600) as client:
            out = await client.score_batch(groups[:batch])
        report.calibration_s = time.monotonic() - t0
        if any(isinstance(o, ErrorInfo) for o in out):
            report.problems.append("the undisturbed calibration call failed a group")
        redis.Redis(port=self.redis_port).flushdb()
        per_replica = max(1.0, clients / len(self.replicas))
        self.deadline_s = max(self.deadline_s, DEADLINE_PER_CALIBRATED_CALL * per_replica * report.calibration_s)
        report.deadline_s = self.deadline_s

    async def run(self, groups: list[GroupRequest], *, clients: int, batch: int, duration_s: float,
                  fault_at: list[float], restart_timeout_s: float) -> SoakReport:
        report = SoakReport()
        await self.calibrate(groups, batch, clients, report)
        stop = asyncio.Event()
        loops = [asyncio.create_task(self.client_loop(groups, stop, report, batch, client_id=i))
                 for i in range(clients)]
        t0 = time.monotonic()
        await self.faults(report, fault_at, restart_timeout_s)
        # keep the load on until the duration is over and every client has had a call sent after the restart
        # scored (a slow machine stretches the run, by two deadlines at most, rather than failing it)
        await asyncio.sleep(max(5.0, duration_s - (time.monotonic() - t0)))
        cap = time.monotonic() + 2 * self.deadline_s
        while len(self.scored_after_restart) < clients and time.monotonic() < cap:
            await asyncio.sleep(0.5)
        report.clients_scored_after_restart = len(self.scored_after_restart)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), self.deadline_s + 30)
        await self.check(groups, report, clients)
        return report

    async def check(self, groups: list[GroupRequest], report: SoakReport, clients: int) -> None:
        import redis

        from reward_server.cache import KEY_PREFIX

        r = redis.Redis(port=self.redis_port)
        for key in r.scan_iter(KEY_PREFIX + "*"):
            report.cache_entries_checked += 1
            report.cache_entries_bad += not _intact(r.get(key))
        # the undisturbed reference: the same groups, empty cache, one replica, no faults
        r.flushdb()
        t0 = time.monotonic()
        async with RewardClient([self.replicas[1].grpc], timeout_s=600) as client:
            reference = await client.score_batch(groups)
        report.reference_s = time.monotonic() - t0
        for g, ref in zip(groups, reference):
            if isinstance(ref, ErrorInfo):
                report.problems.append(f"the undisturbed reference run failed a group: {ref.code}")
                continue
            for c, res in zip(g.candidates, ref.results):
                fps = self.seen.get((id(g), c), set())
                report.mismatches += len(fps - {_fingerprint(res)})
        snippets = dialogue_snippets(groups)
        for rep in self.replicas:
            text = rep.process.log.read_text(errors="replace")
            report.log_leaks += sum(1 for s in snippets if s and s in text)
        if report.lost:
            report.problems.append(f"{report.lost} items neither scored nor unscored with a reason")
        if report.mismatches:
            report.problems.append(f"{report.mismatches} scored items differ from the undisturbed greedy run")
        if report.max_call_over_deadline_s > 2.0:
            report.problems.append(f"a call outlived its deadline by {report.max_call_over_deadline_s:.1f} s")
        if report.cache_entries_bad:
            report.problems.append(f"{report.cache_entries_bad} cache entries do not decode")
        if report.cache_entries_checked == 0:
            report.problems.append("no cache entry was written after Redis came back")
        if report.log_leaks:
            report.problems.append(f"{report.log_leaks} dialogue snippets found in the server logs")
        if report.clients_scored_after_restart < clients:
            report.problems.append(f"{clients - report.clients_scored_after_restart} of {clients} clients had no "
                                   f"call sent after the replica restart scored within two deadlines")
        if report.scored == 0:
            report.problems.append("nothing was scored")


def run_soak(workdir: Path, *, backend: str, clients: int, groups: int, batch: int, duration_s: float,
             fault_at: list[float], deadline_s: float, mode: str = "unified",
             start_timeout_s: float = 600) -> SoakReport:
    """Start Redis and two replicas under ``workdir``, run the soak, stop everything, return the report."""
    soak = Soak(workdir, backend, deadline_s)
    try:
        soak.start(start_timeout_s)
        report = asyncio.run(soak.run(soak_groups(groups, mode), clients=clients, batch=batch, duration_s=duration_s,
                                      fault_at=fault_at, restart_timeout_s=start_timeout_s))
    finally:
        codes = soak.stop()
    if any(c not in (0, None) for c in codes):
        report.problems.append(f"a replica exited with {codes} on SIGTERM")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="transformers", choices=["vllm", "transformers"])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4, help="groups per ScoreBatch call")
    ap.add_argument("--duration-s", type=float, default=240.0)
    ap.add_argument("--deadline-s", type=float, default=60.0,
                    help="each call's deadline, retries included; raised where the machine is slower "
                         "(module docstring)")
    ap.add_argument("--mode", default="unified", choices=["unified", "single_pass", "prm", "orm"])
    args = ap.parse_args(argv)
    d = args.duration_s
    with tempfile.TemporaryDirectory(prefix="compeer-soak-") as tmp:
        report = run_soak(Path(tmp), backend=args.backend, clients=args.clients, groups=args.groups,
                          batch=args.batch, duration_s=d, fault_at=[0.15 * d, 0.3 * d, 0.45 * d],
                          deadline_s=args.deadline_s, mode=args.mode)
    fig = report.to_json()
    print_table(f"Fault soak ({args.backend}, 2 replicas, {args.clients} clients, {d:.0f} s)",
                [("ScoreBatch calls", fig["calls"], ""), ("items (candidates) sent", fig["items"], ""),
                 ("scored", fig["scored"], "equal to the undisturbed greedy run"),
                 ("unscored, by reason", fig["unscored"], "explicit, counted"),
                 ("items lost", fig["lost"], "goal: 0"), ("mismatches", fig["mismatches"], "goal: 0"),
                 ("faults injected", len(fig["faults"]), "; ".join(fig["faults"])),
                 ("each call's deadline (s)", fig["deadline_s"],
                  f"undisturbed call {fig['calibration_call_s']:.1f} s"),
                 ("worst call past its deadline (s)", fig["max_call_over_deadline_s"], "goal: <= 0 (+2 s slack)"),
                 ("cache entries checked / bad", f"{fig['cache_entries_checked']} / {fig['cache_entries_bad']}",
                  ""), ("dialogue snippets in logs", fig["log_leaks"], "goal: 0"),
                 ("replica restart to ready (s)", fig["replica_restart_s"], ""),
                 ("clients scored after the restart", fig["clients_scored_after_restart"], f"goal: {args.clients}"),
                 ("undisturbed reference run (s)", fig["reference_run_s"], f"{args.groups} groups, one replica")])
    write_result("soak", {"args": vars(args), **fig})
    for p in report.problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
