"""``compeer-loop rejudge``: finished evaluations of a loop folder judged again by another UnifiReward judge.

A judge's bias shows in the replies the loop's policies wrote (e.g. the report's "Questions out of place": v3 pays
for a short question where the annotated strategy is another one). :func:`rejudge` measures a candidate judge on those
same replies without training a policy against it: it copies the loop folder ``ROOT`` to a new ``NEWROOT`` (process
ids and the old judge's answers ``eval/*/scored.jsonl`` left out), sends every answered record of each evaluated
policy to the reward server at ``--address`` (whatever judge it serves: ``compeer-reward serve --adapter ...``), as
``compeer-loop eval`` does (:func:`compeer_loop.evaluate.score`, one candidate per group, unified), and replaces the
records' ``judge_*`` / ``reward_*`` fields; everything else stays as it was (the replies, the independent scorer's
comparisons, ``esc.json``). A reply the server could not judge keeps that status and no reward, never a made-up one.
``NEWROOT/rejudged.json`` names the judge the server reported (its ``Info``: base, revision, adapter), from where and
when, with the judge statuses per policy; the report then names that judge as the one whose scores it shows. Dialogue
text is never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compeer_loop.evaluate import score
from compeer_loop.prompts import read_jsonl
from compeer_loop.rescore import RECORDS, copy_ignoring, evaluated_policies, utc_now
from data_builder.records import write_jsonl
from reward_server.client import RewardClient

log = logging.getLogger(__name__)
REJUDGED_FILE, SCORED = "rejudged.json", "scored.jsonl"
#: the record fields a judgment writes (compeer_loop.evaluate._score_fields), replaced as a whole
JUDGE_FIELDS = ("judge_", "reward_")


async def served_judge(address: str) -> dict[str, Any]:
    """The judge the server at ``address`` serves, from its ``Info``: model, revision, adapter, backend, graded."""
    async with RewardClient([address], timeout_s=30.0) as client:
        info = (await client.info()).to_json()
    return {k: info.get(k) for k in ("model", "revision", "adapter", "backend", "graded")}


def replace_judgments(records: list[dict[str, Any]], scores: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with the judgment fields of every answered record (``status == "ok"``) replaced by its new
    judgment in ``scores`` (by ``id``; an answered record without one gets ``judge_status: call_failed``); the
    records not answered stay as they were."""
    out = []
    for r in records:
        if r.get("status") != "ok":
            out.append(r)
            continue
        new = {k: v for k, v in scores.get(r["id"], {"judge_status": "call_failed"}).items() if k != "id"}
        out.append({**{k: v for k, v in r.items() if not k.startswith(JUDGE_FIELDS)}, **new})
    return out


def rejudge(root: Path, out: Path, address: str, policies: Sequence[str] | None = None) -> dict[str, Any]:
    """Copy loop folder ``root`` to ``out`` (which must not exist, or be empty) and judge its evaluated policies'
    records again (``policies``: those only; default every ``eval/*/records.jsonl``) with the reward server at
    ``address``. Returns ``rejudged.json``'s content. ValueError before anything is copied for a bad ``out`` or
    policy; a server that does not answer ``Info`` stops it before the copy too."""
    names = evaluated_policies(root, out, policies)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty: pass a new folder")
    judge = asyncio.run(served_judge(address))
    if out.exists():
        out.rmdir()  # empty, checked above
    shutil.copytree(root, out, ignore=copy_ignoring(SCORED))  # the old judge's answers left out
    state: dict[str, Any] = {"from": str(root.resolve()), "address": address, "judge": judge,
                             "started": utc_now(), "policies": {}}
    for name in names:
        folder = out / "eval" / name
        records = read_jsonl(folder / RECORDS)
        scores = asyncio.run(score(records, address, folder / SCORED))
        judged = replace_judgments(records, scores)
        write_jsonl(folder / RECORDS, judged)  # a temporary file renamed into place
        statuses = dict(Counter(str(r.get("judge_status")) for r in judged if r.get("status") == "ok"))
        log.info("re-judged %s: %s", name, statuses)
        state["policies"][name] = {"records": len(judged), "judge_status": statuses}
    state["finished"] = utc_now()
    (out / REJUDGED_FILE).write_text(json.dumps(state, indent=2) + "\n")
    return state


def judge_phrase(root: Path) -> str:
    """Who judged the records of loop folder ``root``: the judge ``rejudged.json`` names, else the loop's own."""
    path = root / REJUDGED_FILE
    if not path.is_file():
        return "the shipped trained judge (unified mode)"
    j = json.loads(path.read_text())["judge"]
    return (f"{j.get('model')} + adapter {j.get('adapter') or 'none (bare base)'} (unified mode), re-judged by "
            f"`compeer-loop rejudge` ({REJUDGED_FILE}; the arms were trained against the judge named in their rows)")
