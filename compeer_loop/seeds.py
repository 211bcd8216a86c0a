"""Seed replicates: several loop folders, one per training seed, read as one experiment (issue 26: three seeds for
arms a, b and c at least; ``compeer-loop report --root R0 --root R1 ...``).

A seed replicate is a whole loop folder of its own: its own warm-up (arm a) and arms, planned with ``--seed k``
(folders of one seed trained on several machines are joined first with ``compeer-loop merge``).
:func:`load_replicates` reads the folders' plans and refuses two folders with the same seed, plans that differ in
anything but ``seed`` and what :data:`compeer_loop.merge.MAY_DIFFER` allows, and other prompt sets (the one rule of
:func:`compeer_loop.merge.check_comparable`). :func:`load_records` tags every evaluation record with its folder's
seed (``r["seed"]``) and pools each policy's records over the seeds that evaluated it, so the report's figures and
bootstrap intervals are over prompt x seed, and a paired comparison pairs one prompt under one seed
(:func:`compeer_loop.stats.per_prompt` keys by the record's own seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compeer_loop.merge import MAY_DIFFER, check_comparable, plan_differences
from compeer_loop.plan import ARMS, BASE_POLICY, LoopSettings
from compeer_loop.prompts import read_jsonl
from compeer_loop.runner import load_settings
from compeer_loop.stats import add_item_figures, summarise

Records = dict[str, list[dict[str, Any]]]
#: plan fields seed replicates may differ in: the seed, and what merged folders may differ in
SEED_MAY_DIFFER = ("seed", *MAY_DIFFER)


@dataclass(frozen=True)
class Replicate:
    """One loop folder and its plan (one seed)."""

    root: Path
    settings: LoopSettings

    @property
    def seed(self) -> int:
        """The seed every arm of this folder was trained with."""
        return self.settings.seed


def load_replicates(roots: Sequence[Path]) -> list[Replicate]:
    """The loop folders ``roots`` as seed replicates, sorted by seed; ValueError naming the folders when two have the
    same seed, and naming the fields when their plans differ in more than :data:`SEED_MAY_DIFFER` (or their prompt
    sets differ). One folder is read as it is."""
    if not roots:
        raise ValueError("no loop folder given")
    reps = [Replicate(Path(r), load_settings(Path(r))) for r in roots]
    by_seed: dict[int, list[Path]] = {}
    for rep in reps:
        by_seed.setdefault(rep.seed, []).append(rep.root)
    same = [f"{' and '.join(map(str, rs))} have the same seed {seed}" for seed, rs in by_seed.items() if len(rs) > 1]
    if same:
        raise ValueError("; ".join(same) + ": seed replicates need one folder per seed (folders of one seed trained "
                         "on several machines are joined with `compeer-loop merge` first)")
    check_comparable([r.root for r in reps], [r.settings for r in reps], SEED_MAY_DIFFER)
    return sorted(reps, key=lambda r: r.seed)


def seeded(reps: Sequence[Replicate]) -> bool:
    """Whether the report reads several seeds (else it reads as the one folder's report always did)."""
    return len(reps) > 1


def policies(reps: Sequence[Replicate]) -> list[str]:
    """The policies any folder planned to evaluate: one folder's own order; several: base, then the arms' order."""
    if not seeded(reps):
        return list(reps[0].settings.eval_policies)
    order = [BASE_POLICY, *(a.name for a in ARMS)]
    names = {p for r in reps for p in r.settings.eval_policies}
    return sorted(names, key=lambda p: (order.index(p) if p in order else len(order), p))


def load_records(reps: Sequence[Replicate]) -> Records:
    """Per policy with records: its evaluation records of every folder that evaluated it, answered ones with their
    item figures, each tagged with its folder's seed (``seed``); seeds pooled, in seed order."""
    out: Records = {}
    for name in policies(reps):
        for rep in reps:
            path = rep.root / "eval" / name / "records.jsonl"
            if name not in rep.settings.eval_policies or not path.exists():
                continue
            rs = [add_item_figures(r, rep.settings.distinct_first_tokens) if r.get("status") == "ok" else r
                  for r in read_jsonl(path)]
            for r in rs:
                r["seed"] = rep.seed
            out.setdefault(name, []).extend(rs)
    return out


def load_figures(reps: Sequence[Replicate], n_boot: int = 1000, records: Records | None = None) -> dict[str, Any]:
    """Per policy with records: :func:`compeer_loop.stats.summarise` of its records, seeds pooled (the resampling
    seeded with the first folder's seed)."""
    records = load_records(reps) if records is None else records
    return {name: summarise(rs, n_boot=n_boot, seed=reps[0].seed) for name, rs in records.items()}


def seeds_of(records: Records) -> dict[str, list[int]]:
    """Per policy, the seeds its records come from."""
    return {p: sorted({int(r["seed"]) for r in rs if "seed" in r}) for p, rs in records.items()}


def seed_list(seeds: Sequence[int]) -> str:
    """``seed 0`` or ``seeds 0, 1, 2``."""
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def seed_labels(labels: dict[str, str], records: Records, reps: Sequence[Replicate]) -> dict[str, str]:
    """The policies' labels, each with the seeds it was evaluated in when the report reads several seeds."""
    if not seeded(reps):
        return labels
    seeds = seeds_of(records)
    return {p: f"{label} ({seed_list(seeds.get(p, []))})" for p, label in labels.items()}


def replicates_lines(reps: Sequence[Replicate]) -> list[str]:
    """One line per folder: its seed and how its plan differs from the first folder's (report's settings)."""
    first = reps[0]
    out = []
    for rep in reps:
        diff = [k for k in plan_differences(first.settings, rep.settings, ()) if k != "seed"]
        other = f"; differs from seed {first.seed}'s plan in {', '.join(diff)}" if diff else ""
        out.append(f"- seed {rep.seed}: `{rep.root}`{other}")
    return out
