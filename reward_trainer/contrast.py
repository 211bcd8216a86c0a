"""Reward AUC: does the service's total reward rank a real supporter turn above each kind of negative?

Input: ``compeer-data contrast`` groups (a real turn with correct reasoning and one candidate per kind of
negative, see :mod:`data_builder.contrast`). Every candidate is judged by the serving judge
(:class:`judge.conversation.Judge`) in unified mode and rewarded by the service's rules
(:func:`judge.conversation.judgment_rewards`: the discrete ``total`` and the graded one, what the service returns),
once per reference: ``gold`` (the real turn, as GRPO sends it) and ``other_round`` (the reply of another round, so no
candidate repeats the reference). Per judge, reference, reward kind (discrete, graded) and kind of negative: the AUC of
the total, positive vs negative (ties count half), and the within-group win / tie / loss shares. A candidate whose
total is null (parse failure, engine error, and for the graded total missing verdict probabilities) is counted as
unscored and left out of that AUC, never given a score. Every kind of negative present in the groups is reported, in
:data:`data_builder.contrast.NEGATIVE_KINDS` order first, then any other in first-seen order. ``contrast.json`` also
keeps every candidate's verdicts and label probabilities (``judgments``, no text), group by group in the order of
``totals``, so the rewards can be recomputed from them (``reward_trainer calibrate --contrast``).
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
from cer.rewards import RewardKind
from data_builder.contrast import NEGATIVE_KINDS
from data_builder.records import read_jsonl
from judge.conversation import CandidateJudgment, judgment_rewards
from judge.engines.base import EngineError
from reward_trainer.metrics import label_str
from reward_trainer.predict import JudgeRuntime, make_judge, open_engine

log = logging.getLogger(__name__)

REFERENCES: tuple[str, ...] = ("gold", "other_round")
POSITIVE = "positive"
#: The reward kinds reported, in table order.
REWARD_KINDS: tuple[str, ...] = (RewardKind.DISCRETE.value, RewardKind.GRADED.value)
#: One group's totals: kind of candidate -> reward kind -> total (None: unscored).
GroupTotals = dict[str, dict[str, float | None]]
#: One group's judgments: kind of candidate -> what the judge said (:func:`judgment_record`; None: engine error).
GroupJudgments = dict[str, dict[str, Any] | None]


def judgment_record(j: CandidateJudgment) -> dict[str, Any]:
    """The verdicts and label probabilities of a judgment (JSON-able; no text), so rewards can be recomputed
    from it, e.g. under another verdict temperature (:mod:`reward_trainer.calibrate`)."""
    return {"verdicts": {c: label_str(v) for c, v in j.verdicts.items()}, "probs": dict(j.probs)}


@dataclass
class ContrastOptions:
    """What ``compeer-train judge-contrast`` scores: the groups, the judges (label -> adapter or None), the runtime."""

    groups_path: Path
    out_dir: Path
    judges: dict[str, str | None] = field(default_factory=dict)
    runtime: JudgeRuntime = field(default_factory=JudgeRuntime)
    max_groups: int | None = None
    #: the references each group is judged against (:data:`REFERENCES`, in that order); ``("gold",)`` halves the
    #: judgments, e.g. on a CPU
    references: tuple[str, ...] = REFERENCES

    def __post_init__(self) -> None:
        """ValueError for an empty or unknown reference (names the known ones)."""
        unknown = [r for r in self.references if r not in REFERENCES]
        if not self.references or unknown:
            raise ValueError(f"references {list(self.references)}: expected one or more of {', '.join(REFERENCES)}")


def auc(pos: list[float], neg: list[float]) -> float | None:
    """P(a positive's total > a negative's) + 0.5 P(equal), over all pairs; None without both."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def negative_kinds(totals: list[dict[str, Any]]) -> list[str]:
    """The kinds of negative present in the groups: those of :data:`data_builder.contrast.NEGATIVE_KINDS` in its
    order, then any other in first-seen order."""
    seen = list(dict.fromkeys(k for t in totals for k in t if k != POSITIVE))
    return [k for k in NEGATIVE_KINDS if k in seen] + [k for k in seen if k not in NEGATIVE_KINDS]


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


def summarise_kinds(totals: list[GroupTotals]) -> dict[str, Any]:
    """:func:`summarise` of each reward kind (:data:`REWARD_KINDS`)."""
    return {rk: summarise([{k: t[rk] for k, t in g.items()} for g in totals]) for rk in REWARD_KINDS}


async def _score_judge(options: ContrastOptions, adapter: str | None, groups: list[dict[str, Any]]
                       ) -> tuple[dict[str, list[GroupTotals]], dict[str, list[GroupJudgments]]]:
    rt = options.runtime
    gate = asyncio.Semaphore(max(1, rt.concurrency))
    async with open_engine(rt, adapter) as engine:
        judge = make_judge(engine, rt)

        async def total(history: list[Turn], reference: str,
                        candidate: str) -> tuple[dict[str, float | None], dict[str, Any] | None]:
            parsed = parse(candidate)
            async with gate:
                try:
                    j = await judge.judge(history, reference, parsed, JudgeMode.UNIFIED)
                except EngineError as exc:
                    log.warning("engine error on a contrast candidate: %s", type(exc).__name__)
                    return dict.fromkeys(REWARD_KINDS), None
            discrete, graded = judgment_rewards(j, parsed, JudgeMode.UNIFIED)
            return ({RewardKind.DISCRETE.value: discrete.total, RewardKind.GRADED.value: graded.total},
                    judgment_record(j))

        async def one(g: dict[str, Any], reference: str) -> tuple[GroupTotals, GroupJudgments]:
            history = [Turn.from_dict(t) for t in g["history"]]
            kinds = list(g["candidates"])
            scored = await asyncio.gather(*(total(history, reference, g["candidates"][k]) for k in kinds))
            return dict(zip(kinds, (t for t, _ in scored))), dict(zip(kinds, (r for _, r in scored)))

        out: dict[str, list[GroupTotals]] = {}
        records: dict[str, list[GroupJudgments]] = {}
        for name in options.references:
            usable = [g for g in groups if g["references"].get(name)]
            both = await asyncio.gather(*(one(g, g["references"][name]) for g in usable))
            out[name], records[name] = [t for t, _ in both], [r for _, r in both]
        return out, records


def _cells(s: dict[str, Any], kind: str) -> tuple[str, str, str]:
    """(AUC, win / tie / loss, unscored pos / neg) of one kind of negative in one summary ("n/a" when absent)."""
    k = s.get(kind)
    if k is None:
        return "n/a", "n/a", f"{s['positive_unscored']} / n/a"
    w = k["within_group"]
    wtl = "n/a" if w["win"] is None else f"{w['win']:.2f} / {w['tie']:.2f} / {w['loss']:.2f}"
    a = "n/a" if k["auc"] is None else f"{k['auc']:.3f}"
    return a, f"{wtl} (n {w['n']})", f"{s['positive_unscored']} / {k['negative_unscored']}"


def render_markdown(metrics: dict[str, Any]) -> str:
    """The contrast table: AUC and within-group wins of the discrete and the graded total per judge, reference and
    negative kind."""
    lines = ["# Reward AUC on contrast groups", "",
             ("AUC of the service's total reward (unified mode), the real turn with correct reasoning vs each kind of "
             "negative; ties count half: the discrete total (the paper's +1/-1 verdicts) and the graded one (expected "
             "rewards under the judge's verdict probabilities). Within-group: the share of groups where the real "
             "turn's total is higher / equal / lower than the negative's."), ""]
    lines += [("| Judge | Reference | Negative | AUC discrete | AUC graded | win / tie / loss discrete | "
               "win / tie / loss graded | unscored discrete (pos / neg) | unscored graded (pos / neg) |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for judge, by_ref in metrics["judges"].items():
        for reference, by_kind in by_ref.items():
            d, g = by_kind[RewardKind.DISCRETE.value], by_kind[RewardKind.GRADED.value]
            for kind in negative_kinds([{k: None for k in d["kinds"] + g["kinds"]}]):
                (da, dw, du), (ga, gw, gu) = _cells(d, kind), _cells(g, kind)
                lines.append(f"| {judge} | {reference} | {kind} | {da} | {ga} | {dw} | {gw} | {du} | {gu} |")
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
    metrics: dict[str, Any] = {"judges": {}, "totals": {}, "judgments": {}}
    for label, adapter in options.judges.items():
        totals, records = await _score_judge(options, adapter, groups)
        metrics["judges"][label] = {ref: summarise_kinds(t) for ref, t in totals.items()}
        metrics["totals"][label] = totals
        metrics["judgments"][label] = records
    rt = options.runtime
    metrics["meta"] = {"groups": str(options.groups_path), "n_groups": len(groups), "backend": rt.engine.backend,
                       "model": rt.engine.model, "template": rt.template, "adapters": dict(options.judges),
                       "references": list(options.references),
                       "settings": rt.settings.__dict__, "seconds": round(time.monotonic() - started, 1)}
    options.out_dir.mkdir(parents=True, exist_ok=True)
    (options.out_dir / "contrast.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    (options.out_dir / "contrast.md").write_text(render_markdown(metrics), encoding="utf-8")
    return metrics


__all__ = ["POSITIVE", "REFERENCES", "REWARD_KINDS", "ContrastOptions", "auc", "negative_kinds", "render_markdown",
           "run_contrast", "summarise", "summarise_kinds"]
