"""Reward AUC: does the service's total reward rank a real supporter turn above each kind of negative?

Input: ``compeer-data contrast`` groups (a real turn with correct reasoning and one candidate per kind of
negative, see :mod:`data_builder.contrast`). Every candidate is judged by the serving judge
(:class:`judge.conversation.Judge`) in unified mode and rewarded by the service's rules
(:func:`cer.rewards.candidate_rewards`, what the service's ``total`` is), once per reference: ``gold`` (the real
turn, as GRPO sends it) and ``other_round`` (the reply of another round, so no candidate repeats the reference). Per
judge, reference and kind: the AUC of the total reward, positive vs negative (ties count half), and the within-group
win / tie / loss shares. A candidate whose total is null (parse failure, engine error) is counted as unscored and
left out of the AUC, never given a score.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.verdicts import Preference
from data_builder.records import read_jsonl
from judge.engines.base import EngineError
from judge.protocol import PREFERENCE, STEP_COMPONENTS
from reward_trainer.predict import JudgeRuntime, make_judge, open_engine

log = logging.getLogger(__name__)

REFERENCES: tuple[str, ...] = ("gold", "other_round")
POSITIVE = "positive"


@dataclass
class ContrastOptions:
    """What ``compeer-train judge-contrast`` scores: the groups, the judges (label -> adapter or None), the runtime."""

    groups_path: Path
    out_dir: Path
    judges: dict[str, str | None] = field(default_factory=dict)
    runtime: JudgeRuntime = field(default_factory=JudgeRuntime)
    max_groups: int | None = None


def auc(pos: list[float], neg: list[float]) -> float | None:
    """P(a positive's total > a negative's) + 0.5 P(equal), over all pairs; None without both."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def negative_kinds(totals: list[dict[str, float | None]]) -> list[str]:
    """The kinds of negative present in the groups, in first-seen order."""
    return list(dict.fromkeys(k for t in totals for k in t if k != POSITIVE))


def summarise(totals: list[dict[str, float | None]]) -> dict[str, Any]:
    """Per negative kind: AUC, within-group win/tie/loss shares and unscored counts, from per-group totals."""
    pos = [p for t in totals if (p := t.get(POSITIVE)) is not None]
    out: dict[str, Any] = {"groups": len(totals), "positive_unscored": len(totals) - len(pos),
                           "positive_mean_total": _mean(pos), "kinds": negative_kinds(totals)}
    for kind in out["kinds"]:
        present = [t for t in totals if kind in t]
        neg = [n for t in present if (n := t[kind]) is not None]
        pairs = [(p, n) for t in present if (p := t.get(POSITIVE)) is not None and (n := t[kind]) is not None]
        k = len(pairs)
        out[kind] = {
            "auc": auc(pos, neg), "n_negative": len(neg), "negative_unscored": len(present) - len(neg),
            "negative_mean_total": _mean(neg),
            "within_group": {"n": k, "win": sum(p > n for p, n in pairs) / k if k else None,
                             "tie": sum(p == n for p, n in pairs) / k if k else None,
                             "loss": sum(p < n for p, n in pairs) / k if k else None},
        }
    return out


async def _score_judge(options: ContrastOptions, adapter: str | None,
                       groups: list[dict[str, Any]]) -> dict[str, list[dict[str, float | None]]]:
    from cer.rewards import candidate_rewards

    rt = options.runtime
    gate = asyncio.Semaphore(max(1, rt.concurrency))
    async with open_engine(rt, adapter) as engine:
        judge = make_judge(engine, rt)

        async def total(history: list[Turn], reference: str, candidate: str) -> float | None:
            parsed = parse(candidate)
            async with gate:
                try:
                    j = await judge.judge(history, reference, parsed, JudgeMode.UNIFIED)
                except EngineError as exc:
                    log.warning("engine error on a contrast candidate: %s", type(exc).__name__)
                    return None
            verdicts = [v if isinstance(v := j.verdicts.get(c), bool) else None for c in STEP_COMPONENTS]
            pref = j.verdicts.get(PREFERENCE)
            return candidate_rewards(parsed, JudgeMode.UNIFIED, verdicts,
                                     pref if isinstance(pref, Preference) else None).total

        async def one(g: dict[str, Any], reference: str) -> dict[str, float | None]:
            history = [Turn.from_dict(t) for t in g["history"]]
            kinds = list(g["candidates"])
            totals = await asyncio.gather(*(total(history, reference, g["candidates"][k]) for k in kinds))
            return dict(zip(kinds, totals))

        out: dict[str, list[dict[str, float | None]]] = {}
        for name in REFERENCES:
            usable = [g for g in groups if g["references"].get(name)]
            out[name] = list(await asyncio.gather(*(one(g, g["references"][name]) for g in usable)))
        return out


def render_markdown(metrics: dict[str, Any]) -> str:
    """The contrast table: AUC and within-group wins per judge, reference and negative kind."""
    lines = ["# Reward AUC on contrast groups", "",
             ("AUC of the service's total reward (unified mode), the real turn with correct reasoning vs each kind of "
             "negative; ties count half. Within-group: the share of groups where the real turn's total is higher / "
             "equal / lower than the negative's."), ""]
    lines += ["| Judge | Reference | Negative | AUC | win / tie / loss | n | unscored (pos / neg) |",
              "|---|---|---|---|---|---|---|"]
    for judge, by_ref in metrics["judges"].items():
        for reference, s in by_ref.items():
            for kind in s["kinds"]:
                k = s[kind]
                w = k["within_group"]
                wtl = "n/a" if w["win"] is None else f"{w['win']:.2f} / {w['tie']:.2f} / {w['loss']:.2f}"
                a = "n/a" if k["auc"] is None else f"{k['auc']:.3f}"
                lines.append(f"| {judge} | {reference} | {kind} | {a} | {wtl} | {w['n']} | "
                             f"{s['positive_unscored']} / {k['negative_unscored']} |")
    return "\n".join(lines) + "\n"


async def run_contrast(options: ContrastOptions) -> dict[str, Any]:
    """Score the groups with every judge; write ``contrast.json`` and ``contrast.md`` under ``out_dir``."""
    started = time.monotonic()
    groups = list(read_jsonl(options.groups_path))
    if options.max_groups is not None:
        groups = groups[: options.max_groups]
    if not groups:
        raise ValueError(f"{options.groups_path}: no contrast groups")
    if not options.judges:
        raise ValueError("no judge to score: pass --adapter and/or keep the base judge")
    metrics: dict[str, Any] = {"judges": {}, "totals": {}}
    for label, adapter in options.judges.items():
        totals = await _score_judge(options, adapter, groups)
        metrics["judges"][label] = {ref: summarise(t) for ref, t in totals.items()}
        metrics["totals"][label] = totals
    rt = options.runtime
    metrics["meta"] = {"groups": str(options.groups_path), "n_groups": len(groups), "backend": rt.backend,
                       "model": rt.model, "template": rt.template, "adapters": dict(options.judges),
                       "settings": rt.settings.__dict__, "seconds": round(time.monotonic() - started, 1)}
    options.out_dir.mkdir(parents=True, exist_ok=True)
    (options.out_dir / "contrast.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    (options.out_dir / "contrast.md").write_text(render_markdown(metrics), encoding="utf-8")
    return metrics


__all__ = ["POSITIVE", "REFERENCES", "ContrastOptions", "auc", "render_markdown", "run_contrast", "summarise"]
