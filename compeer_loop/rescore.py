"""``compeer-loop rescore``: finished evaluations of a loop folder scored again by another independent scorer.

The default scorer (``judge-base``) is the bare base of the default judge, which arm (b) trains against, so its
comparisons are not independent for (b) (``report_runs.scored_by_training_weights``). :func:`rescore` copies the
loop folder ``ROOT`` to a new ``NEWROOT`` (process ids and the old scorer's answer caches ``eval/*/compared`` left
out), runs :func:`compeer_loop.independent.compare_replies` again over each evaluated policy's ``records.jsonl``
with the new scorer (the engine ``compeer-loop eval`` scores with: :func:`compeer_loop.evaluate.scorer_role`,
answers cached in ``NEWROOT/eval/<policy>/compared``) and replaces the ``independent_*`` fields of the answered
records (``status == "ok"``); every other field and every other record stays as it was. A failed answer or engine
error is recorded as such with no win, never scored. Nothing else is re-run: the trained judge's rewards are kept,
and so is the ESC-Eval-style step (``esc.json``), whose simulator and scorer stay the old scorer's.

Each policy's records are written to a temporary file and renamed into place, and ``NEWROOT/rescored.json`` (the
source, the scorer, when, counts per status) records each policy once it is done: a killed run is resumed by the
same command (same ROOT, scorer and policies), which skips the finished policies. ``plan.json``'s
``independent_scorer`` becomes the new scorer (served bare: ``independent_scorer_adapter`` none) when every policy
is done. Dialogue text is never logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from compeer_loop.independent import compare_replies
from compeer_loop.plan import NO_SCORER, LoopSettings
from compeer_loop.prompts import read_jsonl
from compeer_loop.runner import PLAN_FILE, load_settings
from data_builder.records import write_jsonl
from evaluator.backends import ChatRole

log = logging.getLogger(__name__)
RESCORED_FILE, RECORDS = "rescored.json", "records.jsonl"
#: what the command does not re-run, as ``rescored.json`` and the help text say it
NOT_RERUN = ("the ESC-Eval-style step (eval/*/esc.json keeps the old scorer as simulator and scorer) and the trained "
             "judge's rewards are not re-run")
#: opens the scorer of settings ``s`` for one policy's evaluation folder (:func:`compeer_loop.evaluate.scorer_role`)
OpenScorer = Callable[[LoopSettings, Path], AbstractAsyncContextManager[ChatRole | None]]


def utc_now() -> str:
    """The time now, UTC, as the re-run state files write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` to ``path`` through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def copy_ignoring(old_answers: str) -> Callable[[str, list[str]], set[str]]:
    """The ``shutil.copytree`` ignore of a re-run's copy of a loop folder: the process ids of ROOT's processes, and
    ``old_answers`` (what the re-run replaces) in each ``eval/<policy>/`` folder."""
    def skip(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n == "pid" or n.endswith(".pid")
                or (n == old_answers and Path(folder).parent.name == "eval")}
    return skip


def _resumed(root: Path, out: Path, scorer: str, policies: list[str]) -> dict[str, Any] | None:
    """The unfinished re-score of the same root, scorer and policies in ``out`` (resumed), None when ``out`` does not
    exist or is empty; ValueError for any other existing, non-empty ``out``."""
    if not out.exists() or not any(out.iterdir()):
        return None
    state_path = out / RESCORED_FILE
    state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if state.get("status") == "running" and state.get("from") == str(root.resolve()) \
            and state.get("scorer") == scorer and state.get("order") == policies:
        log.info("resuming the re-score in %s (%d of %d policies done)", out, len(state["policies"]), len(policies))
        return state
    raise ValueError(f"--out {out} exists and is not empty (nor an unfinished re-score of {root} with --scorer "
                     f"{scorer} and these policies): pass a new folder")


def _copy(root: Path, out: Path, scorer: str, policies: list[str]) -> dict[str, Any]:
    """``out`` (absent or empty) made a copy of ``root``, and ``rescored.json`` begun there."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-copy-"))
    try:
        shutil.copytree(root, tmp / "root", ignore=copy_ignoring("compared"))
        if out.exists():
            out.rmdir()  # empty, checked above
        (tmp / "root").rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    state = {"from": str(root.resolve()), "scorer": scorer, "order": policies, "status": "running",
             "started": utc_now(), "not_rerun": NOT_RERUN, "policies": {}}
    _write_json(out / RESCORED_FILE, state)
    return state


async def rescore_records(records: list[dict[str, Any]], scorer: ChatRole,
                          concurrency: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``records`` with the ``independent_*`` fields of every answered record (``status == "ok"``) replaced by
    ``scorer``'s comparisons (:func:`compeer_loop.independent.compare_replies`), the others as they were; and the
    counts (records, re-scored, per ``independent_status``, the scorers named before and now)."""
    compared = await compare_replies(records, scorer, concurrency)
    out = []
    for r in records:
        new = compared.get(r.get("id", "")) if r.get("status") == "ok" else None
        out.append(r if new is None else {**{k: v for k, v in r.items() if not k.startswith("independent_")}, **new})
    counts = {"records": len(records), "rescored": len(compared),
              "independent_status": dict(Counter(str(v["independent_status"]) for v in compared.values())),
              "previous_scorers": sorted({str(r["independent_scorer"]) for r in records if "independent_scorer" in r}),
              "scorer_identity": scorer.identity}
    return out, counts


async def _policy(folder: Path, s: LoopSettings, open_scorer: OpenScorer) -> dict[str, Any]:
    """One policy's records re-scored and written back atomically; returns its counts."""
    path = folder / RECORDS
    records = read_jsonl(path)
    async with open_scorer(s, folder) as scorer:
        if scorer is None:
            raise ValueError("independent_scorer none: nothing to re-score with")
        rescored, counts = await rescore_records(records, scorer, s.eval_concurrency)
    write_jsonl(path, rescored)  # a temporary file renamed into place
    return counts


def evaluated_policies(root: Path, out: Path, policies: Sequence[str] | None = None) -> list[str]:
    """The evaluated policies of loop folder ``root`` to copy into ``out`` and score again (``policies``, or every
    ``eval/*/records.jsonl``): ValueError when ``out`` lies inside ``root`` or a policy has no records."""
    if out.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"--out {out} is inside --root {root}: pass a folder outside it")
    found = sorted(p.parent.name for p in (root / "eval").glob(f"*/{RECORDS}"))
    names = list(policies) if policies else found
    missing = [p for p in names if p not in found]
    if missing or not names:
        raise ValueError(f"{root}: no evaluation records of {', '.join(missing) or 'any policy'} "
                         f"(evaluated: {', '.join(found) or 'none'})")
    return names


def rescore(root: Path, out: Path, scorer: str, policies: Sequence[str] | None = None,
            concurrency: int | None = None, open_scorer: OpenScorer | None = None) -> dict[str, Any]:
    """Copy loop folder ``root`` to ``out`` and re-score its evaluated policies (``policies``: those only; default
    every ``eval/*/records.jsonl``) with independent scorer ``scorer`` (a value of ``independent_scorer``: a folder,
    ``judge-base``, ``base:NAME``; served bare); ``concurrency``: requests in flight (default the plan's
    ``eval_concurrency``); ``open_scorer``: how the scorer is opened (default the ``eval`` command's,
    :func:`compeer_loop.evaluate.scorer_role`). Returns ``rescored.json``'s content. Raises ValueError /
    FileNotFoundError (a base whose packages are missing) before anything is copied."""
    if scorer == NO_SCORER:
        raise ValueError("--scorer none: nothing to re-score with")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1 (got {concurrency})")
    s = load_settings(root)
    new = dataclasses.replace(s, independent_scorer=scorer, independent_scorer_adapter="none",
                              eval_concurrency=concurrency or s.eval_concurrency)  # checked as a plan is
    names = evaluated_policies(root, out, policies)
    state = _resumed(root, out, scorer, names)
    if open_scorer is None:
        from compeer_loop.evaluate import scorer_role
        from compeer_loop.independent import scorer_spec

        scorer_spec(new)  # a named base converted (once) or refused here, before anything is copied
        open_scorer = scorer_role
    if state is None:
        state = _copy(root, out, scorer, names)
    for name in names:
        if name in state["policies"]:
            continue
        counts = asyncio.run(_policy(out / "eval" / name, new, open_scorer))
        log.info("re-scored %s: %s", name, counts["independent_status"])
        state["policies"][name] = {**counts, "at": utc_now()}
        _write_json(out / RESCORED_FILE, state)
    _write_json(out / PLAN_FILE, {**json.loads((out / PLAN_FILE).read_text()), "independent_scorer": scorer,
                                  "independent_scorer_adapter": "none"})
    state.update(status="done", finished=utc_now())
    _write_json(out / RESCORED_FILE, state)
    return state
