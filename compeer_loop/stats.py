"""Figures of one evaluated policy with bootstrap 95% confidence intervals over prompts.

Each figure is a function of the per-prompt records; a bootstrap replicate resamples the prompts with replacement
(seeded) and recomputes the figure on the resample, so corpus-level figures (BLEU-2, distinct-n) get intervals
the same way as per-prompt means. Distinct-n is biased under resampling with replacement (a resample repeats
replies, so fewer of its n-grams are distinct: on 30 replies the resampled values sat some 15 points below the
figure); its percentile interval is shifted by the bootstrap's bias (the figure minus the mean of the resampled
values), so it keeps the resampling spread around the figure itself. Figures a policy has no data for are None,
never made up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cer.taxonomy import strategy_accuracy
from evaluator.metrics import bleu2, distinct_n, mean_length, rouge_l

Record = dict[str, Any]
Figure = Callable[[Sequence[Record]], float | None]


def _mean(values: list[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def format_ok(rs: Sequence[Record]) -> float | None:
    return _mean([100.0 * bool(r.get("format_ok")) for r in rs])


def _judged(rs: Sequence[Record], key: str) -> float | None:
    return _mean([float(r[key]) for r in rs if r.get("judge_status") == "ok" and r.get(key) is not None])


FIGURES: dict[str, Figure] = {
    "strategy_accuracy": lambda rs: strategy_accuracy([r.get("strategy") for r in rs],
                                                      [r.get("gold_strategy") for r in rs]),
    "bleu_2": lambda rs: bleu2([r["text"] for r in rs], [r["reference"] for r in rs]),
    "rouge_l": lambda rs: _mean([float(r["rouge_l"]) for r in rs]),
    "distinct_1": lambda rs: distinct_n([r["text"] for r in rs], 1),
    "distinct_2": lambda rs: distinct_n([r["text"] for r in rs], 2),
    "format_ok": format_ok,
    "mean_length": lambda rs: _mean([float(r["length"]) for r in rs]),
    "reward_total": lambda rs: _judged(rs, "reward_total"),
    "reward_steps": lambda rs: _judged(rs, "reward_steps_mean"),
    "reward_preference": lambda rs: _judged(rs, "reward_preference"),
    "reward_format": lambda rs: _judged(rs, "reward_format"),
    "judge_parse_failure": lambda rs: _mean([100.0 * (r.get("judge_status") == "parse_failed") for r in rs
                                              if r.get("judge_status") is not None]),
}
#: figures where higher is better (the others are descriptive)
#: corpus-level figures whose bootstrap is biased by repeated replies (their intervals are bias-shifted)
BIAS_SHIFTED = ("distinct_1", "distinct_2")
HIGHER_IS_BETTER = ("strategy_accuracy", "bleu_2", "rouge_l", "distinct_1", "distinct_2", "format_ok",
                    "reward_total", "reward_steps", "reward_preference", "reward_format")


def add_item_figures(r: Record) -> Record:
    """Per-prompt values the figures use: ROUGE-L of the reply against the real turn, the reply's length."""
    r["rouge_l"] = rouge_l([r["text"]], [r["reference"]])
    r["length"] = mean_length([r["text"]]) or 0.0
    return r


def bootstrap(records: Sequence[Record], figure: Figure, n_boot: int = 1000, seed: int = 0,
              alpha: float = 0.05, shift_bias: bool = False) -> dict[str, Any]:
    """The figure on all records and its percentile interval over ``n_boot`` resamples of the prompts
    (``shift_bias``: moved by the figure minus the resamples' mean, see the module docstring)."""
    value = figure(records)
    out: dict[str, Any] = {"value": value, "lo": None, "hi": None, "n": len(records)}
    if value is None or len(records) < 2:
        return out
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(records), len(records))
        v = figure([records[i] for i in idx])
        if v is not None:
            reps.append(v)
    if reps:
        shift = float(value - np.mean(reps)) if shift_bias else 0.0
        lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
        out["lo"], out["hi"] = float(lo) + shift, float(hi) + shift
        if shift_bias:
            out["bias_shift"] = shift
    return out


def summarise(records: Sequence[Record], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Every figure of :data:`FIGURES` with its interval, plus counts."""
    answered = [r for r in records if r.get("status") == "ok"]
    figures = {name: bootstrap(answered, fn, n_boot, seed, shift_bias=name in BIAS_SHIFTED)
               for name, fn in FIGURES.items()}
    return {"prompts": len(records), "answered": len(answered),
            "judged_ok": sum(1 for r in answered if r.get("judge_status") == "ok"), "figures": figures}


def disjoint(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether interval ``a`` lies entirely above interval ``b`` (None when either is missing)."""
    if a.get("lo") is None or b.get("hi") is None:
        return None
    return bool(a["lo"] > b["hi"])


def judge_follows(rs: Sequence[Record]) -> dict[str, Any]:
    """What the trained judge's total follows in one policy's replies (format valid, judged): Spearman's rho between
    the reply's length in words and the total, and the mean total when the named strategy is the annotated one and
    when it is not (a reward that does not separate them cannot teach strategy choice). None where too few."""
    from scipy.stats import spearmanr

    ok = [r for r in rs if r.get("format_ok") and r.get("judge_status") == "ok" and r.get("reward_total") is not None]
    right = [float(r["reward_total"]) for r in ok if r.get("gold_strategy") and r.get("strategy") == r["gold_strategy"]]
    wrong = [float(r["reward_total"]) for r in ok if r.get("gold_strategy") and r.get("strategy") != r["gold_strategy"]]
    lengths = [len(str(r.get("text", "")).split()) for r in ok]
    totals = [float(r["reward_total"]) for r in ok]
    rho = None  # undefined with fewer than 3 replies or a constant side
    if len(ok) >= 3 and len(set(lengths)) > 1 and len(set(totals)) > 1:
        rho = float(spearmanr(lengths, totals).statistic)
    return {"n": len(ok), "rho_length_total": rho, "total_strategy_right": _mean(right), "n_right": len(right),
            "total_strategy_wrong": _mean(wrong), "n_wrong": len(wrong)}
