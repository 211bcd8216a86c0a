"""Loop folders trained on different machines, merged into one for one report.

A lent GPU machine is held 30 minutes at most, so the arms of one comparison may be trained on two: the first
trains the warm-up (arm a) and some arms, the second restores that warm-up (``tools/gpu/compeer_loop.sh export`` /
``import``) and trains the others. The comparison stays fair only if every arm had the same settings and started
from the same warm-up bytes, so :func:`merge_roots` refuses folders whose plans differ in anything but which arms,
evaluations and PRM/ORM adapters they ran, or whose recorded warm-up sha256 differ. Each arm and each evaluation
comes from the one folder that trained or evaluated it; a second folder holding it too is an error.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from compeer_loop.plan import ARMS, BASE_POLICY, LoopSettings
from compeer_loop.runner import PLAN_FILE, STATE_FILE, load_settings

#: written in ``a/`` when the warm-up was restored from another machine's export, not trained here
RESTORED = "RESTORED"
#: written in a GRPO arm's folder when ``compeer_loop.sh export`` sent its state to another machine, which continues it
EXPORTED = "EXPORTED"
MANIFEST = "prompts-manifest.json"
#: plan fields that may differ between merged folders (what ran where); every other setting must be equal
#: (``cards`` and ``max_concurrent_arms`` place processes on a machine's GPUs; they change no number)
MAY_DIFFER = ("arms", "eval_policies", "prm_adapter", "orm_adapter", "cards", "max_concurrent_arms")


def plan_differences(first: LoopSettings, other: LoopSettings, may_differ: Iterable[str] = MAY_DIFFER) -> list[str]:
    """The plan fields, other than ``may_differ``, in which two loop folders' plans differ (sorted)."""
    a, b, free = first.to_json(), other.to_json(), set(may_differ)
    return sorted(k for k in a.keys() | b.keys() if k not in free and a.get(k) != b.get(k))


def check_comparable(sources: Sequence[Path], plans: Sequence[LoopSettings],
                     may_differ: Iterable[str] = MAY_DIFFER) -> None:
    """Refuse loop folders whose arms cannot be compared: a plan differing from the first folder's in a field other
    than ``may_differ`` (:func:`plan_differences`), or another prompt set (``prompts-manifest.json``). One rule for
    ``compeer-loop merge`` (:data:`MAY_DIFFER`) and for seed replicates (``seed`` may differ too,
    :mod:`compeer_loop.seeds`)."""
    free = tuple(may_differ)
    for src, plan in zip(sources[1:], plans[1:]):
        diff = plan_differences(plans[0], plan, free)
        if diff:
            raise ValueError(f"{src} was planned with other settings than {sources[0]} ({', '.join(diff)}; only "
                             f"{', '.join(free)} may differ): its arms are not comparable")
    manifests = {(s / MANIFEST).read_text() for s in sources if (s / MANIFEST).exists()}
    if len(manifests) > 1:
        raise ValueError(f"the folders {', '.join(map(str, sources))} were trained on different prompt sets (their "
                         "prompts-manifest.json differ)")


def _state(root: Path) -> dict[str, Any]:
    path = root / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _owner(sources: list[Path], rel: str, what: str) -> Path | None:
    """The one source holding ``rel`` (None: none does), not counting a warm-up restored from another machine
    (``a/RESTORED``, written by ``compeer_loop.sh import``) nor an arm sent on to another machine (``ARM/EXPORTED``,
    written by ``compeer_loop.sh export``: the importing machine's folder holds it, continued); two holding it is
    ambiguous."""
    found = [s for s in sources if (s / rel).exists() and not (s / rel / RESTORED).exists()
             and not (s / rel / EXPORTED).exists()]
    if len(found) > 1:
        raise ValueError(f"{what} is in more than one folder ({', '.join(map(str, found))}): keep it in one")
    return found[0] if found else None


def merge_roots(sources: list[Path], out: Path) -> LoopSettings:
    """Merge loop folders ``sources`` into ``out`` (created; must not exist); returns the merged settings."""
    if len(sources) < 2:
        raise ValueError("merge needs at least two loop folders")
    if out.exists():
        raise ValueError(f"{out} exists: merge writes a new folder")
    plans = [load_settings(s) for s in sources]
    check_comparable(sources, plans)
    first = plans[0].to_json()
    states = [_state(s) for s in sources]
    hashes = {st["warmup_sha256"] for st in states if st.get("warmup_sha256")}
    if len(hashes) > 1:
        raise ValueError(f"the folders' GRPO arms started from different warm-ups (sha256 {sorted(hashes)})")

    arms = [a.name for a in ARMS if any(a.name in p.arms for p in plans)]
    evals = [p for p in [BASE_POLICY, *arms] if any(p in pl.eval_policies for pl in plans)]
    merged = LoopSettings.from_json({**first, "arms": arms, "eval_policies": evals,
                                     "prm_adapter": next((p.prm_adapter for p in plans if p.prm_adapter), None),
                                     "orm_adapter": next((p.orm_adapter for p in plans if p.orm_adapter), None)})
    state: dict[str, Any] = {"arms": {}, "eval": {}, "restarts": {}, "parts": []}
    if hashes:
        state["warmup_sha256"] = hashes.pop()
    out.mkdir(parents=True)
    trained: dict[Path, list[str]] = {s: [] for s in sources}
    for arm in arms:
        owner = _owner(sources, arm, f"arm ({arm})")
        if owner is None:
            continue
        trained[owner].append(arm)
        shutil.copytree(owner / arm, out / arm)
        st = states[sources.index(owner)]
        if arm in st.get("arms", {}):
            state["arms"][arm] = st["arms"][arm]
        if arm in st.get("restarts", {}):
            state["restarts"][arm] = st["restarts"][arm]
    evaluated: dict[Path, list[str]] = {s: [] for s in sources}
    for policy in evals:
        owner = _owner(sources, f"eval/{policy}/done.json", f"the evaluation of {policy}")
        if owner is None:
            continue
        evaluated[owner].append(policy)
        shutil.copytree(owner / "eval" / policy, out / "eval" / policy)
        state["eval"][policy] = states[sources.index(owner)].get("eval", {}).get(policy, "done")
    for src, st in zip(sources, states):
        state["parts"].append({"root": src.name, "elapsed_s": st.get("elapsed_s", 0.0), "arms": trained[src],
                               "eval": evaluated[src], "machine": st.get("machine"),
                               "placement": st.get("placement")})
        if (src / MANIFEST).exists() and not (out / MANIFEST).exists():
            shutil.copy2(src / MANIFEST, out / MANIFEST)
    state["elapsed_s"] = sum(p["elapsed_s"] for p in state["parts"])
    (out / PLAN_FILE).write_text(json.dumps(merged.to_json(), indent=2) + "\n")
    (out / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
    return merged
