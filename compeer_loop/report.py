"""The loop's report: ``OUT/report.md`` (arms x metrics with bootstrap 95% intervals, the issue's goals checked
against the data, published ESConv figures for scale, side-by-side replies, commands, GPU time), ``OUT/figures.json``
(every figure and interval) and ``OUT/curves_*.png`` (training curves of every GRPO arm).

Every number comes from the loop folder (``plan.json``, ``state.json``, ``<arm>/metrics.jsonl``,
``eval/<policy>/records.jsonl``); nothing is typed in except the published values, which are labelled as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compeer_loop.evaluate import ESC_FILE
from compeer_loop.plan import ARM_BY_NAME, BASE_POLICY, LoopSettings, warmup_length
from compeer_loop.prompts import read_jsonl
from compeer_loop.replies import CONSTANT_REPLY
from compeer_loop.report_checks import (
    beats,
    constant_row,
    figure_of,
    independent_section,
    judge_verified,
    paired_section,
    replies_lines,
    skeptic_table,
)
from compeer_loop.report_runs import gpu_section, judges_and_machines, trained_against, write_curves
from compeer_loop.runner import STATE_FILE, load_settings
from compeer_loop.stats import add_item_figures, judge_follows, summarise
from evaluator.esc_eval import flat_note

COLUMNS = (("strategy_accuracy", "strategy acc. %"), ("bleu_2", "BLEU-2"), ("rouge_l", "ROUGE-L"),
           ("distinct_1", "D-1"), ("distinct_2", "D-2"), ("format_ok", "format ok %"), ("mean_length", "length"),
           ("reward_total", "judge total"), ("reward_steps", "judge steps"), ("reward_preference", "judge pref."),
           ("reward_format", "judge format"), ("judge_parse_failure", "judge parse fail %"))
#: published ESConv figures (docs/evaluator.md, as reported by their papers; protocols differ)
PUBLISHED = (
    ("BlenderBot-Joint (Liu et al., ACL 2021)", {"bleu_2": 5.35, "rouge_l": 15.46}),
    ("BlenderBot-Joint (re-run in MISC's table)", {"strategy_accuracy": 28.57}),
    ("MISC (Tu et al., ACL 2022; own re-split)", {"strategy_accuracy": 31.63, "bleu_2": 7.31, "rouge_l": 17.91,
                                                  "distinct_1": 4.41, "distinct_2": 19.71}),
    ("TransESC (Zhao et al., Findings ACL 2023)", {"strategy_accuracy": 34.71}),
)


def policy_label(name: str) -> str:
    return "base (no training)" if name == BASE_POLICY else f"({name}) {ARM_BY_NAME[name].title}"


#: a Markdown file in the loop folder put verbatim at the top of the report (a correction found after the run)
NOTES_FILE = "notes.md"


def load_records(root: Path, s: LoopSettings) -> dict[str, list[dict[str, Any]]]:
    """Per policy with records: its evaluation records, answered ones with their item figures."""
    out = {}
    for name in s.eval_policies:
        path = root / "eval" / name / "records.jsonl"
        if path.exists():
            out[name] = [add_item_figures(r, s.distinct_first_tokens) if r.get("status") == "ok" else r
                         for r in read_jsonl(path)]
    return out


def load_figures(root: Path, s: LoopSettings, n_boot: int = 1000,
                 records: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """Per policy with records: :func:`compeer_loop.stats.summarise` of its evaluation records."""
    records = load_records(root, s) if records is None else records
    return {name: summarise(rs, n_boot=n_boot, seed=s.seed) for name, rs in records.items()}


def _cell(f: dict[str, Any] | None) -> str:
    if not f or f.get("value") is None:
        return "n/a"
    if f.get("lo") is None:
        return f"{f['value']:.2f}"
    return f"{f['value']:.2f} [{f['lo']:.2f}, {f['hi']:.2f}]"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def table(figs: dict[str, dict[str, Any]], eval_steps: dict[str, int] | None = None,
          judges: dict[str, str] | None = None, constant: dict[str, float | None] | None = None) -> str:
    """Policies x metrics; ``judges``: per GRPO arm, the judge it trained against (base, revision, adapter);
    ``constant``: :func:`compeer_loop.report_checks.constant_row`, shown as a control row."""
    steps, judges = eval_steps or {}, judges or {}
    head = "| policy | prompts (answered / judged) | " + " | ".join(t for _, t in COLUMNS) + " | trained against |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for name, summary in figs.items():
        f = summary["figures"]
        at = f" @ step {steps[name]}" if name in steps else ""
        rows.append(f"| {policy_label(name)}{at} | {summary['prompts']} ({summary['answered']} / {summary['judged_ok']}) | "
                    + " | ".join(_cell(f.get(k)) for k, _ in COLUMNS) + f" | {judges.get(name, '—')} |")
    if constant:
        rows.append(f"| control: the constant reply \"{CONSTANT_REPLY}\" | {constant['prompts']} (—) | "
                    + " | ".join(_fmt(constant.get(k)) if k in constant else "—" for k, _ in COLUMNS) + " | — |")
    return "\n".join(rows)


def published_table() -> str:
    keys = ("strategy_accuracy", "bleu_2", "rouge_l", "distinct_1", "distinct_2")
    rows = ["| system | strategy acc. % | BLEU-2 | ROUGE-L | D-1 | D-2 |", "|---|---|---|---|---|---|"]
    for name, vals in PUBLISHED:
        rows.append(f"| {name} | " + " | ".join(f"{vals[k]:.2f}" if k in vals else "" for k in keys) + " |")
    return "\n".join(rows)


def goals(figs: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The issue's goals, each stated as met or missed from the figures; ``paired``: the paired comparisons
    (``report_checks.paired_section``'s ``pairs``), which decide a "beats" goal wherever they have it."""
    out = [f"(c) beats (a) on strategy accuracy: {beats(figs, 'c', 'a', 'strategy_accuracy', paired)}",
           f"(c) beats (b) on strategy accuracy: {beats(figs, 'c', 'b', 'strategy_accuracy', paired)}",
           f"(c) beats (a) on the trained judge's reward: {beats(figs, 'c', 'a', 'reward_total', paired)}",
           f"(c) beats (b) on the trained judge's reward: {beats(figs, 'c', 'b', 'reward_total', paired)}"]
    c2, a2 = figure_of(figs, "c", "distinct_2"), figure_of(figs, "a", "distinct_2")
    if c2 and a2:
        verdict = "met" if c2["value"] >= a2["value"] else f"missed by {a2['value'] - c2['value']:.2f}"
        out.append(f"distinct-2 of (c) not below (a)'s: {verdict} ({c2['value']:.2f} vs {a2['value']:.2f})")
    else:
        out.append("distinct-2 of (c) not below (a)'s: not measured")
    for arm in ("d", "e"):  # the other trained-judge arms against the warm-up they started from
        out.append(f"({arm}) beats (a) on strategy accuracy: {beats(figs, arm, 'a', 'strategy_accuracy', paired)}")
        out.append(f"({arm}) beats (a) on the trained judge's reward: "
                   f"{beats(figs, arm, 'a', 'reward_total', paired)}")
    for arm in ("c", "d"):
        out.append(f"reweighting ({arm}) raises distinct-2 over no reweighting (e): "
                   f"{beats(figs, arm, 'e', 'distinct_2')}")
    if "f" in figs:
        out.append(f"unified (c) vs PRM + ORM (f), trained judge's reward: "
                   f"{beats(figs, 'c', 'f', 'reward_total', paired)}; "
                   f"strategy accuracy: {beats(figs, 'c', 'f', 'strategy_accuracy', paired)}")
    else:
        out.append("unified (c) vs PRM + ORM (f): (f) was not evaluated (see the run status below)")
    # issue 26's goals: the independent scorer, strategy kappa, degenerate replies (seeds pooled)
    for other in ("a", "b"):
        out.append(f"(c) beats ({other}) on the independent scorer: "
                   f"{beats(figs, 'c', other, 'independent_win_share', paired)}")
    kc, ka = figure_of(figs, "c", "strategy_kappa"), figure_of(figs, "a", "strategy_kappa")
    if kc is None or ka is None:
        out.append("strategy kappa of (c) >= 0.15 and above (a)'s: not measured")
    else:
        ok = kc["value"] >= 0.15 and kc["value"] > ka["value"]
        out.append(f"strategy kappa of (c) >= 0.15 and above (a)'s: {'met' if ok else 'missed'} "
                   f"({kc['value']:.3f} vs (a) {ka['value']:.3f})")
    deg = {p: f["value"] for p in sorted(figs) if (f := figure_of(figs, p, "degenerate")) is not None}
    if deg:
        worst = max(deg, key=deg.__getitem__)
        ref = figure_of(figs, worst, "reference_degenerate")  # the same rule on the real replies, same prompts
        beside = "" if ref is None else f"; the rule marks {ref['value']:.1f}% of the real supporter replies there"
        out.append(f"degenerate replies < 2% in every arm: {'met' if deg[worst] < 2.0 else 'missed'} (highest: "
                   f"({worst}) {deg[worst]:.1f}%{beside})")
    else:
        out.append("degenerate replies < 2% in every arm: not measured")
    return out


def esc_section(root: Path, s: LoopSettings) -> str:
    """The ESC-Eval-style evaluation per policy (``eval/<policy>/esc.json``), the scorer named, and how often its
    output gave no score."""
    runs = [(p, json.loads((root / "eval" / p / ESC_FILE).read_text())) for p in s.eval_policies
            if (root / "eval" / p / ESC_FILE).exists()]
    if not runs:
        return ("Not run in this loop folder (`esc_cards` 0, or run before the loop had this step); "
                "`compeer-eval esc` runs it on its own (docs/evaluator.md).")
    dims = list(runs[0][1]["dimensions"])
    rows = [f"| policy | dialogues ok / run | average % | {' | '.join(dims)} | scores unparsed % | CER format ok % |",
            "|" + "---|" * (len(dims) + 5)]
    for p, e in runs:
        ok = e["statuses"].get("ok", 0)
        unparsed = 100.0 * e["unparsed_total"] / (ok * len(dims)) if ok else None
        rows.append(f"| {policy_label(p)} | {ok} / {e['dialogues']} | {_fmt(e['average_percent'])} | "
                    + " | ".join(_fmt(e["dimensions"][d]["mean"]) for d in dims)
                    + f" | {_fmt(unparsed)} | {_fmt((e.get('cer') or {}).get('format_ok_rate'))} |")
    e0 = runs[0][1]
    flat = [f"- {note}" for p, e in runs if (note := flat_note(policy_label(p), e))]
    return "\n".join([(f"{e0['rounds']} rounds per dialogue; simulated seeker `{e0['roles']['simulator']}`, scorer "
                      f"`{e0['roles']['scorer']}` (0-4 per dimension; a mean is over the scores that parsed). With a "
                      "135M scorer these scores say little; the unparsed share and the lines below say how little."),
                      "", *rows, *([""] + flat if flat else [])])


def _quarters(root: Path, s: LoopSettings, key: str) -> dict[str, tuple[float, float]]:
    """Per GRPO arm, the mean of a logged metric over the first and the last quarter of its steps."""
    out = {}
    for arm in s.arms:
        path = root / arm / "metrics.jsonl"
        if not ARM_BY_NAME[arm].grpo or not path.exists():
            continue
        ys = [float(r[key]) for r in read_jsonl(path) if isinstance(r.get(key), (int, float))]
        if len(ys) >= 2:
            k = max(1, len(ys) // 4)
            out[arm] = (sum(ys[:k]) / k, sum(ys[-k:]) / k)
    return out


def _reward_movement(root: Path, s: LoopSettings) -> list[str]:
    return [f"({arm}) {first:.2f} -> {last:.2f}" for arm, (first, last) in _quarters(root, s, "reward").items()]


def what_the_reward_follows(root: Path, s: LoopSettings) -> str:
    """Two generated tables: what the trained judge's total follows in each policy's evaluated replies, and how
    truncation, length and the format reward moved in training (first -> last quarter of the steps)."""
    rows = [("| policy | replies (format ok, judged) | Spearman rho (length in words, total) | total, named strategy = "
            "annotated (n) | total, other strategy (n) |"), "|---|---|---|---|---|"]
    for p in s.eval_policies:
        path = root / "eval" / p / "records.jsonl"
        if not path.exists():
            continue
        f = judge_follows(read_jsonl(path))
        rows.append(f"| {policy_label(p)} | {f['n']} | {_fmt(f['rho_length_total'])} | "
                    f"{_fmt(f['total_strategy_right'])} ({f['n_right']}) | {_fmt(f['total_strategy_wrong'])} "
                    f"({f['n_wrong']}) |")
    keys = ("completions/clipped_ratio", "completions/mean_length", "compeer/format_reward_mean",
            "compeer/preference_reward_mean")
    moved = {k: _quarters(root, s, k) for k in keys}
    train = [("| arm | truncated at max_completion_length | completion length (tokens) | format reward (the arm's judge) | "
             "preference reward (the arm's judge) |"), "|---|---|---|---|---|"]
    for arm in moved[keys[0]]:
        train.append(f"| ({arm}) | " + " | ".join(
            f"{moved[k][arm][0]:.2f} -> {moved[k][arm][1]:.2f}" if arm in moved[k] else "n/a" for k in keys) + " |")
    return "\n".join([*rows, "", (f"In training (first -> last quarter of the steps; `max_completion_length` "
                                  f"{s.max_completion_length}):"), "", *train])


def _steps_phrase(s: LoopSettings, eval_steps: dict[str, int] | None) -> str:
    if not eval_steps:
        return f"{s.steps} GRPO steps per arm"
    at = ", ".join(f"({p}) at step {n}" for p, n in sorted(eval_steps.items()))
    return f"{s.steps} GRPO steps scheduled per arm (evaluated early: {at} of {s.steps})"


def conclusion(checks: list[str], root: Path, s: LoopSettings, eval_steps: dict[str, int] | None = None) -> str:
    """Which of the paper's claims the data supports at this size, from the goal checks (never typed in)."""
    met = [c.split(":")[0] for c in checks if ": met" in c]
    missed = [c.split(":")[0] for c in checks if ": missed" in c]
    unmeasured = [c.split(":")[0] for c in checks if ": met" not in c and ": missed" not in c]
    moves = _reward_movement(root, s)
    measured = len(met) + len(missed)
    lines = [f"At SmolLM2-135M with {_steps_phrase(s, eval_steps)}, {len(met)} of {len(checks)} checks are met"
             + (f" ({measured} measured)." if measured < len(checks) else ".")]
    if met:
        lines.append("Supported by the data: " + "; ".join(met) + ".")
    if missed:
        lines.append("Not supported by the data: " + "; ".join(missed) + " (the margins are in the checks above).")
    if unmeasured:
        lines.append("Not measured in this run: " + "; ".join(unmeasured) + ".")
    if moves:
        lines.append("Training reward, first quarter -> last quarter of the steps: " + ", ".join(moves) + ".")
    return " ".join(lines)


def _short(text: str, n: int = 280) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def side_by_side(root: Path, s: LoopSettings, k: int = 3) -> str:
    recs = {p: {r["id"]: r for r in read_jsonl(root / "eval" / p / "records.jsonl")} for p in s.eval_policies
            if (root / "eval" / p / "records.jsonl").exists()}
    if not recs:
        return "(no evaluation records)"
    common = sorted(set.intersection(*(set(v) for v in recs.values())))[:k]
    parts = []
    for pid in common:
        first = next(iter(recs.values()))[pid]
        parts.append(f"**Prompt {pid}** (seeker's last turn: \"{_short(first['history'][-1]['text'], 200)}\"; "
                     f"annotated strategy {first.get('gold_strategy')})\n\n| policy | strategy | reply |\n|---|---|---|\n"
                     f"| real supporter turn | {first.get('gold_strategy')} | {_short(first['reference'])} |")
        for p, rs in recs.items():
            r = rs[pid]
            parts[-1] += f"\n| {policy_label(p)} | {r.get('strategy')} | {_short(r.get('text', ''))} |"
    return "\n\n".join(parts)


def write_report(root: Path, out: Path, gpu_log: Path | None = None, n_boot: int = 1000,
                 eval_steps: dict[str, int] | None = None, notes: Path | None = None,
                 preface: Path | None = None) -> Path:
    """Write report.md, figures.json and the curves into ``out``; returns the report's path.

    ``eval_steps`` names policies evaluated from an earlier checkpoint than ``steps`` (policy -> GRPO step), which
    the loop folder cannot tell; ``notes`` is a written Markdown section ("What happened on the GPU") put after the
    conclusion; ``preface`` (else ``ROOT/notes.md`` when present) is put verbatim at the top."""
    s = load_settings(root)
    out.mkdir(parents=True, exist_ok=True)
    state = json.loads((root / STATE_FILE).read_text()) if (root / STATE_FILE).exists() else {}
    records = load_records(root, s)
    figs = load_figures(root, s, n_boot, records)
    labels = {p: policy_label(p) for p in figs}
    verified = judge_verified(root, list(figs), {a: a in ARM_BY_NAME and ARM_BY_NAME[a].grpo for a in figs})
    constant = constant_row(next(iter(records.values()))) if records else None
    paired_text, paired = paired_section(records, {p: s.seed for p in records}, seed=s.seed)
    (out / "figures.json").write_text(json.dumps({**figs, "_constant_reply": constant, "_paired": paired},
                                                 indent=1) + "\n")
    top = preface if preface is not None else (root / NOTES_FILE if (root / NOTES_FILE).exists() else None)
    curves = write_curves(root, s, out)
    manifest = root / "prompts-manifest.json"
    prompts_manifest = json.loads(manifest.read_text()) if manifest.exists() else {}
    counts = prompts_manifest.get("counts", {})
    per_dialogue = prompts_manifest.get("params", {}).get("eval_rounds_per_dialogue", "?")
    text = [
        "# The COMPEER loop on ESConv: GRPO against UnifiReward, arm by arm",
        "",
        *([top.read_text().strip(), ""] if top is not None else []),
        (f"Policy SmolLM2-135M-Instruct + LoRA (profile `{s.profile}`), seed {s.seed}, {s.steps} GRPO steps per arm "
        f"from one shared SFT warm-up of {warmup_length(s)}; prompts from ESConv train "
        f"({counts.get('grpo_train', '?')} GRPO prompts, {counts.get('warmup', '?')} warm-up rows), evaluation on "
        f"{counts.get('eval', '?')} valid-split prompts ({per_dialogue} round(s) per valid dialogue), greedy, "
        f"{s.eval_max_tokens} new tokens. Judge scores: the shipped trained judge (unified mode). Intervals: "
        f"bootstrap 95% over prompts ({n_boot} resamples)."),
        "",
        "## Arms x metrics",
        table(figs, eval_steps, trained_against(root, s), constant),
        "",
        "## What a skeptic asks of these figures (issue 26, item 4)",
        ("Strategy accuracy beside always naming the most frequent annotated strategy on the same prompts, and "
         "Cohen's kappa of the named strategy with the annotated one (0: no better than chance). Degenerate: replies "
         "the dataset pipeline's rule marks (a stage label or the judge's own wording, a repeated sentence, a cut "
         "reply, a known generic template, a short reply with no word of its conversation). The judge's total among "
         f"format-valid replies only; distinct-n over each reply's first {s.distinct_first_tokens} tokens beside the "
         "full reply (the gain in the full-reply figure that the first tokens do not show is reply length)."),
        "",
        skeptic_table(figs, records, labels, verified, s.distinct_first_tokens),
        "",
        *replies_lines(records, labels),
        "",
        "### Independent scorer",
        independent_section(figs, s.independent_scorer),
        "",
        "### Paired comparisons between arms",
        paired_text,
        "",
        "## The issue's goals, checked against these figures",
        *[f"- {g}" for g in goals(figs, paired["pairs"])],
        "",
        "## Conclusion (generated from the checks above and the training curves)",
        conclusion(goals(figs, paired["pairs"]), root, s, eval_steps),
        "",
        *([notes.read_text().strip(), ""] if notes is not None else []),
        "## The judge each arm trained against, and where it ran",
        judges_and_machines(root, s),
        "",
        "## ESC-Eval-style evaluation (cards from valid dialogues)",
        esc_section(root, s),
        "",
        "## What the reward follows (generated from the evaluation records and the training logs)",
        what_the_reward_follows(root, s),
        "",
        "## Published ESConv figures, for scale",
        ("Their models are fine-tuned on ESConv (BlenderBot 90M-class and larger) and decode the reply alone; here a "
         "135M instruct model writes the four CER parts and only the `<response>` part is scored; splits, "
         "tokenisation and BLEU variants differ (docs/evaluator.md)."),
        "",
        published_table(),
        "",
        "## Training curves",
        *[f"![{c}]({c})" for c in curves],
        "",
        "## Side-by-side replies",
        side_by_side(root, s),
        "",
        "## Commands",
        "```",
        "bash tools/gpu/stage.sh && bash tools/gpu/compeer_loop.sh pack   # here",
        "# on the GPU machine (run calls): install, stage, start, wait ... (docs/compeer_loop.md)",
        *(["# arms trained on more than one machine: export/import the warm-up, then here",
           "compeer-loop merge --out ROOT " + " ".join(p["root"] for p in state["parts"])] if state.get("parts") else []),
        f"compeer-loop report --root ROOT --out {out}",
        "```",
        "Settings (`ROOT/plan.json`):",
        "```json",
        json.dumps(s.to_json(), indent=1),
        "```",
        "",
        "## GPU time and run status",
        gpu_section(state, gpu_log),
    ]
    path = out / "report.md"
    path.write_text("\n".join(text) + "\n")
    return path
