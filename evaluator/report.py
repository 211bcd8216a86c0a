"""Run summaries, the markdown report and its PNG plots (radar chart of the 7 dimensions, SAGE trajectories).

``write_report`` takes one or more run folders of any harnesses: runs of the same harness share a table (and the
radar chart), so two models' runs compare side by side. Each run's ``results.json`` holds its manifest, summary and
items.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from evaluator import esc_eval, gold, sage
from evaluator.prompts import SCORE_MAX, load_prompts
from evaluator.runs import RunDir

RESULTS = "results.json"
REPORT = "report.md"


def summarise_run(run: RunDir) -> dict[str, Any]:
    """The summary of a run folder's items, by its harness."""
    manifest = run.manifest()
    cfg = manifest["config"]
    records = list(run.records().values())
    harness = manifest["harness"]
    if harness == esc_eval.HARNESS:
        return esc_eval.summarise(records, load_prompts(cfg.get("prompts")))
    if harness == sage.HARNESS:
        return sage.summarise(records)
    if harness == gold.HARNESS:
        return gold.summarise(records, cfg["harness"]["model_format"])
    raise ValueError(f"{run.path}: unknown harness {harness!r}")


def write_results(run: RunDir) -> dict[str, Any]:
    """Write ``results.json`` (manifest, summary, items) into the run folder; return the summary."""
    summary = summarise_run(run)
    payload = {"manifest": run.manifest(), "summary": summary, "items": list(run.records().values())}
    (run.path / RESULTS).write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")
    return summary


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def radar_chart(summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """One polygon per run over the dimensions' mean scores (0-4); unscored dimensions are drawn at 0 and marked."""
    plt = _plt()
    names = list(next(iter(summaries.values()))["dimensions"])
    angles = [2 * math.pi * i / len(names) for i in range(len(names))] + [0.0]
    fig = plt.figure(figsize=(6, 6))
    ax = fig.add_subplot(111, polar=True)
    for label, s in summaries.items():
        values = [s["dimensions"][n]["mean"] for n in names]
        drawn = [v if v is not None else 0.0 for v in values]
        ax.plot(angles, drawn + drawn[:1], marker="o", label=label)
        ax.fill(angles, drawn + drawn[:1], alpha=0.1)
    ax.set_xticks(angles[:-1])
    ax.set_xticklabels([n.replace(" ", "\n") for n in names])
    ax.set_ylim(0, SCORE_MAX)
    ax.set_yticks(range(SCORE_MAX + 1))
    ax.set_title("ESC-Eval dimensions (mean score, 0-4)")
    ax.legend(loc="lower right", bbox_to_anchor=(1.25, -0.1), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trajectory_plot(records: list[dict[str, Any]], path: Path, title: str, success_at: int = 100,
                    failure_below: int = 10) -> Path:
    """The emotion score of every SAGE dialogue by round, with the success and failure lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in records:
        if r.get("trajectory"):
            ax.plot(range(len(r["trajectory"])), r["trajectory"], marker=".", label=f"{r['id']} ({r['status']})")
    ax.axhline(success_at, color="green", linestyle="--", linewidth=1)
    ax.axhline(failure_below, color="red", linestyle="--", linewidth=1)
    ax.set_ylim(0, 105)
    ax.set_xlabel("round")
    ax.set_ylabel("emotion score")
    ax.set_title(title)
    if len(records) <= 12:
        ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _models(manifest: dict[str, Any]) -> str:
    roles = manifest["config"].get("roles", {})
    return ", ".join(f"{r}: `{d['identity']}`" for r, d in roles.items())


def _reply_rows(runs: dict[str, dict[str, Any]]) -> list[str]:
    rows = ["| run | replies | distinct-1 | distinct-2 | mean length (tokens) |", "|---|---|---|---|---|"]
    for label, s in runs.items():
        f = s["replies"]
        rows.append(f"| {label} | {f['replies']} | {_fmt(f['distinct_1'])} | {_fmt(f['distinct_2'])} | "
                    f"{_fmt(f['mean_length'], 1)} |")
    return rows


def write_report(run_paths: list[Path], out: Path) -> Path:
    """``report.md``, its PNGs and ``summary.json`` (each run's summary) over the runs; each run's ``results.json`` is
    (re)written too."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [RunDir(p) for p in run_paths]
    by_harness: dict[str, dict[str, tuple[RunDir, dict[str, Any]]]] = {}
    for run in runs:
        label = run.path.name if run.path.name not in {r.path.name for r in runs if r is not run} else str(run.path)
        by_harness.setdefault(run.manifest()["harness"], {})[label] = (run, write_results(run))
    lines = ["# compeer evaluation report", ""]
    for run in runs:
        m = run.manifest()
        lines.append(f"- `{run.path.name}`: {m['harness']}, created {m['created']}; {_models(m)}")
    lines.append("")
    if esc_eval.HARNESS in by_harness:
        lines += _esc_section({label: s for label, (_, s) in by_harness[esc_eval.HARNESS].items()}, out)
    if sage.HARNESS in by_harness:
        lines += _sage_section(by_harness[sage.HARNESS], out)
    if gold.HARNESS in by_harness:
        lines += _gold_section(by_harness[gold.HARNESS])
    path = out / REPORT
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summaries = {label: s for runs_of in by_harness.values() for label, (_, s) in runs_of.items()}
    (out / "summary.json").write_text(json.dumps(summaries, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def _esc_section(summaries: dict[str, dict[str, Any]], out: Path) -> list[str]:
    names = list(next(iter(summaries.values()))["dimensions"])
    lines = ["## ESC-Eval-style (role cards, simulated seeker, 7 dimensions 0-4)", "",
             "| run | dialogues | " + " | ".join(names) + " | average % | unparsed |",
             "|---|---|" + "---|" * len(names) + "---|---|"]
    for label, s in summaries.items():
        dims = " | ".join(_fmt(s["dimensions"][n]["mean"]) for n in names)
        lines.append(f"| {label} | {s['statuses'].get('ok', 0)}/{s['dialogues']} | {dims} | "
                     f"{_fmt(s['average_percent'])} | {s['unparsed_total']} |")
    lines += ["", "Means are over parsed scores; `unparsed` counts dimension scores the scorer did not give in the "
              "rubric's format (never defaulted). Statuses: " +
              "; ".join(f"{label}: {s['statuses']}" for label, s in summaries.items()), ""]
    flat = [note for label, s in summaries.items() if (note := esc_eval.flat_note(label, s))]
    lines += [f"- {note}" for note in flat] + ([""] if flat else [])
    radar_chart(summaries, out / "esc_radar.png")
    lines += ["![ESC-Eval radar](esc_radar.png)", "", "Judge-independent figures of the model's replies:", ""]
    lines += _reply_rows(summaries) + [""]
    for label, s in summaries.items():
        if s.get("cer"):
            lines.append(f"- {label}: CER format well formed in {_fmt(s['cer']['format_ok_rate'], 1)}% of replies, "
                         f"a taxonomy strategy named in {_fmt(s['cer']['strategy_named_rate'], 1)}%")
    return lines + [""]


def _sage_section(runs: dict[str, tuple[RunDir, dict[str, Any]]], out: Path) -> list[str]:
    lines = ["## SAGE-style (hidden intention, emotion score 0-100)", "",
             "| run | dialogues | scored | mean final score | successes | failures | unparsed | mean rounds |",
             "|---|---|---|---|---|---|---|---|"]
    for label, (_, s) in runs.items():
        lines.append(f"| {label} | {s['dialogues']} | {s['scored']} | {_fmt(s['mean_final_score'])} | "
                     f"{s['successes']} | {s['failures']} | {s['unparsed']} | {_fmt(s['mean_rounds'], 1)} |")
    lines.append("")
    for i, (label, (run, _)) in enumerate(runs.items()):
        cfg = run.manifest()["config"]["harness"]
        name = f"sage_trajectories_{i}.png"
        trajectory_plot(list(run.records().values()), out / name, f"SAGE emotion trajectories: {label}",
                        cfg["success_at"], cfg["failure_below"])
        lines += [f"![SAGE trajectories {label}]({name})", ""]
    lines += ["Judge-independent figures of the model's replies:", ""]
    return lines + _reply_rows({label: s for label, (_, s) in runs.items()}) + [""]


def _gold_section(runs: dict[str, tuple[RunDir, dict[str, Any]]]) -> list[str]:
    lines = ["## ESConv held-out turns (gold replies)", "",
             ("| run | turns | BLEU-2 | ROUGE-L | strategy acc. % | CER well formed % | distinct-1 | distinct-2 | "
             "mean length |"), "|---|---|---|---|---|---|---|---|---|"]
    for label, (_, s) in runs.items():
        acc = s.get("strategy", {}).get("accuracy") if s.get("strategy") else None
        r = s["replies"]
        lines.append(f"| {label} | {s['answered']}/{s['turns']} | {_fmt(s['bleu_2'])} | {_fmt(s['rouge_l'])} | "
                     f"{_fmt(acc)} | {_fmt(s.get('format_ok_rate'), 1)} | {_fmt(r['distinct_1'])} | "
                     f"{_fmt(r['distinct_2'])} | {_fmt(r['mean_length'], 1)} |")
    ref = next(iter(runs.values()))[1]["references"]
    lines += ["", (f"Gold replies themselves: distinct-1 {_fmt(ref['distinct_1'])}, "
                   f"distinct-2 {_fmt(ref['distinct_2'])}, mean length {_fmt(ref['mean_length'], 1)} tokens."), ""]
    return lines
