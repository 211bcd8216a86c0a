"""The loop's report: ``OUT/report.md`` (arms x metrics with bootstrap 95% intervals, the issue's goals checked
against the data, published ESConv figures for scale, side-by-side replies, commands, GPU time), ``OUT/figures.json``
(every figure and interval) and ``OUT/curves_*.png`` (training curves of every GRPO arm).

Every number comes from the loop folder (``plan.json``, ``state.json``, ``<arm>/metrics.jsonl``,
``eval/<policy>/records.jsonl``); nothing is typed in except the published values, which are labelled as such.

Several loop folders (``compeer-loop report --root R0 --root R1 ...``) are read as seed replicates
(:mod:`compeer_loop.seeds`): one folder per seed, plans equal but for the seed. Each policy's figures and intervals
pool its records over the seeds that evaluated it (the tables name those seeds), the paired comparisons pool prompt x
seed pairs and are also given within each seed, and the goals "(c) beats (a)/(b) on the independent scorer" are met
only when the paired interval lies above 0 in each seed (``figures.json``: ``_seeds``, ``_paired.per_seed``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compeer_loop.across import across_goals, compare_runs
from compeer_loop.evaluate import ESC_FILE
from compeer_loop.plan import ARM_BY_NAME, BASE_POLICY, LoopSettings, warmup_length
from compeer_loop.prompts import read_jsonl
from compeer_loop.rejudge import judge_phrase
from compeer_loop.replies import CONSTANT_REPLY
from compeer_loop.report_checks import (
    constant_row,
    goals,
    independent_section,
    judge_verified,
    paired_section,
    replies_lines,
    skeptic_table,
)
from compeer_loop.report_follows import what_the_reward_follows
from compeer_loop.report_runs import (
    fmt,
    gpu_sections,
    judges_and_machines,
    quarters,
    scored_by_training_weights,
    trained_against,
    write_curves,
)
from compeer_loop.runner import STATE_FILE
from compeer_loop.seeds import (
    Replicate,
    load_figures,
    load_records,
    load_replicates,
    replicates_lines,
    seed_labels,
    seed_list,
    seeded,
    seeds_of,
)
from evaluator.esc_eval import flat_note
from judge.model_store import BASES, DEFAULT_MODEL, DEFAULT_MODEL_NAME

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


def policy_name(s: LoopSettings, short: bool = False) -> str:
    """The policy model the plan names: ``default`` is SmolLM2-135M-Instruct, a base of ``judge/bases.py`` its model's
    name (``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct), a folder as given; ``short``: no ``-Instruct``."""
    spec = s.policy_model
    if spec != DEFAULT_MODEL and spec not in BASES:
        return spec
    name = (DEFAULT_MODEL_NAME if spec == DEFAULT_MODEL else BASES[spec].model_id).rsplit("/", 1)[-1]
    return name.removesuffix("-Instruct") if short else name


#: with several seeds: BLEU-2, distinct-n and the most frequent reply's share are corpus figures (stats.per_seed)
CORPUS_NOTE = (" BLEU-2, distinct-n and the most frequent reply's share are corpus figures: with several seeds, "
               "the mean of each seed's figure (a corpus of more replies has fewer distinct n-grams, so pooling the "
               "seeds' replies would rank a policy by how many seeds evaluated it).")
#: a Markdown file in the loop folder put verbatim at the top of the report (a correction found after the run)
NOTES_FILE = "notes.md"


def _cell(f: dict[str, Any] | None) -> str:
    if not f or f.get("value") is None:
        return "n/a"
    if f.get("lo") is None:
        return f"{f['value']:.2f}"
    return f"{f['value']:.2f} [{f['lo']:.2f}, {f['hi']:.2f}]"


def table(figs: dict[str, dict[str, Any]], eval_steps: dict[str, int] | None = None,
          judges: dict[str, str] | None = None, constant: dict[str, float | None] | None = None,
          labels: dict[str, str] | None = None) -> str:
    """Policies x metrics; ``judges``: per GRPO arm, the judge it trained against (base, revision, adapter);
    ``constant``: :func:`compeer_loop.report_checks.constant_row`, shown as a control row; ``labels``: the policies'
    row labels (default :func:`policy_label`; with several seeds, the seeds each policy has)."""
    steps, judges, labels = eval_steps or {}, judges or {}, labels or {}
    head = "| policy | prompts (answered / judged) | " + " | ".join(t for _, t in COLUMNS) + " | trained against |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for name, summary in figs.items():
        f = summary["figures"]
        at = f" @ step {steps[name]}" if name in steps else ""
        rows.append(f"| {labels.get(name) or policy_label(name)}{at} | {summary['prompts']} ({summary['answered']} / {summary['judged_ok']}) | "
                    + " | ".join(_cell(f.get(k)) for k, _ in COLUMNS) + f" | {judges.get(name, '—')} |")
    if constant:
        rows.append(f"| control: the constant reply \"{CONSTANT_REPLY}\" | {constant['prompts']} (—) | "
                    + " | ".join(fmt(constant.get(k)) if k in constant else "—" for k, _ in COLUMNS) + " | — |")
    return "\n".join(rows)


def published_table() -> str:
    keys = ("strategy_accuracy", "bleu_2", "rouge_l", "distinct_1", "distinct_2")
    rows = ["| system | strategy acc. % | BLEU-2 | ROUGE-L | D-1 | D-2 |", "|---|---|---|---|---|---|"]
    for name, vals in PUBLISHED:
        rows.append(f"| {name} | " + " | ".join(f"{vals[k]:.2f}" if k in vals else "" for k in keys) + " |")
    return "\n".join(rows)


def esc_section(reps: Sequence[Replicate]) -> str:
    """The ESC-Eval-style evaluation per policy (``eval/<policy>/esc.json``; per policy and seed when several), the
    scorer named, and how often its output gave no score."""
    many = seeded(reps)
    runs = [(policy_label(p) + (f", seed {r.seed}" if many else ""), json.loads((r.root / "eval" / p / ESC_FILE)
                                                                           .read_text()))
            for r in reps for p in r.settings.eval_policies if (r.root / "eval" / p / ESC_FILE).exists()]
    if not runs:
        return ("Not run in this loop folder (`esc_cards` 0, or run before the loop had this step); "
                "`compeer-eval esc` runs it on its own (docs/evaluator.md).")
    dims = list(runs[0][1]["dimensions"])
    rows = [f"| policy | dialogues ok / run | average % | {' | '.join(dims)} | scores unparsed % | CER format ok % |",
            "|" + "---|" * (len(dims) + 5)]
    for label, e in runs:
        ok = e["statuses"].get("ok", 0)
        unparsed = 100.0 * e["unparsed_total"] / (ok * len(dims)) if ok else None
        rows.append(f"| {label} | {ok} / {e['dialogues']} | {fmt(e['average_percent'])} | "
                    + " | ".join(fmt(e["dimensions"][d]["mean"]) for d in dims)
                    + f" | {fmt(unparsed)} | {fmt((e.get('cer') or {}).get('format_ok_rate'))} |")
    e0 = runs[0][1]
    flat = [f"- {note}" for label, e in runs if (note := flat_note(label, e))]
    return "\n".join([(f"{e0['rounds']} rounds per dialogue; simulated seeker `{e0['roles']['simulator']}`, scorer "
                      f"`{e0['roles']['scorer']}` (0-4 per dimension; a mean is over the scores that parsed). "
                      + ("With a 135M scorer these scores say little" if "135M" in str(e0["roles"]["scorer"]) else
                         "The scorer is a zero-shot instruct model, not a trained rater")
                      + "; the unparsed share and the lines below say how little."),
                      "", *rows, *([""] + flat if flat else [])])


def _steps_phrase(s: LoopSettings, eval_steps: dict[str, int] | None) -> str:
    if not eval_steps:
        return f"{s.steps} GRPO steps per arm"
    at = ", ".join(f"({p}) at step {n}" for p, n in sorted(eval_steps.items()))
    return f"{s.steps} GRPO steps scheduled per arm (evaluated early: {at} of {s.steps})"


def conclusion(checks: list[str], reps: Sequence[Replicate], eval_steps: dict[str, int] | None = None) -> str:
    """Which of the paper's claims the data supports at this size, from the goal checks (never typed in)."""
    met = [c.split(":")[0] for c in checks if ": met" in c]
    missed = [c.split(":")[0] for c in checks if ": missed" in c]
    unmeasured = [c.split(":")[0] for c in checks if ": met" not in c and ": missed" not in c]
    moves = [f"{arm} {first:.2f} -> {last:.2f}" for arm, (first, last) in quarters(reps, "reward").items()]
    measured = len(met) + len(missed)
    s = reps[0].settings
    seeds = f" ({seed_list([r.seed for r in reps])})" if seeded(reps) else ""
    lines = [f"At {policy_name(s, short=True)} with {_steps_phrase(s, eval_steps)}{seeds}, {len(met)} of "
             f"{len(checks)} checks are met" + (f" ({measured} measured)." if measured < len(checks) else ".")]
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


def _settings_line(reps: Sequence[Replicate], counts: dict[str, Any], per_dialogue: Any, n_boot: int) -> str:
    s, many = reps[0].settings, seeded(reps)
    seeds = seed_list([r.seed for r in reps]) + (" (a loop folder each)" if many else "")
    warmup = (f"each seed's own SFT warm-up of {warmup_length(s)}" if many
              else f"one shared SFT warm-up of {warmup_length(s)}")
    over = "prompts x seeds, seeds pooled" if many else "prompts"
    return (f"Policy {policy_name(s)} + LoRA (profile `{s.profile}`), {seeds}, {s.steps} GRPO steps per arm "
            f"from {warmup}; prompts from ESConv train "
            f"({counts.get('grpo_train', '?')} GRPO prompts, {counts.get('warmup', '?')} warm-up rows), evaluation on "
            f"{counts.get('eval', '?')} valid-split prompts ({per_dialogue} round(s) per valid dialogue), greedy, "
            f"{s.eval_max_tokens} new tokens. Judge scores: {judge_phrase(reps[0].root)}. Intervals: "
            f"bootstrap 95% over {over} ({n_boot} resamples)." + (CORPUS_NOTE if many else ""))


def _prefaces(reps: Sequence[Replicate], preface: Path | None) -> list[str]:
    """``preface``, else each folder's ``notes.md`` (named by its seed when several)."""
    texts = [preface.read_text()] if preface is not None else [
        (f"**Seed {r.seed}** (`{r.root / NOTES_FILE}`):\n\n" if seeded(reps) else "") + (r.root / NOTES_FILE).read_text()
        for r in reps if (r.root / NOTES_FILE).exists()]
    return [line for text in texts for line in (text.strip(), "")]


#: this report's own run, in the section comparing other runs (``across``)
THIS_RUN = "this"


def write_report(roots: Path | Sequence[Path], out: Path, gpu_log: Path | None = None, n_boot: int = 1000,
                 eval_steps: dict[str, int] | None = None, notes: Path | None = None,
                 preface: Path | None = None, across: Mapping[str, Sequence[Path]] | None = None) -> Path:
    """Write report.md, figures.json and the curves into ``out``; returns the report's path.

    ``roots``: one loop folder, or several seed replicates (:func:`compeer_loop.seeds.load_replicates`, which refuses
    two folders of one seed or plans differing in more than the seed); ``eval_steps`` names policies evaluated from
    an earlier checkpoint than ``steps`` (policy -> GRPO step), which the loop folder cannot tell; ``notes`` is a
    written Markdown section ("What happened on the GPU") put after the conclusion; ``preface`` (else each
    ``ROOT/notes.md`` present) is put verbatim at the top; ``across`` (run name -> its folders): other runs whose
    arms are compared with these through each run's own warm-up (:mod:`compeer_loop.across`; this run is named
    :data:`THIS_RUN`), a section and goal lines of their own."""
    reps = load_replicates([roots] if isinstance(roots, Path) else list(roots))
    first, s, many = reps[0], reps[0].settings, seeded(reps)
    out.mkdir(parents=True, exist_ok=True)
    records = load_records(reps)
    figs = load_figures(reps, n_boot, records)
    labels = seed_labels({p: policy_label(p) for p in figs}, records, reps)
    grpo = {a: a in ARM_BY_NAME and ARM_BY_NAME[a].grpo for a in figs}
    verified = {a: all(judge_verified(r.root, [a], grpo)[a] for r in reps if a in r.settings.eval_policies)
                for a in figs if grpo[a]}
    constant = constant_row(next(iter(records.values()))) if records else None
    paired_text, paired = paired_section(records, seed=s.seed)
    seeds = [r.seed for r in reps]
    checks = goals(figs, paired["pairs"], paired.get("per_seed"), seeds)
    if across and THIS_RUN in across:
        raise ValueError(f"--across-run {THIS_RUN}: the name is this report's own run; name the other run otherwise")
    across_text, across_figs = (compare_runs({THIS_RUN: [r.root for r in reps], **across},
                                             loaded={THIS_RUN: records}) if across else ("", {}))
    checks += across_goals(across_figs, THIS_RUN)
    extra: dict[str, Any] = {"_across": across_figs} if across_figs else {}
    if many:
        extra["_seeds"] = {"seeds": seeds, "roots": {str(r.seed): str(r.root) for r in reps},
                           "policies": seeds_of(records)}
    (out / "figures.json").write_text(json.dumps({**figs, "_constant_reply": constant, "_paired": paired, **extra},
                                                 indent=1) + "\n")
    curves = write_curves(reps, out)
    manifest = first.root / "prompts-manifest.json"
    prompts_manifest = json.loads(manifest.read_text()) if manifest.exists() else {}
    state = json.loads((first.root / STATE_FILE).read_text()) if (first.root / STATE_FILE).exists() else {}
    text = [
        "# The COMPEER loop on ESConv: GRPO against UnifiReward, arm by arm",
        "",
        *_prefaces(reps, preface),
        _settings_line(reps, prompts_manifest.get("counts", {}),
                       prompts_manifest.get("params", {}).get("eval_rounds_per_dialogue", "?"), n_boot),
        "",
        "## Arms x metrics",
        table(figs, eval_steps, trained_against(reps), constant, labels),
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
        independent_section(figs, s.independent_scorer, scored_by_training_weights(reps), records),
        "",
        "### Paired comparisons between arms",
        paired_text,
        "",
        *([across_text] if across_text else []),
        "## The issue's goals, checked against these figures",
        *[f"- {g}" for g in checks],
        "",
        "## Conclusion (generated from the checks above and the training curves)",
        conclusion(checks, reps, eval_steps),
        "",
        *([notes.read_text().strip(), ""] if notes is not None else []),
        "## The judge each arm trained against, and where it ran",
        judges_and_machines(reps),
        "",
        "## ESC-Eval-style evaluation (cards from valid dialogues)",
        esc_section(reps),
        "",
        "## What the reward follows (generated from the evaluation records and the training logs)",
        what_the_reward_follows(records, reps, labels),
        "",
        "## Published ESConv figures, for scale",
        ("Their models are fine-tuned on ESConv (BlenderBot 90M-class and larger) and decode the reply alone; here "
         + ("a 135M instruct model" if s.policy_model == DEFAULT_MODEL else policy_name(s))
         + " writes the four CER parts and only the `<response>` part is scored; splits, "
         "tokenisation and BLEU variants differ (docs/evaluator.md)."),
        "",
        published_table(),
        "",
        "## Training curves",
        *[f"![{c}]({c})" for c in curves],
        "",
        "## Side-by-side replies",
        *([f"Seed {first.seed}'s replies (`{first.root}`); the other seeds' are in their folders.", ""] if many else []),
        side_by_side(first.root, s),
        "",
        "## Commands",
        "```",
        "bash tools/gpu/stage.sh && bash tools/gpu/compeer_loop.sh pack   # here",
        "# on the GPU machine (run calls): install, stage, start, wait ... (docs/compeer_loop.md)",
        *(["# arms trained on more than one machine: export/import the warm-up, then here",
           "compeer-loop merge --out ROOT " + " ".join(p["root"] for p in state["parts"])]
          if state.get("parts") and not many else []),
        f"compeer-loop report {' '.join(f'--root ROOT{r.seed}' for r in reps) if many else '--root ROOT'} --out {out}"
        + "".join(f" --across-run {name}={','.join(map(str, roots))}" for name, roots in (across or {}).items()),
        "```",
        "Settings (`ROOT/plan.json`" + (f" of seed {first.seed}; the seeds' folders below)" if many else ")") + ":",
        "```json",
        json.dumps(s.to_json(), indent=1),
        "```",
        *(["", *replicates_lines(reps)] if many else []),
        "",
        "## GPU time and run status",
        gpu_sections(reps, gpu_log),
    ]
    path = out / "report.md"
    path.write_text("\n".join(text) + "\n")
    return path
