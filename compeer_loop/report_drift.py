"""The report's "what the arms wrote in training" table: how each GRPO arm's own rollouts moved from the first to the
last quarter of its steps, read from its logged candidates (``<arm>/completions.jsonl``, ``log_completions_file``).

The evaluation says where an arm ended; this says which way it went on the training prompts (ESConv train), and it
is there even for an arm whose evaluation did not run: the strategy its rollouts name most (its share), the mean
reply words, and the share of degenerate rollouts (the dataset pipeline's rule, logged per candidate as ``mark``:
:func:`data_builder.policy_negatives.is_degenerate`, the rule the evaluation's degenerate share uses).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from compeer_loop.report_groups import flat_groups_section
from compeer_loop.report_runs import arm_logs
from compeer_loop.report_strategy import strategy_section
from compeer_loop.seeds import Replicate
from data_builder.policy_negatives import COMPLETIONS_FILE, is_degenerate
from evaluator.prompts import cer_reply


def quarter_figures(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """``{"first": ..., "last": ...}`` for one arm's logged candidates: the first and the last quarter of its steps
    (by step number), each with ``n`` (candidates), ``top`` / ``top_share`` (the strategy named most in step 3, read
    as the evaluation reads it, :func:`evaluator.prompts.cer_reply`; None for no strategy named; and its share),
    ``words`` (mean reply words) and ``degenerate`` (share); None when the arm logged fewer than 4 steps."""
    steps = sorted({int(r["step"]) for r in rows if isinstance(r.get("step"), int)})
    if len(steps) < 4:
        return None
    k = len(steps) // 4
    out = {}
    for name, keep in (("first", set(steps[:k])), ("last", set(steps[-k:]))):
        part = [r for r in rows if r.get("step") in keep]
        read = [cer_reply(str(r.get("text", ""))) for r in part]
        top, count = Counter(c["strategy"] for c in read).most_common(1)[0]
        words = sum(len(c["text"].split()) for c in read)
        out[name] = {"n": len(part), "top": top, "top_share": count / len(part), "words": words / len(part),
                     "degenerate": sum(is_degenerate(r.get("mark")) for r in part) / len(part)}
    return out


def drift_section(reps: Sequence[Replicate]) -> list[str]:
    """The table (a row per GRPO arm, per seed when several) with its explanation; no lines when no arm logged its
    completions."""
    rows = []
    for tag, logged in arm_logs(reps, COMPLETIONS_FILE):
        q = quarter_figures(logged)
        if q is None:
            continue
        f, la = q["first"], q["last"]
        rows.append(f"| {tag} | {f['top'] or 'none named'} {100 * f['top_share']:.0f}% -> {la['top'] or 'none named'} "
                    f"{100 * la['top_share']:.0f}% | {f['words']:.1f} -> {la['words']:.1f} | "
                    f"{100 * f['degenerate']:.1f} -> {100 * la['degenerate']:.1f} | {f['n']} / {la['n']} |")
    if not rows:
        return []
    return ["", ("What the arms wrote in training (their logged rollouts on ESConv train prompts, first -> last quarter "
                 "of the steps; there even for an arm not evaluated): the strategy named most in step 3 and its share, "
                 "the mean reply words, the share the degenerate-reply rule marks (as in the evaluation):"), "",
            "| arm | strategy named most (share) | reply words | degenerate % | rollouts (first / last quarter) |",
            "|---|---|---|---|---|", *rows]


def training_sections(reps: Sequence[Replicate]) -> list[str]:
    """The tables read from the GRPO arms' logged candidates, in the report's order: where the advantage came from
    (:mod:`compeer_loop.report_groups`), what the arms wrote (:func:`drift_section`) and what the judge favoured by
    named strategy (:mod:`compeer_loop.report_strategy`)."""
    return [*flat_groups_section(reps), *drift_section(reps), *strategy_section(reps)]
