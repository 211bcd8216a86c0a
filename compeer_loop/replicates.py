"""Seed replicates run by one driver: several loop folders (each its own warm-up and arms, planned ``--seed`` apart)
sharing one set of judge servers, so the servers start once and a folder's evaluations run while other folders' arms
train (``compeer-loop run --root R0 --root R1 ...``; ``tools/gpu/compeer_loop.sh`` with ``SEEDS``).

On a machine with one arm card (or one card) the folders train one after the other. With several arm cards (a
four-GPU machine: the judges on the first card, three arm cards) the folders train side by side, each on an arm card
of its own (folder k on arm card k modulo their number; a card's folders in turn), in one thread each; once every
lane of a card has finished, that card takes the other lanes' waiting arms, one at a time
(:class:`compeer_loop.placement.SpareCards`). Every evaluation stays on the judges' card."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from compeer_loop.placement import SpareCards
from compeer_loop.procs import stop_servers
from compeer_loop.runner import DONE_FILE, Driver

#: plan fields that seed replicates run by one driver must share: the judge servers they all use
SHARED_SERVER_FIELDS = ("device", "judge_backend", "judge_gpu_memory", "static_cache", "embedding_model",
                        "base_port", "prm_adapter", "orm_adapter", "cards")


def run_replicates(drivers: list[Driver], evaluate: bool = True) -> list[dict[str, Any]]:
    """Several loop folders (seed replicates: each its own warm-up and arms, ``--seed`` apart) in one process that
    starts the judge servers once (their pid files in the first folder) and stops them at the end. The folders train
    in the lanes of :func:`lanes` (in turn on one arm card, side by side on several), the evaluation of each policy
    starting as soon as it is ready, so a folder's evaluations run while other folders' arms train; then every
    evaluation is waited for and each folder gets its ``DONE``. A lane that raises stops the run with its error (the
    servers stopped) once the other lanes have finished."""
    first = drivers[0]
    for d in drivers[1:]:
        diff = [k for k in SHARED_SERVER_FIELDS if getattr(d.s, k) != getattr(first.s, k)]
        if diff:
            raise ValueError(f"{d.root} and {first.root} differ in {', '.join(diff)}: folders run together share "
                             "their judge servers, so these settings must be equal")
    for d in drivers:
        (d.root / DONE_FILE).unlink(missing_ok=True)
        d.evaluate = evaluate
    needed = set().union(*(d.needed_servers(evaluate) for d in drivers))
    first.start_servers(needed)
    for d in drivers:
        d.save()
    errors: list[BaseException] = []
    plan = lanes(drivers)
    spare = SpareCards(lane[0].placement.arm_cards[0] for lane in plan) if len(plan) > 1 else None
    for d in drivers:
        d.spare = spare

    def train(lane: list[Driver]) -> None:
        try:
            for d in lane:
                d.run_arms()
                if evaluate and "trained" in needed:
                    d.start_evals()  # the policies that finished in the last poll: evaluated while the next trains
            if spare is not None:  # this lane's card may now take the other lanes' waiting arms
                spare.lane_done(lane[0].placement.arm_cards[0])
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the driver's thread once every lane has stopped
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(lane,), name=f"lane-{k}") for k, lane in enumerate(plan)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        stop_servers(first.root)
        raise errors[0]
    for d in drivers:
        if evaluate and "trained" in needed:
            d.run_eval()
        elif evaluate:
            d.state["eval"].update({p: "done" for p in d.s.eval_policies
                                    if (d.root / "eval" / p / "done.json").exists()})
    if needed:
        stop_servers(first.root)
    return [d.finish() for d in drivers]


def lanes(drivers: list[Driver]) -> list[list[Driver]]:
    """The folders each arm card trains, in turn: with several arm cards and several folders, folder k on arm card k
    modulo the number of cards (its placement narrowed to that card); otherwise one lane of every folder in order."""
    cards = drivers[0].placement.arm_cards
    if len(drivers) < 2 or len(cards) < 2 or drivers[0].placement.shared:
        return [list(drivers)]
    n = min(len(cards), len(drivers))
    for k, d in enumerate(drivers):
        d.placement = replace(d.placement, arm_cards=(cards[k % n],))
        d.state["placement"] = d.placement.to_json()
    return [drivers[k::n] for k in range(n)]
