"""Arms of two loop runs compared, each through its own warm-up (``compeer-loop across``).

A paired comparison inside one loop run (:mod:`compeer_loop.report_checks`) pairs arms that started from the same
warm-up bytes. Arms trained in different runs (another day, another default judge) started from different warm-ups:
replicates of one recipe (same plan, same prompts, same seed numbers) but not the same adapter. Comparing them
directly mixes the arms' difference with the warm-ups' replicate noise, so this module reports three things, each
on judge-free per-prompt scores only (the training judge differs between runs, so its scores do not compare):

1. **warm-up vs warm-up**: ``run1:a - run2:a``, paired on prompt x seed: the cross-run noise floor;
2. **gain over its own warm-up**: per GRPO arm, ``arm - a`` of the same run, paired on prompt x seed;
3. for each GRPO arm of one run against each GRPO arm of another: the direct difference, and the difference of the
   gains (``(arm1 - a1) - (arm2 - a2)``, on the prompt x seed pairs all four answered), which cancels what the two
   warm-ups did differently on each prompt.

The runs must be comparable (the one rule of :func:`compeer_loop.merge.check_comparable`, with
:data:`ACROSS_MAY_DIFFER`): same prompt set and every plan field but the arms, evaluations, seeds, placement and the
number of ESC-Eval-style cards equal (those cards are simulated dialogues of their own, reported per run; none of the
per-prompt scores compared here comes from them). Intervals and p-values are
:func:`compeer_loop.stats.paired_difference`'s (paired bootstrap over pairs, sign-flip permutation).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compeer_loop.merge import check_comparable
from compeer_loop.plan import ARM_BY_NAME
from compeer_loop.report_checks import shared_weights_line
from compeer_loop.report_runs import scored_by_training_weights, trained_against
from compeer_loop.seeds import SEED_MAY_DIFFER, Records, Replicate, load_records, load_replicates
from compeer_loop.stats import paired_difference, per_prompt

#: judge-free per-prompt scores (:data:`compeer_loop.stats.PER_PROMPT`) compared across runs
ACROSS_KEYS = ("independent_win", "strategy_correct", "rouge_l")
WARMUP = "a"
#: plan fields two compared runs may differ in: a seed replicate's, and ``esc_cards`` (the ESC-Eval-style dialogues
#: feed none of :data:`ACROSS_KEYS`)
ACROSS_MAY_DIFFER = (*SEED_MAY_DIFFER, "esc_cards")
Scores = dict[tuple[int, str], float]


def parse_run(text: str) -> tuple[str, list[Path]]:
    """``NAME=ROOT[,ROOT...]`` (one loop folder per seed) -> ``(NAME, [ROOT, ...])``; ValueError naming the form."""
    name, sep, roots = text.partition("=")
    if not sep or not name.strip() or not roots.strip() or ":" in name:
        raise ValueError(f"--run {text!r}: expected NAME=ROOT[,ROOT...] (NAME without ':')")
    return name.strip(), [Path(r) for r in roots.split(",") if r.strip()]


def _gain(arm: Scores, warmup: Scores) -> Scores:
    return {k: arm[k] - warmup[k] for k in arm.keys() & warmup.keys()}


def _cell(d: dict[str, Any]) -> str:
    if d["diff"] is None:
        return f"n/a ({d['n']} pairs)"
    return f"{d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] | {d['p']:.4f} | {d['n']}"


def compare_runs(runs: Mapping[str, Sequence[Path]], keys: Sequence[str] = ACROSS_KEYS, n_boot: int = 2000,
                 loaded: Mapping[str, Records] | None = None) -> tuple[str, dict[str, Any]]:
    """The Markdown section and its figures (``"warmups" | "gains" | "direct" | "gain_difference" -> "x-y:key" ->
    figure``) for the loop runs ``runs`` (name -> one folder per seed). Needs two runs or more, each with an evaluated
    warm-up; ValueError naming what is missing or not comparable. ``loaded``: a run's records already read with
    :func:`compeer_loop.seeds.load_records` (the report's own run), not read again."""
    if len(runs) < 2:
        raise ValueError("across needs at least two runs (--run NAME=ROOT[,ROOT...] twice or more)")
    reps = {name: load_replicates(list(roots)) for name, roots in runs.items()}
    firsts = [rs[0] for rs in reps.values()]
    check_comparable([r.root for r in firsts], [r.settings for r in firsts], ACROSS_MAY_DIFFER)
    scores: dict[str, dict[str, dict[str, Scores]]] = {}
    for name, rs in reps.items():
        records = (loaded or {}).get(name) or load_records(rs)
        if WARMUP not in records:
            raise ValueError(f"run {name} has no evaluated warm-up (eval/{WARMUP}/records.jsonl): its arms' gains "
                             "cannot be computed")
        scores[name] = {p: {k: per_prompt(r, k) for k in keys} for p, r in records.items()}
    grpo = {name: [p for p in s if p in ARM_BY_NAME and ARM_BY_NAME[p].grpo] for name, s in scores.items()}
    seeds = {name: {r.seed for r in rs} for name, rs in reps.items()}
    # pairs are prompt x seed: two runs with no seed in common have none, so they are named, not tabled
    pairs = [(a, b) for a, b in itertools.combinations(scores.items(), 2) if seeds[a[0]] & seeds[b[0]]]
    unpaired = [f"{n1} and {n2}" for n1, n2 in itertools.combinations(scores, 2) if not seeds[n1] & seeds[n2]]
    out: dict[str, Any] = {"warmups": {}, "gains": {}, "direct": {}, "gain_difference": {}}
    head = "| comparison | score | mean difference [paired bootstrap 95%] | permutation p | pairs (prompt x seed) |"
    rows = {part: [head, "|---|---|---|---|---|"] for part in out}

    def add(part: str, label: str, key: str, d: dict[str, Any]) -> None:
        out[part][f"{label}:{key}"] = d
        rows[part].append(f"| {label} | {key} | {_cell(d)} |")

    for (n1, s1), (n2, s2) in pairs:
        for key in keys:
            add("warmups", f"{n1}:a - {n2}:a", key, paired_difference(s1[WARMUP][key], s2[WARMUP][key], n_boot, n_boot))
    for name, s in scores.items():
        for arm, key in itertools.product(grpo[name], keys):
            add("gains", f"{name}:{arm} - {name}:a", key,
                paired_difference(s[arm][key], s[WARMUP][key], n_boot, n_boot))
    for (n1, s1), (n2, s2) in pairs:
        for a1, a2, key in itertools.product(grpo[n1], grpo[n2], keys):
            label = f"{n1}:{a1} - {n2}:{a2}"
            add("direct", label, key, paired_difference(s1[a1][key], s2[a2][key], n_boot, n_boot))
            add("gain_difference", f"({n1}:{a1} - {n1}:a) - ({n2}:{a2} - {n2}:a)", key,
                paired_difference(_gain(s1[a1][key], s1[WARMUP][key]), _gain(s2[a2][key], s2[WARMUP][key]),
                                  n_boot, n_boot))
    return _text(reps, rows, n_boot, unpaired), out


def _text(reps: dict[str, list[Replicate]], rows: dict[str, list[str]], n_boot: int, unpaired: list[str]) -> str:
    runs = []
    for name, rs in reps.items():
        against = trained_against(rs)
        arms = "; ".join(f"({arm}) {phrase}" for arm, phrase in against.items()) or "no GRPO arm"
        runs.append(f"- `{name}`: seeds {', '.join(str(r.seed) for r in rs)} "
                    f"({', '.join(f'`{r.root}`' for r in rs)}); GRPO arms trained against: {arms}."
                    + shared_weights_line(scored_by_training_weights(rs)))
    return "\n".join([
        "## Arms of different runs, each through its own warm-up", "",
        ("Runs compared (same plan and prompt set, checked; each run's arms started from that run's own warm-up, so "
        "arms of two runs did not start from the same adapter):"), "", *runs, "",
        ("Judge-free per-prompt scores only (the runs' training judges differ, so the judge's own scores do not "
        f"compare). Intervals: the prompt x seed pairs resampled ({n_boot} times); p: sign-flip permutation test."
        + (f" Not compared with each other (no seed in common, so no prompt x seed pair): {'; '.join(unpaired)}."
           if unpaired else "")), "",
        "### Warm-up against warm-up (the cross-run noise floor: the same recipe trained twice)", "", *rows["warmups"],
        "", "### Each GRPO arm's gain over its own run's warm-up", "", *rows["gains"], "",
        "### GRPO arms of different runs, directly (warm-up noise included)", "", *rows["direct"], "",
        "### GRPO arms of different runs, gain against gain (each arm minus its own warm-up, per prompt x seed)", "",
        *rows["gain_difference"], ""])


def across_goals(figs: dict[str, Any], this: str) -> list[str]:
    """The goal "(c) beats (b) on the independent scorer" for an arm (b) of another run, compared with run ``this``'s
    (c) (:func:`compare_runs`'s figures): met when the paired interval of the gain difference lies above 0. One line
    per other run with a (b); none without such a comparison."""
    out = []
    prefix = f"({this}:c - {this}:a) - ("
    for label, d in figs.get("gain_difference", {}).items():
        if not label.startswith(prefix) or not label.endswith(":independent_win") or d["diff"] is None:
            continue
        other = label[len(prefix):].split(" - ")[0]
        if not other.endswith(":b"):
            continue
        verdict = "met" if d["lo"] > 0 else "missed"
        out.append(f"(c) beats {other} on the independent scorer, across runs (each arm's gain over its own run's "
                   f"warm-up): {verdict}: {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}], {d['n']} pairs, "
                   f"permutation p {d['p']:.4f}")
    return out
