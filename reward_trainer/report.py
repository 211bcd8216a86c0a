"""Writing the evaluation: confusion-matrix PNGs and the markdown report (Table 1 columns per variant and judge)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cer.verdicts import PREFERENCE_LABELS, STEP_LABELS
from reward_trainer.inconsistency import RULE
from reward_trainer.metrics import INVALID, PREFERENCE, REPLY, STEPS, VariantMetrics, kappa

COLUMNS: tuple[str, ...] = ("Step1 wF1", "Step1 False-R", "Step2 wF1", "Step2 False-R", "Step3 wF1", "Step3 False-R",
                            "Resp wF1", "Resp Acc", "Reply wF1", "Reply False-R", "Reply Acc", "Parse fail",
                            "Inconsistency")


def plot_confusions(metrics: VariantMetrics, title: str, path: Path) -> Path:
    """One PNG with a confusion matrix per judged component (rows gold, columns predicted + ``invalid``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = [c for c in (*STEPS, PREFERENCE, REPLY) if c in metrics.confusion]
    fig, axes = plt.subplots(1, max(1, len(comps)), figsize=(4.2 * max(1, len(comps)), 4.0), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        rows = list(PREFERENCE_LABELS if comp == PREFERENCE else STEP_LABELS)
        cols = [*rows, INVALID]
        matrix = metrics.confusion[comp]
        ax.imshow(matrix, cmap="Blues")
        ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right")
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("predicted")
        ax.set_ylabel("gold")
        ax.set_title(comp)
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                ax.text(j, i, str(value), ha="center", va="center", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _pct(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * float(value):.2f}"


def table_row(variant: str, judge: str, m: dict[str, Any]) -> str:
    """One markdown row of the Table 1 columns (percentages)."""
    cells = []
    for i in range(3):
        cells += [_pct(m["step_weighted_f1"][i]), _pct(m["step_false_recall"][i])]
    cells += [_pct(m["response_weighted_f1"]), _pct(m["response_accuracy"]), _pct(m.get("reply_weighted_f1")),
              _pct(m.get("reply_false_recall")), _pct(m.get("reply_accuracy")), _pct(m["parse_failure_rate"]),
              _pct(m["inconsistency_ratio"])]
    return f"| {variant} | {judge} | {m['n_items']} | " + " | ".join(cells) + " |"


KAPPA_PARTS: tuple[str, ...] = (*STEPS, PREFERENCE, REPLY)


def kappa_row(variant: str, judge: str, m: dict[str, Any]) -> str:
    """One markdown row of Cohen's kappa per judged part, from the confusion matrices (n/a: part not judged)."""
    cells = []
    for part in KAPPA_PARTS:
        value = kappa(m["confusion"][part]) if part in m.get("confusion", {}) else None
        cells.append("n/a" if value is None else f"{value:.3f}")
    return f"| {variant} | {judge} | " + " | ".join(cells) + " |"


def _judge_rows(metrics: dict[str, Any], row: Callable[[str, str, dict[str, Any]], str]) -> list[str]:
    """``row`` of every variant's judge, then of its baselines, in the order of ``metrics``."""
    lines = []
    for variant, entry in metrics.items():
        if variant in ("meta", "inconsistency"):
            continue
        lines.append(row(variant, entry["judge"], entry))
        lines += [row(variant, name, base) for name, base in entry.get("baselines", {}).items()]
    return lines


def cue_section(metrics: dict[str, Any]) -> list[str]:
    """The report's surface-cue table (each variant's ``cues``: :func:`reward_trainer.evaluate.cue_tables`), empty
    where no variant has one."""
    tables = [(variant, judge, comp, t) for variant, entry in metrics.items()
              if variant not in ("meta", "inconsistency")
              for judge, comps in entry.get("cues", {}).items() for comp, t in comps.items()]
    if not tables:
        return []
    first = tables[0][3]
    lines = ["", "## Surface cue: does the judge follow a question or a short reply more than the labels?", "",
             (f"Per cell of the candidate's reply (asks a question x at most {first['short_words']} words): items: the "
              "labels' positive % / the judge's (positive: reply 2 preferred; a reply True), and in brackets the items "
              "the judge calls positive where the label does not / the reverse. Last column: the short replies' gap "
              "(question minus no question), labels / judge; a judge that learned the cue, not only the labels, has "
              "a larger gap than the labels (`compeer-data cues`, docs/data_builder.md)."), "",
             "| Variant | Judge | Part | " + " | ".join(first["cells"]) + " | gap short: labels / judge |",
             "|" + "---|" * (len(first["cells"]) + 4)]
    for variant, judge, comp, t in tables:
        cells = [f"{c['items']}: {c['label_pct']} / {c['judge_pct']} ({c['over']} / {c['under']})"
                 for c in t["cells"].values()]
        g = t["gap_question_minus_not"]["short"]
        lines.append(f"| {variant} | {judge} | {comp} | " + " | ".join(cells)
                     + f" | {g['label_pct']} / {g['judge_pct']} |")
    return lines


def render_report(metrics: dict[str, Any], pngs: dict[str, str]) -> str:
    """The markdown report of a ``metrics.json`` mapping."""
    lines = ["# UnifiReward judge evaluation", ""]
    meta = metrics.get("meta", {})
    if meta:
        lines += [(f"- data: `{meta.get('data_dir')}`, held-out split, backend `{meta.get('backend')}`, base model "
                  f"`{meta.get('model_id')}` ({meta.get('model_revision')})"),
                  f"- judge settings: {meta.get('settings')}", f"- template: `{meta.get('template')}`",
                  f"- seconds: {meta.get('seconds')}", ""]
    lines += [("Percentages. False-R = recall of the False class; Resp = reply preference (4 classes); parse "
              "failures count as wrong predictions (never dropped); Reply = mode reply (a plain reply judged True/False); Inconsistency = Fig. 5a audit ratio (unified "
              "row: the unified judge; prm/orm rows: PRM + ORM together)."), "",
              "| Variant | Judge | n | " + " | ".join(COLUMNS) + " |",
              "|" + "---|" * (len(COLUMNS) + 3)]
    lines += _judge_rows(metrics, table_row)
    lines += ["", ("Cohen's kappa with the gold labels (from the confusion matrices; an unparsed answer is a class of its "
                   "own; 0 = no better than chance, as the majority baseline always is):"), "",
              "| Variant | Judge | " + " | ".join(KAPPA_PARTS) + " |", "|" + "---|" * (len(KAPPA_PARTS) + 2)]
    lines += _judge_rows(metrics, kappa_row)
    lines += cue_section(metrics)
    inc = metrics.get("inconsistency", {})
    if inc:
        auditors = {json.dumps(s.get("auditor", {}), sort_keys=True) for s in inc.values()}
        lines += ["", "## Process/outcome inconsistency (Fig. 5a)", "", f"Rule: {RULE}", "",
                  (f"Auditor: {', '.join(sorted(auditors))}. Ratio = contradicting / audited items (same candidates "
                  "for both setups); unparsed auditor answers are excluded and counted."), "",
                  "| Judge | Setup | items | audited | unparsed | auditor ratio | rule ratio | agreement |",
                  "|---|---|---|---|---|---|---|---|"]
        for judge, setups in inc.items():
            for setup, r in setups.items():
                if setup == "auditor":
                    continue
                lines.append(f"| {judge} | {setup} | {r['n_items']} | {r['n_audited']} | {r['n_unparsed']} | "
                             f"{_pct(r['ratio'])} | {_pct(r['rule_ratio'])} | {_pct(r['agreement_with_rule'])} |")
    if pngs:
        lines += ["", "## Confusion matrices", ""]
        lines += [f"- {name}: ![{name}]({path})" for name, path in sorted(pngs.items())]
    return "\n".join(lines) + "\n"


__all__ = ["COLUMNS", "KAPPA_PARTS", "cue_section", "kappa_row", "plot_confusions", "render_report", "table_row"]
