"""The resumable arm runner: one driver process that starts the reward servers the arms need, runs the warm-up
(arm a), then the GRPO arms, ``max_concurrent_arms`` at a time (one ``compeer-train grpo`` process each), then the
evaluation of every policy, writing ``ROOT/state.json`` as it goes.

Before a GRPO arm trains, its judge servers are checked against the plan and probed (:mod:`compeer_loop.controls`;
a judge that is not what the plan says stops the arm). Processes are placed on the machine's cards
(:mod:`compeer_loop.placement`: judge servers and evaluations on the first, arms on the others; one card: all on
it), and each arm's launches record the machine and card.

Everything it does is idempotent, so a killed driver (or a killed arm) continues where it stopped when started
again: a server that answers ``/readyz`` on its port is reused; an arm with ``OUT/final/`` is done; an arm with a
``checkpoint-*`` folder is resumed (``--resume``); an arm process still alive from an earlier driver (its pid in
``ROOT/<arm>/pid``) is adopted; a finished evaluation (``ROOT/eval/<policy>/done.json``) is kept. A failed arm
is resumed up to ``max_restarts`` times, then marked failed; it never stops the others.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from compeer_loop.controls import JudgeControlError, read_judge_record, verify_arm
from compeer_loop.placement import (
    SpareCards,
    card_env,
    default_concurrency,
    detect_cards,
    machine_info,
    pick_card,
    plan_placement,
    read_launches,
    record_launch,
    still_starting,
    where_ran,
)
from compeer_loop.plan import (
    ARM_BY_NAME,
    Arm,
    LoopSettings,
    all_judges,
    arm_env,
    arm_missing_inputs,
    grpo_argv,
    judge_servers,
    server_argv,
    warmup_argv,
    warmup_length,
)
from compeer_loop.procs import Job, alive, file_sha256, out_of_gpu_memory, ready, stop_servers

__all__ = ["Driver", "load_settings", "policy_dir", "stop_servers"]

log = logging.getLogger(__name__)
PLAN_FILE, STATE_FILE, DONE_FILE = "plan.json", "state.json", "DONE"
WARMUP_ADAPTER = Path("warmup") / "adapter"
POLL_S = 5.0


def load_settings(root: Path) -> LoopSettings:
    """The settings a loop folder was started with."""
    return LoopSettings.from_json(json.loads((root / PLAN_FILE).read_text()))


def policy_dir(root: Path, name: str) -> Path | None:
    """The trained adapter of a policy (None for ``base`` and for an arm not finished)."""
    arm = ARM_BY_NAME.get(name)
    if arm is None:
        return None
    path = root / name / ("final" if arm.grpo else WARMUP_ADAPTER)
    return path if (path / "adapter_config.json").is_file() else None


class Driver:
    """Runs the plan in ``root``; see the module docstring."""

    def __init__(self, root: Path, settings: LoopSettings) -> None:
        self.root = root
        self.s = settings
        self.servers = judge_servers(settings)
        self.logs = root / "logs"
        self.state: dict[str, Any] = {"started": time.time(), "arms": {}, "eval": {}, "servers": {}}
        prev = root / STATE_FILE
        if prev.exists():
            old = json.loads(prev.read_text())
            self.state["started"] = old.get("started", self.state["started"])
            self.state["restarts"] = old.get("restarts", {})
        self.state.setdefault("restarts", {})
        cards = list(settings.cards) or (detect_cards() if settings.device == "cuda" else [])
        self.placement = plan_placement(cards)
        self.state["machine"], self.state["placement"] = machine_info(), self.placement.to_json()
        self.probes: dict[str, dict[str, Any]] = {}  # each judge server's probe, taken once per driver
        self.cards: dict[str, str | None] = {}  # the card of each arm started or adopted
        self.spare: SpareCards | None = None  # seed replicates: cards other lanes have finished with
        self.spilled: dict[str, str] = {}  # arms running on a spare card (not counted in max_concurrent_arms)
        self.evaluate = True
        self.eval_jobs: dict[str, Job] = {}
        self.failed_evals: set[str] = set()

    # ---- processes ------------------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], pid_file: Path, env: dict[str, str] | None = None) -> Job:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=os.getcwd(), env={**os.environ, **(env or {})})
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(str(proc.pid))
        log.info("started %s (pid %d): %s", name, proc.pid, " ".join(argv[1:6]))
        return Job(name, proc.pid, proc)

    def _adopt(self, name: str, pid_file: Path) -> Job | None:
        if pid_file.exists():
            pid = int(pid_file.read_text().strip() or 0)
            if pid > 0 and alive(pid):
                log.info("adopting %s (pid %d) from an earlier driver", name, pid)
                return Job(name, pid)
        return None

    def needed_servers(self, evaluate: bool) -> set[str]:
        """Judges of the arms not finished, and the trained judge while an evaluation is not finished."""
        names = {j for a in self.s.arms if policy_dir(self.root, a) is None and not arm_missing_inputs(ARM_BY_NAME[a], self.s)
                 for j in ARM_BY_NAME[a].judges}
        if evaluate and any(not (self.root / "eval" / p / "done.json").exists() for p in self.s.eval_policies):
            names.add("trained")
        return names

    def start_servers(self, names: set[str]) -> None:
        judges = all_judges(self.s)  # names may come from other seed replicates' arms (run_replicates)
        for j in (judges[n] for n in sorted(names)):
            if ready(j):
                self.state["servers"][j.name] = "ready (reused)"
                continue
            if self._adopt(f"server-{j.name}", self.root / "servers" / f"{j.name}.pid") is None:
                # the server tokenizes each batch of judge prompts in one call: let the tokenizer use the cores
                self._spawn(f"server-{j.name}", server_argv(j, self.s), self.root / "servers" / f"{j.name}.pid",
                            {"TOKENIZERS_PARALLELISM": "true", **card_env(self.placement.judge_card)})
            self.state["servers"][j.name] = "starting"

    def wait_servers(self, names: set[str]) -> bool:
        """Wait until the named servers are ready (``server_wait_s``); False when one is not."""
        t0 = time.time()
        pending = {n for n in names if n in self.servers}
        while pending and time.time() - t0 < self.s.server_wait_s:
            for n in sorted(pending):
                if ready(self.servers[n]):
                    self.state["servers"][n] = f"ready after {time.time() - t0:.0f} s"
                    pending.discard(n)
            if pending:
                time.sleep(POLL_S)
        for n in pending:
            self.state["servers"][n] = f"not ready after {self.s.server_wait_s:.0f} s (see logs/server-{n}.log)"
        self.save()
        return not pending

    # ---- arms ---------------------------------------------------------------------------------------------------
    def arm_status(self, arm: Arm) -> dict[str, Any]:
        out: dict[str, Any] = {"title": arm.title, "done": policy_dir(self.root, arm.name) is not None}
        metrics = self.root / arm.name / "metrics.jsonl"
        if metrics.exists():
            lines = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
            if lines:
                out["step"] = json.loads(lines[-1]).get("step")
        out["max_steps"] = self.s.steps if arm.grpo else warmup_length(self.s)
        record = read_judge_record(self.root / arm.name)
        if record is not None:  # what the arm was verified to train against (controls.verify_arm)
            out["judge"] = [{"server": j["server"], **{k: j["served"].get(k) for k in ("model", "revision", "adapter")}}
                            for j in record["judges"]]
        launches = read_launches(self.root / arm.name)
        if launches:
            out["ran_on"] = where_ran(launches)
        return out

    def _launch_arm(self, arm: Arm, card: str | None) -> Job:
        out = self.root / arm.name
        adopted = self._adopt(arm.name, out / "pid")
        if adopted is not None:
            return adopted
        resume = any(p.name.startswith("checkpoint-") for p in out.iterdir()) if out.is_dir() else False
        record_launch(out, self.state["machine"], card, resume)
        if not arm.grpo:
            return self._spawn(arm.name, warmup_argv(self.s, self.root), out / "pid", card_env(card))
        target = out / WARMUP_ADAPTER  # every GRPO arm starts from arm (a)'s warm-up (reused, never retrained)
        if not target.exists():
            shutil.copytree(self.root / "a" / WARMUP_ADAPTER, target)
        # arms may share a GPU: the expandable allocator wastes less memory in half-used blocks (an OOM beside another
        # arm showed 5.6 GB reserved but unallocated); allocation only, no effect on the numbers
        env = {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
               **card_env(card), **arm_env(arm, self.s)}
        return self._spawn(arm.name, grpo_argv(arm, self.s, self.root, self.servers, resume), out / "pid", env)

    def _card_starting(self, jobs: dict[str, Job]) -> bool:
        """With vLLM generation, whether the next arm's card holds a GRPO arm still starting
        (:func:`compeer_loop.placement.still_starting`)."""
        if self.s.generation != "vllm":
            return False
        arms = [(self.cards.get(n), job.started, "step" in self.arm_status(ARM_BY_NAME[n]))
                for n, job in jobs.items() if ARM_BY_NAME[n].grpo]
        return still_starting(pick_card(self.placement, (self.cards.get(n) for n in jobs)), arms, time.time())

    def _start(self, arm: Arm, running: set[str], spare: str | None = None) -> Job | None:
        """Check a GRPO arm's judges (None, the arm marked failed, when one is not what the plan says), then launch
        it on the ``spare`` card when one is given, else on the arm card with the fewest of ``running``."""
        if spare is not None:
            self.spilled[arm.name] = spare
        if arm.grpo:
            try:
                verify_arm(arm, self.s, self.servers, self.root / arm.name, self.probes)
            except JudgeControlError as exc:
                log.error("arm %s not trained: %s", arm.name, exc)
                self.state["arms"][arm.name] = {**self.arm_status(arm), "status": f"failed: {exc}"}
                self._stopped(arm.name)
                return None
        card = spare if spare is not None else pick_card(self.placement, (self.cards.get(n) for n in running))
        self.cards[arm.name] = card
        log.info("arm %s starts on card %s%s", arm.name, card, " (a finished lane's)" if spare is not None else "")
        return self._launch_arm(arm, card)

    def _next_card(self, jobs: dict[str, Job], limit: int) -> tuple[bool, str | None]:
        """Whether the next waiting arm may start now, and where: its own cards (None) while fewer than ``limit`` of
        its arms run there and none is starting there, else a free spare card."""
        if len(jobs) - len(self.spilled) < limit:
            return not self._card_starting(jobs), None
        card = self.spare.take() if self.spare is not None else None
        return card is not None, card

    def _stopped(self, name: str) -> None:
        """Arm ``name`` has stopped: the spare card it ran on is free again."""
        if (card := self.spilled.pop(name, None)) is not None and self.spare is not None:
            self.spare.give_back(card)

    def run_arms(self) -> None:
        arms = [ARM_BY_NAME[n] for n in self.s.arms]
        runnable = []
        for arm in arms:
            why = arm_missing_inputs(arm, self.s)
            if why:
                self.state["arms"][arm.name] = {"title": arm.title, "done": False, "status": f"not run: {why}"}
            else:
                runnable.append(arm)
        if any(a.grpo for a in runnable) and policy_dir(self.root, "a") is None:
            self._run_to_end([ARM_BY_NAME["a"]], set())  # the warm-up every GRPO arm starts from
            if policy_dir(self.root, "a") is None:
                for a in runnable:
                    self.state["arms"][a.name] = {**self.arm_status(a), "status": "failed: the warm-up failed"}
                self.save()
                return
        warmup = policy_dir(self.root, "a")
        if warmup is not None:  # every GRPO arm starts from these bytes (compared across loop folders by `merge`)
            self.state["warmup_sha256"] = file_sha256(warmup / "adapter_model.safetensors")
        judges = {j for a in runnable if policy_dir(self.root, a.name) is None for j in a.judges}
        if not self.wait_servers(judges):
            broken = {j for j in judges if self.state["servers"].get(j, "").startswith("not ready")}
            for a in [a for a in runnable if broken & set(a.judges)]:
                self.state["arms"][a.name] = {**self.arm_status(a), "status": "failed: reward server not ready"}
            runnable = [a for a in runnable if not broken & set(a.judges)]
        self._run_to_end(runnable, judges)

    def _run_to_end(self, arms: list[Arm], judges: set[str]) -> None:
        """Train ``arms`` to the end, at most ``max_concurrent_arms`` at once (in plan order); arms still running
        from a killed driver are adopted first, whatever the limit."""
        jobs: dict[str, Job] = {}
        pending: list[Arm] = []
        for arm in arms:
            if policy_dir(self.root, arm.name) is not None:
                self.state["arms"][arm.name] = {**self.arm_status(arm), "status": "done"}
                continue
            adopted = self._adopt(arm.name, self.root / arm.name / "pid")
            if adopted is not None:
                jobs[arm.name] = adopted
                launches = read_launches(self.root / arm.name)
                self.cards[arm.name] = launches[-1].get("card") if launches else None
            else:
                pending.append(arm)
        full = limit = self.s.max_concurrent_arms or default_concurrency(self.placement)
        while jobs or pending:
            while pending:
                may, spare = self._next_card(jobs, limit)
                if not may:
                    break
                arm = pending.pop(0)
                job = self._start(arm, set(jobs), spare)
                if job is not None:
                    jobs[arm.name] = job
            for arm in pending:
                why = ("an arm on its card is starting" if len(jobs) - len(self.spilled) < limit else
                       "max_concurrent_arms" if limit == full else "one arm per card after an OOM")
                self.state["arms"][arm.name] = {**self.arm_status(arm), "status": f"waiting ({why})"}
            time.sleep(POLL_S)
            self.start_evals()
            self.poll_evals()
            running = set(jobs)
            for name, job in list(jobs.items()):
                arm = ARM_BY_NAME[name]
                rc = job.poll()
                status = self.arm_status(arm)
                if rc is None:
                    self.state["arms"][name] = {**status, "status": "running", "pid": job.pid}
                    continue
                del jobs[name]
                self._stopped(name)
                if status["done"]:
                    self.state["arms"][name] = {**status, "status": "done", "seconds": time.time() - job.started}
                    continue
                beside = {n for n in running - {name} if self.cards.get(n) == self.cards.get(name)}
                if beside and out_of_gpu_memory(self.logs / f"{name}.log"):
                    # the other arms on its card held the memory: not this arm's failure; from now on one per card
                    log.warning("arm %s ran out of GPU memory beside %s: it runs again alone", name,
                                ", ".join(sorted(beside)))
                    limit = min(limit, max(1, len(self.placement.arm_cards)))
                    pending.insert(0, arm)
                    continue
                n = self.state["restarts"].get(name, 0)
                if n < self.s.max_restarts:
                    self.state["restarts"][name] = n + 1
                    log.warning("arm %s exited with %s before finishing: resuming (%d/%d)", name, rc, n + 1,
                                self.s.max_restarts)
                    job = self._start(arm, set(jobs))
                    if job is not None:
                        jobs[name] = job
                else:
                    self.state["arms"][name] = {**status, "status": f"failed (exit {rc}; see logs/{name}.log)"}
            self.save()

    # ---- evaluation -----------------------------------------------------------------------------------------------
    def start_evals(self) -> None:
        """Start the evaluation of every policy that is ready (trained, or ``base``) and not done or running,
        while the trained judge's server answers; called between training polls, so evaluations overlap training."""
        if not self.evaluate or "trained" not in self.servers or not ready(self.servers["trained"]):
            return
        for name in self.s.eval_policies:
            out = self.root / "eval" / name
            if name in self.eval_jobs or (out / "done.json").exists():
                continue
            if name != "base" and policy_dir(self.root, name) is None:
                continue
            argv = [sys.executable, "-m", "compeer_loop.cli", "eval", "--root", str(self.root), "--policy", name]
            self.eval_jobs[name] = self._adopt(f"eval-{name}", out / "pid") or self._spawn(
                f"eval-{name}", argv, out / "pid", card_env(self.placement.judge_card))

    def poll_evals(self) -> None:
        for name, job in list(self.eval_jobs.items()):
            rc = job.poll()
            if rc is None:
                self.state["eval"][name] = "running"
                continue
            del self.eval_jobs[name]
            done = (self.root / "eval" / name / "done.json").exists()
            self.state["eval"][name] = "done" if done else f"failed (exit {rc}; see logs/eval-{name}.log)"
            if not done:
                self.failed_evals.add(name)

    def run_eval(self) -> None:
        """Evaluate what is left once training is over, and wait for every evaluation."""
        if not self.wait_servers({"trained"}):
            self.state["eval_status"] = "failed: the trained judge's server is not ready"
            self.save()
            return
        for name in self.s.eval_policies:
            if (self.root / "eval" / name / "done.json").exists():
                self.state["eval"][name] = "done"
            elif name != "base" and policy_dir(self.root, name) is None:
                self.state["eval"][name] = "not evaluated: no trained policy"
        self.start_evals()
        while self.eval_jobs:
            time.sleep(POLL_S)
            self.poll_evals()
            self.save()

    # ---- all ----------------------------------------------------------------------------------------------------
    def save(self) -> None:
        self.state["updated"] = time.time()
        self.state["elapsed_s"] = self.state["updated"] - self.state["started"]
        for name in self.s.arms:
            if name not in self.state["arms"]:
                self.state["arms"][name] = {**self.arm_status(ARM_BY_NAME[name]), "status": "pending"}
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        os.replace(tmp, self.root / STATE_FILE)

    def finish(self) -> dict[str, Any]:
        """Write ``ROOT/DONE`` with a one-line outcome (``ok`` or the failed arms and evaluations)."""
        failed = [n for n, a in self.state["arms"].items() if str(a.get("status", "")).startswith("failed")]
        failed += [f"eval-{n}" for n, e in self.state["eval"].items() if str(e).startswith("failed")]
        self.state["finished"] = time.time()
        self.save()
        (self.root / DONE_FILE).write_text(("FAILED: " + ", ".join(failed)) if failed else "ok")
        return self.state

    def run(self, evaluate: bool = True) -> dict[str, Any]:
        """Servers, warm-up, arms, evaluation; writes ``ROOT/DONE`` with a one-line outcome."""
        from compeer_loop.replicates import run_replicates  # (it drives Driver objects)

        return run_replicates([self], evaluate)[0]

