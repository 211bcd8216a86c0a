"""The report's "what the judge favoured in training" table: inside each rollout group, how much more (or less) the
judge's total gave a candidate for the support strategy it names, against the strategy annotated at that round.

A judge worth training against rewards the candidate that names (and carries out) the strategy that fits this moment
of the conversation; one that rewards a strategy whatever the moment teaches the policy to name it everywhere. Read
from each GRPO arm's logged candidates (``<arm>/completions.jsonl``: ``dialogue_id``, ``round_index``, the judge's
total), grouped as :func:`compeer_loop.report_groups.scored_groups` groups them; a candidate's edge is its judge total
(:func:`compeer_loop.report_groups.judge_total`) minus its group's mean. The annotated strategy of a round comes from
the ESConv train file the loop's prompts were built from (its path and sha256 in ``prompts-manifest.json``; a
relative path is read from the working directory, as ``compeer-loop prompts`` was run from the repository root), read
with the dataset pipeline's own ingest (:func:`data_builder.ingest.ingest_files`,
:func:`data_builder.policy_negatives.strategy_at`); where that file is not found here, or differs, the table says so.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from compeer_loop.report_groups import judge_total, scored_groups
from compeer_loop.report_runs import arm_logs
from compeer_loop.seeds import Replicate
from data_builder.ingest import ingest_files
from data_builder.policy_negatives import COMPLETIONS_FILE, strategy_at
from evaluator.prompts import cer_reply

#: a strategy named by fewer candidates (where it is not the annotated one) is not ranked as the judge's favourite
MIN_NAMED = 30
N_BOOT = 1000


@lru_cache(maxsize=4)
def _turns_by_dialogue(path: str) -> dict[str, list[dict[str, Any]]]:
    dialogues, _ = ingest_files([Path(path)], "esconv")
    return {str(d["id"]): list(d["turns"]) for d in dialogues}


def annotated_turns(root: Path) -> tuple[dict[str, list[dict[str, Any]]] | None, str]:
    """The train dialogues' turns by dialogue id (None when unavailable) and a phrase naming the file, or why not."""
    manifest = root / "prompts-manifest.json"
    train = json.loads(manifest.read_text()).get("inputs", {}).get("train", {}) if manifest.exists() else {}
    path, sha = train.get("path"), train.get("sha256")
    if not path or not sha:
        return None, f"no train file named in {manifest}"
    if not Path(path).is_file():
        return None, f"the train file `{path}` (sha256 {sha[:12]}) is not found here"
    if hashlib.sha256(Path(path).read_bytes()).hexdigest() != sha:
        return None, f"`{path}` here differs from the file the prompts were built from (sha256 {sha[:12]})"
    return _turns_by_dialogue(str(Path(path).resolve())), f"`{path}` (sha256 {sha[:12]})"


def _edge(cells: Sequence[tuple[int, float]], n_groups: int, seed: int = 0) -> dict[str, Any] | None:
    """Mean edge of ``(group index, edge)`` cells with a 95% interval, the groups resampled with replacement."""
    if not cells:
        return None
    idx = np.array([g for g, _ in cells])
    val = np.array([e for _, e in cells])
    sums = np.bincount(idx, weights=val, minlength=n_groups)
    counts = np.bincount(idx, minlength=n_groups)
    draws = np.random.default_rng(seed).integers(0, n_groups, size=(N_BOOT, n_groups))
    s, c = sums[draws].sum(axis=1), counts[draws].sum(axis=1)
    means = s[c > 0] / c[c > 0]
    return {"mean": float(val.mean()), "lo": float(np.percentile(means, 2.5)), "hi": float(np.percentile(means, 97.5)),
            "n": len(cells)}


def _components(r: dict[str, Any]) -> np.ndarray | None:
    """A candidate's discrete verdicts as one vector: steps 1-3, preference, format (None when not all logged)."""
    steps, pref, fmt = r.get("steps"), r.get("preference"), r.get("format")
    if not isinstance(steps, list) or len(steps) != 3 or pref is None or fmt is None:
        return None
    return np.array([*steps, pref, fmt], dtype=float)


def strategy_edges(rows: Sequence[dict[str, Any]], turns: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """For one arm's logged candidates: ``groups`` (scored groups whose round has an annotated strategy), ``right`` /
    ``wrong`` (the edge of candidates naming the annotated strategy / another one; :func:`_edge`) and ``favourite``
    (the strategy with the largest edge where it is not the annotated one, among those named so at least
    :data:`MIN_NAMED` times, with its edge; None when none is) and ``favourite_parts`` (its edge per discrete
    component: steps 1-3, preference, format; None without them)."""
    right: list[tuple[int, float]] = []
    wrong: list[tuple[int, float]] = []
    by_strategy: dict[str, list[tuple[int, float]]] = defaultdict(list)
    parts_by_strategy: dict[str, list[np.ndarray]] = defaultdict(list)
    n = 0
    for group in scored_groups(rows):
        first = group[0]
        round_index = first.get("round_index")
        gold = (strategy_at(turns.get(str(first.get("dialogue_id")), []), round_index)
                if isinstance(round_index, int) else None)
        if gold is None:
            continue
        mean = float(np.mean([judge_total(r) for r in group]))
        parts = [_components(r) for r in group]
        known = [p for p in parts if p is not None]
        parts_mean = np.mean(known, axis=0) if len(known) == len(parts) else None
        for r, part in zip(group, parts):
            named = cer_reply(str(r.get("text", "")))["strategy"]
            if named is None:
                continue
            cell = (n, judge_total(r) - mean)
            if named == gold:
                right.append(cell)
            else:
                wrong.append(cell)
                by_strategy[named].append(cell)
                if parts_mean is not None and part is not None:
                    parts_by_strategy[named].append(part - parts_mean)
        n += 1
    ranked = [(float(np.mean([e for _, e in cs])), s) for s, cs in by_strategy.items() if len(cs) >= MIN_NAMED]
    fav = max(ranked)[1] if ranked else None
    fav_parts = parts_by_strategy.get(fav) if fav else None
    return {"groups": n, "right": _edge(right, n), "wrong": _edge(wrong, n),
            "favourite": (fav, _edge(by_strategy[fav], n)) if fav else None,
            "favourite_parts": [float(x) for x in np.mean(fav_parts, axis=0)] if fav_parts else None}


def _cell(e: dict[str, Any] | None) -> str:
    return "n/a" if e is None else f"{e['mean']:+.3f} [{e['lo']:+.3f}, {e['hi']:+.3f}] ({e['n']})"


def strategy_section(reps: Sequence[Replicate]) -> list[str]:
    """The table (a row per GRPO arm, per seed when several) with its explanation; no lines when no arm logged its
    completions, a line saying why when the annotated strategies cannot be read."""
    logged = list(arm_logs(reps, COMPLETIONS_FILE))
    if not logged:
        return []
    turns, source = annotated_turns(reps[0].root)
    intro = ("What the judge favoured in training, by the strategy a candidate names: inside each logged rollout group, "
             "a candidate's judge total minus its group's mean (its edge), for candidates naming the strategy annotated "
             "at that round of ESConv train and for those naming another; then the strategy the judge favoured most "
             f"where it was not the annotated one (named so at least {MIN_NAMED} times; the largest of up to eight, so "
             "its interval, not corrected for that choice, overstates the certainty), and which discrete verdicts "
             "carry its edge. Intervals: the groups resampled "
             f"({N_BOOT} times). A judge that follows the moment gives the annotated strategy the larger edge")
    if turns is None:
        return ["", f"{intro}; not computed here: {source}."]
    rows = []
    for tag, cands in logged:
        f = strategy_edges(cands, turns)
        fav = "n/a" if f["favourite"] is None else f"{f['favourite'][0]}: {_cell(f['favourite'][1])}"
        parts = "n/a" if f["favourite_parts"] is None else " / ".join(f"{x:+.3f}" for x in f["favourite_parts"])
        rows.append(f"| {tag} | {f['groups']} | {_cell(f['right'])} | {_cell(f['wrong'])} | {fav} | {parts} |")
    return ["", f"{intro}. Annotations read from {source}:", "",
            ("| arm | groups | edge, names the annotated strategy (n) | edge, names another (n) | favoured most where "
             "not annotated: edge (n) | its edge by verdict: step 1 / 2 / 3 / preference / format |"),
            "|---|---|---|---|---|---|", *rows]
