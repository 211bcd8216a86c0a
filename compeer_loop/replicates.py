"""Seed replicates run by one driver: several loop folders (each its own warm-up and arms, planned ``--seed`` apart)
sharing one set of judge servers, so the servers start once and one folder's evaluations run while the next folder's
arms train (``compeer-loop run --root R0 --root R1 ...``; ``tools/gpu/compeer_loop.sh`` with ``SEEDS``)."""

from __future__ import annotations

from typing import Any

from compeer_loop.procs import stop_servers
from compeer_loop.runner import DONE_FILE, Driver

#: plan fields that seed replicates run by one driver must share: the judge servers they all use
SHARED_SERVER_FIELDS = ("device", "judge_backend", "judge_gpu_memory", "static_cache", "embedding_model",
                        "base_port", "prm_adapter", "orm_adapter", "cards")


def run_replicates(drivers: list[Driver], evaluate: bool = True) -> list[dict[str, Any]]:
    """Several loop folders (seed replicates: each its own warm-up and arms, ``--seed`` apart) in one process that
    starts the judge servers once (their pid files in the first folder) and stops them at the end. Each folder's
    arms train in turn, the evaluation of each policy starting as soon as it is ready, so a folder's evaluations run
    while the next folder's arms train; then every evaluation is waited for and each folder gets its ``DONE``."""
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
    for d in drivers:
        d.run_arms()
        if evaluate and "trained" in needed:
            d.start_evals()  # the policies that finished in the last poll: evaluated while the next folder trains
    for d in drivers:
        if evaluate and "trained" in needed:
            d.run_eval()
        elif evaluate:
            d.state["eval"].update({p: "done" for p in d.s.eval_policies
                                    if (d.root / "eval" / p / "done.json").exists()})
    if needed:
        stop_servers(first.root)
    return [d.finish() for d in drivers]
