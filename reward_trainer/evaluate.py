"""Held-out evaluation of judges with the paper's Table 1 metrics, through the serving judge path.

Rows per variant: the trained judge (base + its adapter), the untrained base judge (same backend, same mode) and
the majority class (per component, taken from the train split). Output: ``OUT/metrics.json`` (per variant the
keys of :data:`reward_trainer.metrics.METRIC_KEYS`, ``judge``, ``adapter``, ``baselines`` and ``cues``: per judge,
whether its verdicts follow a question or a short candidate more than the labels do, :func:`cue_tables`),
``OUT/report.md``,
``OUT/confusion_<variant>_<judge>.png`` and ``OUT/predictions.jsonl`` (item keys, gold labels, verdicts and, from a
graded judge, the label probabilities; ``compeer-train judge-calibrate`` fits verdict temperatures on them). No text
unless ``save_texts`` (``--save-texts``): then each row's ``texts`` holds the judge's outputs, one per round.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cer.reasoning import reply_text
from data_builder.cues import judged_cue_table
from reward_trainer import VARIANTS
from reward_trainer.data import HELDOUT_SPLIT, TRAIN_SPLIT, load_judge_set
from reward_trainer.inconsistency import AuditResult, audit, common_keys, from_prm_orm, from_unified
from reward_trainer.metrics import VariantMetrics, label_str, majority_labels, score
from reward_trainer.predict import (
    EvalItem,
    JudgeRuntime,
    Prediction,
    components_of,
    items_from_rows,
    make_judge,
    model_ref,
    open_engine,
    predict,
)
from reward_trainer.report import plot_confusions, render_report

log = logging.getLogger(__name__)

TRAINED = "trained"
BASE = "base"
MAJORITY = "majority"


@dataclass
class EvalOptions:
    """What to evaluate and how (``compeer-train judge-eval``)."""

    data_dir: Path
    out_dir: Path
    adapters: dict[str, str] = field(default_factory=dict)
    variants: tuple[str, ...] = ()
    runtime: JudgeRuntime = field(default_factory=JudgeRuntime)
    max_items: int | None = None
    include_base: bool = True
    audit: bool = True
    auditor_backend: str | None = None
    auditor_model: str | None = None
    #: write the judge's outputs (one text per round) into predictions.jsonl; off by default (they may quote the dialogue)
    save_texts: bool = False

    def all_variants(self) -> list[str]:
        """Variants with an adapter first, then the extra ones asked for, each once, in VARIANTS order."""
        wanted = set(self.adapters) | set(self.variants)
        bad = wanted - set(VARIANTS)
        if bad:
            raise ValueError(f"variants {sorted(bad)}: expected {', '.join(VARIANTS)}")
        if not wanted:
            raise ValueError("nothing to evaluate: pass --adapter DIR (a trained judge) and/or --variants")
        return [v for v in VARIANTS if v in wanted]


@dataclass
class VariantData:
    """A variant's held-out items and the majority labels of its train split."""

    items: list[EvalItem]
    majority: dict[str, Any]


def load_variant(data_dir: Path, variant: str, max_items: int | None) -> VariantData:
    """Held-out items (at most ``max_items``) and majority labels of the variant's set."""
    sets = load_judge_set(data_dir, variant)
    if HELDOUT_SPLIT not in sets:
        raise ValueError(f"{data_dir}: the {variant} set has no {HELDOUT_SPLIT!r} split to evaluate on")
    items = items_from_rows(sets[HELDOUT_SPLIT], max_items)
    if not items:
        raise ValueError(f"{data_dir}: the {variant} held-out split is empty")
    source = sets[TRAIN_SPLIT] if TRAIN_SPLIT in sets and len(sets[TRAIN_SPLIT]) else sets[HELDOUT_SPLIT]
    train_gold = [g.gold for g in items_from_rows(source)]
    return VariantData(items, majority_labels(train_gold, components_of(variant)))


def score_predictions(variant: str, items: list[EvalItem], preds: list[Prediction]) -> VariantMetrics:
    """Table 1 figures of ``preds`` on ``items``."""
    return score([it.gold for it in items], [p.verdicts for p in preds], components_of(variant))


async def _judge_all(options: EvalOptions, data: dict[str, VariantData], variants: list[str],
                     adapter: str | None) -> dict[str, list[Prediction]]:
    runtime = options.runtime
    async with open_engine(runtime, adapter) as engine:
        judge = make_judge(engine, runtime)
        return {v: await predict(judge, data[v].items, v, runtime.concurrency) for v in variants}


async def _audit_all(options: EvalOptions, preds: dict[str, dict[str, list[Prediction]]]) -> dict[str, Any]:
    """Fig. 5a for every judge kind that has unified, prm and orm predictions."""
    runnable = {judge: p for judge, p in preds.items() if {"unified", "prm", "orm"} <= set(p)}
    if not runnable or not options.audit:
        return {}
    runtime = options.runtime
    out: dict[str, Any] = {}
    async with open_engine(runtime, None, model=options.auditor_model, backend=options.auditor_backend) as engine:
        for judge, p in runnable.items():
            uni, sep = common_keys(from_unified(p["unified"]), from_prm_orm(p["prm"], p["orm"]))
            res_u: AuditResult = await audit(engine, "unified", uni, runtime.settings, runtime.concurrency)
            res_s: AuditResult = await audit(engine, "prm+orm", sep, runtime.settings, runtime.concurrency)
            out[judge] = {"unified": res_u.to_json(), "prm+orm": res_s.to_json(),
                          "auditor": {"backend": options.auditor_backend or runtime.engine.backend,
                                      "model": options.auditor_model or runtime.engine.model}}
    return out


#: the components whose positive verdict the cue table counts: the candidate preferred (reply 2), a reply True
CUE_POSITIVE: dict[str, str] = {"preference": "second", "reply": "True"}


def cue_tables(items: list[EvalItem], preds: list[Prediction]) -> dict[str, Any]:
    """Per component of :data:`CUE_POSITIVE` the items hold: :func:`data_builder.cues.judged_cue_table` of the
    judge's verdicts (does it follow a question / a short reply more than the labels do?)."""
    said = {p.key: p.verdicts for p in preds}
    out = {}
    for comp, positive in CUE_POSITIVE.items():
        rows = [(reply_text(it.candidate)[0], label_str(it.gold[comp]) == positive,
                 label_str(said.get(it.key, {}).get(comp)) == positive) for it in items if comp in it.gold]
        if rows:
            out[comp] = judged_cue_table(rows)
    return out


def _entry(m: VariantMetrics, judge: str, inconsistency: float | None) -> dict[str, Any]:
    m.inconsistency_ratio = inconsistency
    out = m.to_json()
    out["judge"] = judge
    return out


def _inconsistency_of(audits: dict[str, Any], judge: str, variant: str) -> float | None:
    setup = "unified" if variant == "unified" else "prm+orm"
    value = audits.get(judge, {}).get(setup, {}).get("ratio")
    return None if value is None else float(value)


async def evaluate(options: EvalOptions) -> dict[str, Any]:
    """Run the evaluation and write metrics.json, report.md, PNGs and predictions.jsonl under ``out_dir``."""
    started = time.monotonic()
    variants = options.all_variants()
    data = {v: load_variant(options.data_dir, v, options.max_items) for v in variants}
    preds: dict[str, dict[str, list[Prediction]]] = {}
    if options.include_base:
        preds[BASE] = await _judge_all(options, data, variants, None)
    for variant, adapter in options.adapters.items():
        preds.setdefault(TRAINED, {}).update(await _judge_all(options, data, [variant], adapter))
    audits = await _audit_all(options, preds)

    out_dir = options.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {}
    pngs: dict[str, str] = {}
    for v in variants:
        items = data[v].items
        rows: dict[str, VariantMetrics] = {}
        for judge in (TRAINED, BASE):
            if v in preds.get(judge, {}):
                rows[judge] = score_predictions(v, items, preds[judge][v])
        majority_pred = [Prediction(it.key, dict(data[v].majority)) for it in items]
        rows[MAJORITY] = score_predictions(v, items, majority_pred)
        primary = TRAINED if TRAINED in rows else BASE if BASE in rows else MAJORITY
        entry = _entry(rows[primary], primary, _inconsistency_of(audits, primary, v))
        entry["adapter"] = options.adapters.get(v)
        entry["majority_labels"] = {c: label_str(x) for c, x in data[v].majority.items()}
        entry["baselines"] = {j: _entry(m, j, _inconsistency_of(audits, j, v)) for j, m in rows.items()
                              if j != primary}
        entry["cues"] = {judge: cue_tables(items, preds[judge][v]) for judge in (TRAINED, BASE)
                         if v in preds.get(judge, {})}
        metrics[v] = entry
        for judge, m in rows.items():
            name = f"confusion_{v}_{judge}.png"
            plot_confusions(m, f"{v} / {judge}", out_dir / name)
            pngs[f"{v} / {judge}"] = name
    if audits:
        metrics["inconsistency"] = audits
    ref = model_ref(options.runtime)
    metrics["meta"] = {
        "data_dir": str(options.data_dir), "backend": options.runtime.engine.backend, "model_id": ref.model_id,
        "rationale_bound": ref.bound,
        "model_revision": ref.revision, "template": options.runtime.template, "max_items": options.max_items,
        "settings": asdict(options.runtime.settings), "seconds": round(time.monotonic() - started, 1),
        "adapters": dict(options.adapters),
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    (out_dir / "report.md").write_text(render_report(metrics, pngs), encoding="utf-8")
    with (out_dir / "predictions.jsonl").open("w", encoding="utf-8") as fh:
        for judge, by_variant in preds.items():
            for v, plist in by_variant.items():
                gold = {it.key: it.gold for it in data[v].items}
                for p in plist:
                    row: dict[str, Any] = {
                        "judge": judge, "variant": v, "key": p.key, "error": p.error, "generations": p.generations,
                        "verdicts": {c: label_str(x) for c, x in p.verdicts.items()},
                        "gold": {c: label_str(x) for c, x in gold[p.key].items()}}
                    if p.probs:
                        row["probs"] = p.probs
                    if options.save_texts:
                        row["texts"] = p.texts
                    fh.write(json.dumps(row) + "\n")
    log.info("evaluation written to %s (%.0f s)", out_dir, time.monotonic() - started)
    return metrics


def run_evaluation(options: EvalOptions) -> dict[str, Any]:
    """Synchronous wrapper of :func:`evaluate`."""
    return asyncio.run(evaluate(options))


__all__ = ["BASE", "CUE_POSITIVE", "MAJORITY", "TRAINED", "EvalOptions", "VariantData", "cue_tables", "evaluate",
           "load_variant", "run_evaluation", "score_predictions"]
