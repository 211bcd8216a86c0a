"""``compeer-train judge-calibrate``: fit a graded judge's verdict temperatures (:mod:`judge.calibration`).

Input: the ``predictions.jsonl`` of a ``judge-eval`` run made with ``--verdict-temperature 1`` (the engine's raw label
probabilities and the gold labels of the held-out items). Per verdict kind (the True/False steps and reply verdict;
the preference) it fits the temperature minimising the gold labels' negative log-likelihood on all items, and
reports NLL, Brier score, ECE and accuracy of the raw probabilities, of the fitted ones in sample, and cross-fitted:
the items split into ``folds`` groups by dialogue, each group scored under the temperature fitted on the others (the
figure to believe). Accuracy never changes: tempering keeps every distribution's top label.

``--contrast`` recomputes a ``judge-contrast`` run's rewards (its ``judgments``, also made with
``--verdict-temperature 1``) under the fitted temperatures: the AUC of the discrete, the raw graded and the tempered
graded total per kind of negative. ``--write-adapter DIR`` records the temperatures in the adapter's
``compeer_judge.json``, where every engine serving that adapter reads them (:func:`judge.calibration
.resolve_temperature`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.rewards import RewardKind
from cer.verdicts import Kind, Verdict, parse_label
from data_builder.emit import stable_unit
from data_builder.records import read_jsonl
from judge.calibration import (
    ADAPTER_META,
    CALIBRATION_KEY,
    VerdictTemperature,
    calibration_metrics,
    fit_temperature,
    temper,
)
from judge.conversation import CandidateJudgment, judgment_rewards
from judge.protocol import component_kind
from reward_trainer.contrast import REWARD_KINDS, summarise

#: One calibration sample: (dialogue, label distribution, gold label).
Sample = tuple[str, dict[str, float], str]
TEMPERED = "graded_tempered"
_RAW_SETTING = 1.0


def _check_raw(settings: Mapping[str, Any] | None, what: str) -> None:
    """ValueError unless the run that wrote ``what`` recorded raw probabilities (``--verdict-temperature 1``)."""
    t = None if settings is None else settings.get("verdict_temperature")
    if t != _RAW_SETTING:
        raise ValueError(f"{what}: made with verdict_temperature {t!r}; calibrate on raw probabilities "
                         "(re-run it with --verdict-temperature 1)")


def samples_from_predictions(path: Path, judge: str = "trained",
                             variant: str = "unified") -> tuple[dict[Kind, list[Sample]], int]:
    """The calibration samples of one judge and variant in a ``predictions.jsonl``, by verdict kind, and the number
    of judged components without probabilities (left out, counted)."""
    meta = path.parent / "metrics.json"
    if not meta.is_file():
        raise ValueError(f"{meta}: not found (the judge-eval run's metrics.json says which verdict temperature its "
                         "probabilities were recorded under)")
    _check_raw(json.loads(meta.read_text(encoding="utf-8")).get("meta", {}).get("settings"), str(meta))
    out: dict[Kind, list[Sample]] = {k: [] for k in Kind}
    missing = 0
    for row in read_jsonl(path):
        if row.get("judge") != judge or row.get("variant") != variant or "probs" not in row:
            continue
        dialogue = str(row["key"]).split(":", 1)[0]
        for c, dist in row["probs"].items():
            gold = row.get("gold", {}).get(c)
            if gold is None:
                continue
            if dist is None:
                missing += 1
                continue
            out[component_kind(c)].append((dialogue, {str(k): float(v) for k, v in dist.items()}, str(gold)))
    if not any(out.values()):
        raise ValueError(f"{path}: no {judge}/{variant} prediction with label probabilities and gold labels")
    return out, missing


def _fold(dialogue: str, folds: int, seed: int) -> int:
    return min(folds - 1, int(stable_unit("calibration-fold", seed, dialogue) * folds))


def calibrate_kind(samples: Sequence[Sample], folds: int = 2, seed: int = 0) -> dict[str, Any]:
    """The fitted temperature of one verdict kind and its metrics: raw, in sample and cross-fitted by dialogue."""
    pairs = [(d, g) for _, d, g in samples]
    t = fit_temperature(pairs)
    fold_of = [_fold(dia, folds, seed) for dia, _, _ in samples]
    fold_t: list[float | None] = []
    oof: list[tuple[dict[str, float], str]] = []
    for f in range(folds):
        rest = [p for p, k in zip(pairs, fold_of) if k != f]
        held = [p for p, k in zip(pairs, fold_of) if k == f]
        tf = fit_temperature(rest) if rest and held else None
        fold_t.append(tf)
        oof += [(temper(d, tf), g) for d, g in held] if tf is not None else []
    return {"n": len(pairs), "dialogues": len({dia for dia, _, _ in samples}), "temperature": t,
            "fold_temperatures": fold_t, "raw": calibration_metrics(pairs), "in_sample": calibration_metrics(pairs, t),
            "cross_fitted": calibration_metrics(oof)}


def _judgment(record: Mapping[str, Any], temperature: VerdictTemperature) -> CandidateJudgment:
    verdicts: dict[str, Verdict | None] = {c: parse_label(component_kind(c), v) for c, v in record["verdicts"].items()}
    probs = {c: None if d is None else temper(d, temperature.of(component_kind(c)))
             for c, d in record["probs"].items()}
    return CandidateJudgment(verdicts=verdicts, judged=set(verdicts), probs=probs)


def rescore_contrast(contrast: Mapping[str, Any], groups: Sequence[Mapping[str, Any]],
                     temperature: VerdictTemperature) -> dict[str, Any]:
    """Per judge and reference, :func:`reward_trainer.contrast.summarise` of the discrete, the graded and the
    tempered graded totals, recomputed from the run's ``judgments`` (its groups: ``groups`` in file order)."""
    _check_raw(contrast.get("meta", {}).get("settings"), "the contrast run")
    if "judgments" not in contrast:
        raise ValueError("the contrast run kept no judgments (a contrast.json written before 2026-11-30): run "
                         "judge-contrast again")
    groups = list(groups)[: contrast["meta"]["n_groups"]]
    out: dict[str, Any] = {}
    for label, by_ref in contrast["judgments"].items():
        out[label] = {}
        for ref, records in by_ref.items():
            usable = [g for g in groups if g["references"].get(ref)]
            if len(usable) != len(records):
                raise ValueError(f"judgments of {label}/{ref}: {len(records)} groups, the groups file has "
                                 f"{len(usable)}: not the groups this run scored")
            totals = []
            for g, rec in zip(usable, records):
                row: dict[str, dict[str, float | None]] = {}
                for kind, r in rec.items():
                    if r is None:
                        row[kind] = dict.fromkeys([*REWARD_KINDS, TEMPERED])
                        continue
                    parsed = parse(g["candidates"][kind])
                    discrete, graded = judgment_rewards(_judgment(r, VerdictTemperature()), parsed, JudgeMode.UNIFIED)
                    _, tempered = judgment_rewards(_judgment(r, temperature), parsed, JudgeMode.UNIFIED)
                    row[kind] = {RewardKind.DISCRETE.value: discrete.total, RewardKind.GRADED.value: graded.total,
                                 TEMPERED: tempered.total}
                totals.append(row)
            out[label][ref] = {rk: summarise([{k: v[rk] for k, v in t.items()} for t in totals])
                               for rk in (*REWARD_KINDS, TEMPERED)}
    return out


def write_adapter(adapter_dir: Path, result: Mapping[str, Any], source: str) -> None:
    """Record the fitted temperatures in ``adapter_dir``'s ``compeer_judge.json`` (with what they were fitted on)."""
    meta_path = adapter_dir / ADAPTER_META
    if not meta_path.is_file():
        raise FileNotFoundError(f"--write-adapter {adapter_dir}: no {ADAPTER_META} (not a compeer judge adapter)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    kinds = result["kinds"]
    meta[CALIBRATION_KEY] = {
        "step": round(kinds[Kind.STEP.value]["temperature"], 4),
        "preference": round(kinds[Kind.PREFERENCE.value]["temperature"], 4),
        "fitted_on": source, "folds": result["folds"],
        "items": {k: v["n"] for k, v in kinds.items()},
        "nll": {k: {"raw": v["raw"]["nll"], "cross_fitted": v["cross_fitted"].get("nll")} for k, v in kinds.items()}}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def calibrate(predictions: Path, judge: str = "trained", variant: str = "unified", folds: int = 2,
              seed: int = 0) -> dict[str, Any]:
    """Fit and measure the temperature of each verdict kind present in ``predictions`` (see the module doc)."""
    if folds < 2:
        raise ValueError(f"folds {folds}: expected >= 2")
    samples, missing = samples_from_predictions(predictions, judge, variant)
    kinds = {k.value: calibrate_kind(s, folds, seed) for k, s in samples.items() if s}
    for k in Kind:
        if k.value not in kinds:
            raise ValueError(f"{predictions}: no {k.value} verdict with probabilities to fit a temperature on")
    return {"predictions": str(predictions), "judge": judge, "variant": variant, "folds": folds, "seed": seed,
            "missing_probabilities": missing, "kinds": kinds}


def _m(m: Mapping[str, Any]) -> str:
    if not m.get("n"):  # e.g. cross-fitted on too few dialogues for every fold to have items
        return "n/a | n/a | n/a"
    return f"{m['nll']:.3f} | {m['brier']:.3f} | {m['ece']:.3f}"


def render_markdown(result: Mapping[str, Any], contrast: Mapping[str, Any] | None = None) -> str:
    """The calibration table and, with ``contrast``, the AUC table under the fitted temperatures."""
    lines = ["# Verdict temperature", "",
             (f"`{result['predictions']}` ({result['judge']}, {result['variant']}); {result['folds']}-fold cross-fit "
              f"by dialogue; {result['missing_probabilities']} judged components without probabilities left out."), "",
             ("| kind | items (dialogues) | T (folds) | accuracy | raw NLL / Brier / ECE | cross-fitted NLL / Brier / "
             "ECE | in-sample NLL / Brier / ECE |"), "|---|---|---|---|---|---|---|"]
    for k, v in result["kinds"].items():
        folds = ", ".join("n/a" if t is None else f"{t:.2f}" for t in v["fold_temperatures"])
        lines.append(f"| {k} | {v['n']} ({v['dialogues']}) | {v['temperature']:.2f} ({folds}) | "
                     f"{v['raw']['accuracy']:.3f} | {_m(v['raw'])} | {_m(v['cross_fitted'])} | {_m(v['in_sample'])} |")
    if contrast:
        lines += ["", "## Reward AUC under the fitted temperatures", "",
                  ("| judge | reference | negative | AUC discrete | AUC graded (raw) | AUC graded (tempered) | "
                  "win / tie tempered |"), "|---|---|---|---|---|---|---|"]
        for label, by_ref in contrast.items():
            for ref, s in by_ref.items():
                d, g, t = s[RewardKind.DISCRETE.value], s[RewardKind.GRADED.value], s[TEMPERED]
                for kind in t["kinds"]:
                    w = t[kind]["within_group"]
                    wt = "n/a" if w["win"] is None else f"{w['win']:.2f} / {w['tie']:.2f}"
                    a = [x[kind]["auc"] if kind in x else None for x in (d, g, t)]
                    cells = " | ".join("n/a" if v is None else f"{v:.3f}" for v in a)
                    lines.append(f"| {label} | {ref} | {kind} | {cells} | {wt} |")
    return "\n".join(lines) + "\n"


__all__ = ["TEMPERED", "calibrate", "calibrate_kind", "render_markdown", "rescore_contrast",
           "samples_from_predictions", "write_adapter"]
