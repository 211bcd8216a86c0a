"""Where the loop's processes run (issue 26, item 5): which GPU card each gets, and which machine ran what.

On a machine with several cards the judge servers (and the evaluations, which mostly wait on the trained judge) go
on the first card, the GRPO arms on the others, one per card by default, each on the card with the fewest arms
running (``CUDA_VISIBLE_DEVICES`` per process). With one card, or none found, every process shares it, as before.
Each arm's launches are recorded in ``ROOT/<arm>/machine.json`` (host, GPUs, card), so loop folders trained on
several machines and merged (``compeer-loop merge``) still say which machine trained which arm.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MACHINE_FILE = "machine.json"
#: arms at once when they share the judge's card (or no card is known): what one 140 GB H200 held (docs/compeer_loop.md)
SHARED_CARD_ARMS = 2


@dataclass(frozen=True)
class Placement:
    """Cards of the judge servers and evaluations (``judge_card``) and of the GRPO arms and warm-up (``arm_cards``);
    None / empty: no card is named (CPU, or none found), processes inherit the driver's environment."""

    judge_card: str | None = None
    arm_cards: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        """Arms share the judge's card (one card, or none known)."""
        return not self.arm_cards or self.arm_cards == (self.judge_card,)

    def to_json(self) -> dict[str, Any]:
        return {"judge_card": self.judge_card, "arm_cards": list(self.arm_cards)}


def plan_placement(cards: list[str]) -> Placement:
    """The judge on the first card, the arms on the others; one card: everything on it; none: no placement."""
    if not cards:
        return Placement()
    if len(cards) == 1:
        return Placement(cards[0], (cards[0],))
    return Placement(cards[0], tuple(cards[1:]))


def default_concurrency(p: Placement) -> int:
    """``max_concurrent_arms`` when the plan leaves it unset: one arm per arm card; on a shared card
    :data:`SHARED_CARD_ARMS` (an arm out of memory beside another then runs alone)."""
    return SHARED_CARD_ARMS if p.shared else len(p.arm_cards)


def pick_card(p: Placement, busy: Iterable[str | None]) -> str | None:
    """The arm card with the fewest arms running (``busy``: the cards of the running arms), first in order on a tie."""
    if not p.arm_cards:
        return None
    load = Counter(busy)
    return min(p.arm_cards, key=lambda c: (load[c], p.arm_cards.index(c)))


#: with vLLM generation, a GRPO arm starts on a card only once every arm already there has logged a step (its colocated
#: vLLM engine has profiled the card and taken its share), or this many seconds after that arm started: two engines
#: profiling one H200 at once stopped one of them on 2026-11-30 ("No available memory for the cache blocks")
START_GAP_S = 300.0


def still_starting(card: str | None, arms: Iterable[tuple[str | None, float, bool]], now: float) -> bool:
    """Whether one of ``arms`` (its card, start time, whether it has logged a step) on ``card`` is still starting: no
    step logged, started less than :data:`START_GAP_S` before ``now``."""
    return any(c == card and not stepped and now - started < START_GAP_S for c, started, stepped in arms)


class SpareCards:
    """Arm cards whose lanes of seed replicates have all finished (:mod:`compeer_loop.replicates`): another lane's
    driver, its own card full, may start one waiting arm on each (2026-12-01: a second seed's arms queued one at a
    time beside the judges while the first seed's card sat idle for 8 minutes). Shared by the lanes' threads."""

    def __init__(self, lane_cards: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._lanes = Counter(lane_cards)  # unfinished lanes per card
        self._free: list[str] = []

    def lane_done(self, card: str) -> None:
        """A lane on ``card`` has finished; once every lane there has, the card may take other lanes' arms."""
        with self._lock:
            self._lanes[card] -= 1
            if self._lanes[card] <= 0 and card not in self._free:
                self._free.append(card)

    def take(self) -> str | None:
        """A spare card for one arm (not spare again until :meth:`give_back`), or None."""
        with self._lock:
            return self._free.pop(0) if self._free else None

    def give_back(self, card: str) -> None:
        """The arm started on ``card`` by :meth:`take` has stopped."""
        with self._lock:
            if card not in self._free:
                self._free.append(card)


def card_env(card: str | None) -> dict[str, str]:
    """The environment that puts a process on ``card`` (nothing when no card is named)."""
    return {} if card is None else {"CUDA_VISIBLE_DEVICES": card}


def _nvidia_smi() -> list[tuple[str, str]]:
    """``(index, name)`` of every GPU ``nvidia-smi`` lists (empty without it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.split(",", 1) for line in out.splitlines() if "," in line]
    return [(i.strip(), n.strip()) for i, n in rows]


def detect_cards(env: Mapping[str, str] | None = None) -> list[str]:
    """The cards this driver may use: ``CUDA_VISIBLE_DEVICES`` when set (its entries, as a child process names
    them), else every GPU ``nvidia-smi`` lists; empty when neither names one."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [c.strip() for c in visible.split(",") if c.strip() and c.strip() != "-1"]
    return [i for i, _ in _nvidia_smi()]


def machine_info() -> dict[str, Any]:
    """This machine: host name, and its GPUs as ``nvidia-smi`` names them (count and a ``4 x NAME`` summary)."""
    gpus = [n for _, n in _nvidia_smi()]
    summary = ", ".join(f"{k} x {name}" for name, k in Counter(gpus).items()) or "no GPU found"
    return {"hostname": socket.gethostname(), "gpu_count": len(gpus), "gpus": summary}


def record_launch(arm_dir: Path, machine: dict[str, Any], card: str | None, resume: bool) -> None:
    """Append one launch of an arm (machine, card, time, whether it resumed) to ``ARM/machine.json``."""
    path = arm_dir / MACHINE_FILE
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({**machine, "card": card, "at": time.time(), "resume": resume})
    arm_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(runs, indent=1) + "\n")
    tmp.replace(path)


def read_launches(arm_dir: Path) -> list[dict[str, Any]]:
    """The launches ``record_launch`` wrote for an arm (empty when none)."""
    path = arm_dir / MACHINE_FILE
    return json.loads(path.read_text()) if path.exists() else []


def where_ran(launches: list[dict[str, Any]]) -> str:
    """One phrase naming the machine(s) and card(s) an arm ran on, in launch order without repeats."""
    seen: list[str] = []
    for run in launches:
        card = f", card {run['card']}" if run.get("card") is not None else ""
        text = f"{run.get('hostname', '?')} ({run.get('gpus', '?')}{card})"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen) or "not recorded"
