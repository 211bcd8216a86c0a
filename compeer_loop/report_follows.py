"""The report's section "What the reward follows": what the trained judge's total follows in the evaluated replies
(length, the annotated strategy), whether it and the independent scorer pay for a question where the annotated
strategy is another one, and what moved in training.

The questions table exists because every arm trained against v3 drifted to short questions
(docs/evaluations/compeer-loop/qwen15-v3-e-seed1/): a reply "asks" when it holds a question mark
(:func:`compeer_loop.replies.asks_question`); only replies at rounds whose annotated strategy is not *Question* are
counted, so a question there is out of place by the annotation. The judge's preference verdict (the reply against
the real one, -1 / 0 / +1) and the independent scorer's win (1 / 0.5 / 0) are compared between the replies that ask
and those that do not, over all format-valid judged replies and over the short ones (at most
:data:`SHORT_WORDS` words), where length differs least.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from compeer_loop.replies import asks_question
from compeer_loop.report_drift import training_sections
from compeer_loop.report_runs import fmt, late_slopes, quarters
from compeer_loop.seeds import Replicate
from compeer_loop.stats import judge_follows
from data_builder.cues import SHORT_WORDS  # a short reply, here as in the judge items' cue table

N_BOOT = 1000


def _difference(a: Sequence[float], b: Sequence[float], seed: int = 0) -> str:
    """mean(a) - mean(b) with a 95% interval (each side resampled with replacement, :data:`N_BOOT` times)."""
    if not a or not b:
        return "n/a"
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    draws = (rng.choice(xa, (N_BOOT, len(xa))).mean(axis=1) - rng.choice(xb, (N_BOOT, len(xb))).mean(axis=1))
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return f"{xa.mean() - xb.mean():+.2f} [{lo:+.2f}, {hi:+.2f}]"


def question_figures(rs: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """For one policy's records: the judge's preference (``pref``) and the independent scorer's win (``win``) of the
    replies that ask (``ask``) and that do not (``not``), all and short (``short_ask``, ``short_not``), over the
    format-valid judged replies at rounds annotated with a strategy other than *Question*."""
    out: dict[str, dict[str, list[float]]] = {k: {"pref": [], "win": []} for k in ("ask", "not", "short_ask",
                                                                                  "short_not")}
    for r in rs:
        gold, pref = r.get("gold_strategy"), r.get("reward_preference")
        if not r.get("format_ok") or r.get("judge_status") != "ok" or pref is None or not gold or gold == "Question":
            continue
        text = str(r.get("text", ""))
        side = "ask" if asks_question(text) else "not"
        keys = [side] + ([f"short_{side}"] if len(text.split()) <= SHORT_WORDS else [])
        win = r.get("independent_win") if r.get("independent_status") == "ok" else None
        for k in keys:
            out[k]["pref"].append(float(pref))
            if win is not None:
                out[k]["win"].append(float(win))
    return out


def questions_table(records: dict[str, list[dict[str, Any]]], labels: dict[str, str] | None = None) -> list[str]:
    """The table (a row per policy, seeds pooled) with its explanation."""
    labels = labels or {}
    rows = []
    for p, rs in records.items():
        f = question_figures(rs)
        cells = []
        for ask, no in (("ask", "not"), ("short_ask", "short_not")):
            cells.append(f"{len(f[ask]['pref'])} / {len(f[no]['pref'])}")
            cells += [_difference(f[ask][k], f[no][k]) for k in ("pref", "win")]
        rows.append(f"| {labels.get(p, p)} | " + " | ".join(cells) + " |")
    return [("Questions out of place: at rounds whose annotated strategy is not *Question*, the trained judge's "
             "preference verdict (-1 / 0 / +1) and the independent scorer's win (1 / 0.5 / 0) of the format-valid "
             "replies that ask a question minus those of the replies that do not (95% intervals: each side "
             f"resampled), over all of them and over the short ones (at most {SHORT_WORDS} words). A judge that pays "
             "for a question out of place has a positive difference where the scorer's is not:"), "",
            ("| policy | replies asking / not | judge preference, asking - not | scorer win, asking - not | short "
             "replies asking / not | short: judge preference, asking - not | short: scorer win, asking - not |"),
            "|---|---|---|---|---|---|---|", *rows]


def what_the_reward_follows(records: dict[str, list[dict[str, Any]]], reps: Sequence[Replicate],
                            labels: dict[str, str] | None = None) -> str:
    """The section's generated tables: what the trained judge's total follows in each policy's evaluated replies
    (seeds pooled), how it and the independent scorer treat questions out of place (:func:`questions_table`), how
    truncation, length and the format reward moved in training (first -> last quarter of the steps; a row per arm
    and seed when several), then the tables read from the arms' logged candidates
    (:func:`compeer_loop.report_drift.training_sections`). ``labels``: each policy's row label (else its name)."""
    labels = labels or {}
    rows = [("| policy | replies (format ok, judged) | Spearman rho (length in words, total) | total, named strategy = "
            "annotated (n) | total, other strategy (n) |"), "|---|---|---|---|---|"]
    for p, rs in records.items():
        f = judge_follows(rs)
        rows.append(f"| {labels.get(p, p)} | {f['n']} | {fmt(f['rho_length_total'])} | "
                    f"{fmt(f['total_strategy_right'])} ({f['n_right']}) | {fmt(f['total_strategy_wrong'])} "
                    f"({f['n_wrong']}) |")
    keys = ("completions/clipped_ratio", "completions/mean_length", "compeer/format_reward_mean",
            "compeer/preference_reward_mean")
    moved = {k: quarters(reps, k) for k in keys}
    slopes = late_slopes(reps, "reward")
    train = [("| arm | truncated at max_completion_length | completion length (tokens) | format reward (the arm's judge) | "
             "preference reward (the arm's judge) | reward, second half: slope per step [95%] |"),
             "|---|---|---|---|---|---|"]
    for arm in moved[keys[0]]:
        slope = ("{:+.4f} [{:+.4f}, {:+.4f}]".format(*slopes[arm])) if arm in slopes else "n/a"
        train.append(f"| {arm} | " + " | ".join(
            f"{moved[k][arm][0]:.2f} -> {moved[k][arm][1]:.2f}" if arm in moved[k] else "n/a" for k in keys)
            + f" | {slope} |")
    return "\n".join([*rows, "", *questions_table(records, labels), "", (f"In training (first -> last quarter of the steps; `max_completion_length` "
                                  f"{reps[0].settings.max_completion_length}). Has the training reward flattened? The "
                                  "last column is the least-squares slope of the logged reward per step over the second "
                                  "half of the steps, with a 95% interval (the steps resampled): an interval holding 0 "
                                  "says the last half's trend is not told from the noise, its width how large a trend "
                                  "the noise could hide:"), "", *train, *training_sections(reps)])


