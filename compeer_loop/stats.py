"""Figures of one evaluated policy with bootstrap 95% confidence intervals over prompts.

Each figure is a function of the per-prompt records; a bootstrap replicate resamples the prompts with replacement
(seeded) and recomputes the figure on the resample, so corpus-level figures (BLEU-2, distinct-n) get intervals
the same way as per-prompt means; with several seeds pooled, a corpus-level figure is the mean of each seed's
(:func:`per_seed`), so a policy evaluated under three seeds compares with one evaluated under two. Distinct-n is
biased under resampling with replacement (a resample repeats replies, so fewer of its n-grams are distinct: on 30
replies the resampled values sat some 15 points below the figure); its percentile interval is shifted by the
bootstrap's bias (the figure minus the mean of the resampled values), so it keeps the resampling spread around the
figure itself. The most frequent reply's share is biased the other way (on 12 distinct replies the figure is 8.3%
and every resample's is 16.7% or more) and shifted the same way.
Figures a policy has no data for are None, never made up.

Beside the figures (issue 26, item 4): the majority-strategy baseline on the same prompts and Cohen's kappa of the
named strategy with the annotated one (chance-corrected: 0 for always naming one strategy), the share of degenerate
replies and of the most frequent reply (:mod:`compeer_loop.replies`), the judge's total among format-valid replies
only, distinct-n on the first ``N`` tokens, and the independent scorer's comparison with the real reply
(:mod:`compeer_loop.independent`): the reply's win share, the share of prompts not scored and the share of the
scorer's answers that named the first position (its position bias), and the win share among the replies whose
length is within :data:`MATCHED_LENGTH` of the real reply's, with their share (the scorer favours longer replies).
Between two arms, :func:`paired_difference` compares per-prompt scores on the prompts both answered (seeds pooled: a
pair is one prompt under one seed), with a paired bootstrap 95% interval of the mean difference and a sign-flip
permutation p-value; :func:`seed_spread` is the standard deviation of an arm's per-seed means.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cer.agreement import kappa, label_matrix
from cer.taxonomy import strategy_accuracy
from compeer_loop.replies import first_tokens, is_degenerate, mark_reply, top_reply_share
from evaluator.metrics import bleu2, distinct_n, mean_length, rouge_l

Record = dict[str, Any]
Figure = Callable[[Sequence[Record]], float | None]


def _mean(values: list[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def format_ok(rs: Sequence[Record]) -> float | None:
    return _mean([100.0 * bool(r.get("format_ok")) for r in rs])


def _judged(rs: Sequence[Record], key: str) -> float | None:
    return _mean([float(r[key]) for r in rs if r.get("judge_status") == "ok" and r.get(key) is not None])


def _first(r: Record) -> str:
    """The reply's first tokens (:func:`add_item_figures`; :data:`FIRST_TOKENS` for a record it did not see)."""
    return str(r["first_text"]) if "first_text" in r else first_tokens(r["text"], FIRST_TOKENS)


def _gold(rs: Sequence[Record]) -> list[Record]:
    return [r for r in rs if r.get("gold_strategy")]


def majority_baseline(rs: Sequence[Record]) -> float | None:
    """Strategy accuracy (times 100) of always naming the most frequent annotated strategy of these prompts."""
    gold = [str(r["gold_strategy"]) for r in _gold(rs)]
    return 100.0 * max(gold.count(g) for g in set(gold)) / len(gold) if gold else None


def strategy_kappa(rs: Sequence[Record]) -> float | None:
    """Cohen's kappa of the named strategy (none named: a class of its own) with the annotated one."""
    gold = _gold(rs)
    if len(gold) < 2:
        return None
    return kappa(label_matrix([str(r["gold_strategy"]) for r in gold], [r.get("strategy") for r in gold]))


def _format_ok_total(rs: Sequence[Record]) -> float | None:
    return _mean([float(r["reward_total"]) for r in rs if r.get("format_ok") and r.get("judge_status") == "ok"
                  and r.get("reward_total") is not None])


def _compared(rs: Sequence[Record]) -> list[Record]:
    """The records the independent scorer compared with the real reply (a record rated 1-5 before it compared,
    ``independent_rating``, is not one of them)."""
    return [r for r in rs if "independent_win" in r]


def _scored(rs: Sequence[Record]) -> list[Record]:
    """The ``ok`` comparisons with a win value (a ``failed`` or ``engine_error`` one has none)."""
    return [r for r in _compared(rs) if r.get("independent_status") == "ok" and r["independent_win"] is not None]


def win_share(rs: Sequence[Record]) -> float | None:
    """The independent scorer's win share of the replies against the real reply: the mean of ``independent_win``
    (1, 0.5 or 0) over the ``ok`` comparisons; a ``failed`` or ``engine_error`` one has no win and is left out."""
    return _mean([float(r["independent_win"]) for r in _scored(rs)])


#: the length band, as a multiple of the real reply's length, within which the independent scorer's win share is also
#: reported: a zero-shot rater that prefers longer replies (on the run of 2026-11-30 the untrained base, rarely in the
#: CER format, won 0.83 overall and 0.78 within the band) is then compared on replies of the real one's length
MATCHED_LENGTH = (0.67, 1.5)


def _length_matched(r: Record) -> bool:
    ref = r["reference_length"] if "reference_length" in r else mean_length([r["reference"]]) or 0.0
    own = r["length"] if "length" in r else mean_length([r["text"]]) or 0.0
    return ref > 0 and MATCHED_LENGTH[0] <= own / ref <= MATCHED_LENGTH[1]


def matched_win_share(rs: Sequence[Record]) -> float | None:
    """:func:`win_share` of the replies whose length is within :data:`MATCHED_LENGTH` of the real reply's."""
    return win_share([r for r in _scored(rs) if _length_matched(r)])


def _matched_share(rs: Sequence[Record]) -> float | None:
    return _mean([100.0 * _length_matched(r) for r in _scored(rs)])


def _independent_unscored(rs: Sequence[Record]) -> float | None:
    return _mean([100.0 * (r.get("independent_status") != "ok") for r in _compared(rs)])


def _independent_first(rs: Sequence[Record]) -> float | None:
    return _mean([100.0 * float(r["independent_first_position"]) for r in _compared(rs)
                  if r.get("independent_status") == "ok" and r.get("independent_first_position") is not None])


def per_seed(figure: Figure) -> Figure:
    """A corpus-level figure (its value depends on how many replies the corpus holds: distinct-n falls as replies are
    added) made comparable between policies evaluated under different numbers of seeds: on records of several seeds
    (``r["seed"]``), the mean of the figure on each seed's records; on one seed's, the figure itself."""
    def figure_per_seed(rs: Sequence[Record]) -> float | None:
        groups: dict[Any, list[Record]] = {}
        for r in rs:
            groups.setdefault(r.get("seed"), []).append(r)
        if len(groups) < 2:
            return figure(rs)
        return _mean([v for v in (figure(g) for g in groups.values()) if v is not None])
    return figure_per_seed


FIGURES: dict[str, Figure] = {
    "strategy_accuracy": lambda rs: strategy_accuracy([r.get("strategy") for r in rs],
                                                      [r.get("gold_strategy") for r in rs]),
    "bleu_2": per_seed(lambda rs: bleu2([r["text"] for r in rs], [r["reference"] for r in rs])),
    "rouge_l": lambda rs: _mean([float(r["rouge_l"]) for r in rs]),
    "distinct_1": per_seed(lambda rs: distinct_n([r["text"] for r in rs], 1)),
    "distinct_2": per_seed(lambda rs: distinct_n([r["text"] for r in rs], 2)),
    "distinct_1_first": per_seed(lambda rs: distinct_n([_first(r) for r in rs], 1)),
    "distinct_2_first": per_seed(lambda rs: distinct_n([_first(r) for r in rs], 2)),
    "majority_baseline": majority_baseline,
    "strategy_kappa": strategy_kappa,
    "degenerate": lambda rs: _mean([100.0 * is_degenerate(r.get("reply_mark")) for r in rs]),
    # the same rule on ESConv's real supporter reply at the same prompts: the rate a policy that wrote exactly what
    # the real supporters wrote would be counted at ("I see." is short with no content); beside "degenerate" as the
    # majority baseline is beside strategy accuracy
    "reference_degenerate": lambda rs: _mean([100.0 * is_degenerate(r.get("reference_mark")) for r in rs]),
    "top_reply_share": per_seed(lambda rs: top_reply_share([r["text"] for r in rs])[0]),
    "format_ok": format_ok,
    "mean_length": lambda rs: _mean([float(r["length"]) for r in rs]),
    "reward_total": lambda rs: _judged(rs, "reward_total"),
    "reward_steps": lambda rs: _judged(rs, "reward_steps_mean"),
    "reward_preference": lambda rs: _judged(rs, "reward_preference"),
    "reward_format": lambda rs: _judged(rs, "reward_format"),
    "reward_total_format_ok": _format_ok_total,
    "independent_win_share": win_share,
    "independent_win_share_matched": matched_win_share,
    "independent_matched_share": _matched_share,
    "independent_unscored": _independent_unscored,
    "independent_first_position": _independent_first,
    "judge_parse_failure": lambda rs: _mean([100.0 * (r.get("judge_status") == "parse_failed") for r in rs
                                              if r.get("judge_status") is not None]),
}
#: corpus-level figures whose bootstrap is biased by repeated replies (their intervals are bias-shifted): a resample
#: repeats replies, which lowers distinct-n and raises the most frequent reply's share
BIAS_SHIFTED = ("distinct_1", "distinct_2", "distinct_1_first", "distinct_2_first", "top_reply_share")
#: figures where higher is better (the others are descriptive)
HIGHER_IS_BETTER = ("strategy_accuracy", "bleu_2", "rouge_l", "distinct_1", "distinct_2", "format_ok",
                    "reward_total", "reward_steps", "reward_preference", "reward_format", "strategy_kappa",
                    "distinct_1_first", "distinct_2_first", "reward_total_format_ok", "independent_win_share",
                    "independent_win_share_matched")
#: first tokens of a reply that distinct-n is also computed on (the plan's ``distinct_first_tokens``)
FIRST_TOKENS = 16


def add_item_figures(r: Record, first_n: int = FIRST_TOKENS) -> Record:
    """Per-prompt values the figures use: ROUGE-L of the reply against the real turn, the reply's and the real turn's
    lengths, the reply's first ``first_n`` tokens and the degenerate-reply rule's mark
    (:func:`compeer_loop.replies.mark_reply`), of the reply and of the prompt's real supporter reply
    (``reference_mark``)."""
    r["rouge_l"] = rouge_l([r["text"]], [r["reference"]])
    r["length"] = mean_length([r["text"]]) or 0.0
    r["reference_length"] = mean_length([r["reference"]]) or 0.0
    r["first_text"] = first_tokens(r["text"], first_n)
    r["reply_mark"] = mark_reply(r["text"], r.get("history") or [], r.get("raw"), bool(r.get("format_ok", True)))
    r["reference_mark"] = mark_reply(r["reference"], r.get("history") or [])
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


#: the figures that need no judge and no scorer: what a policy's answers alone show (format, strategy, replies)
ANSWER_FIGURES = ("format_ok", "strategy_accuracy", "majority_baseline", "strategy_kappa", "degenerate",
                  "reference_degenerate", "top_reply_share", "mean_length", "rouge_l", "bleu_2", "distinct_1",
                  "distinct_2", "distinct_1_first", "distinct_2_first")


def summarise_answers(records: Sequence[Record], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The judge-free figures of :data:`ANSWER_FIGURES` of a policy's greedy answers (``eval/<policy>/answers.jsonl``,
    e.g. the warm-up probe's), each with its interval, beside the count of each degenerate-reply mark, the named
    strategies' counts (none named: ``null``), the CER parts missing from format-invalid answers, and the most
    frequent reply with its share."""
    answered = [add_item_figures(dict(r)) for r in records if r.get("status") == "ok"]
    figures = {name: bootstrap(answered, FIGURES[name], n_boot, seed, shift_bias=name in BIAS_SHIFTED)
               for name in ANSWER_FIGURES}
    share, reply = top_reply_share([str(r["text"]) for r in answered])
    missing = Counter(",".join(r.get("missing") or []) or "none" for r in answered)
    return {"prompts": len(records), "answered": len(answered), "figures": figures,
            "marks": dict(Counter(str(r.get("reply_mark") or "none") for r in answered).most_common()),
            "named_strategies": dict(Counter(str(r.get("strategy")) if r.get("strategy") else "null"
                                             for r in answered).most_common()),
            "gold_strategies": dict(Counter(str(r["gold_strategy"]) for r in _gold(answered)).most_common()),
            "missing_parts": dict(missing.most_common()), "top_reply": {"share": share, "text": reply}}


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


#: per-prompt scores the paired comparisons use (None: the prompt has no such score and is left out of the pairs)
PER_PROMPT: dict[str, Callable[[Record], float | None]] = {
    "strategy_correct": lambda r: (100.0 * (r.get("strategy") == r["gold_strategy"]) if r.get("gold_strategy")
                                   else None),
    "rouge_l": lambda r: r.get("rouge_l"),
    "reward_total": lambda r: r.get("reward_total") if r.get("judge_status") == "ok" else None,
    "reward_total_graded": lambda r: r.get("reward_total_graded") if r.get("judge_status") == "ok" else None,
    "reward_total_format_ok": lambda r: (r.get("reward_total") if r.get("judge_status") == "ok" and r.get("format_ok")
                                         else None),
    "independent_win": lambda r: r.get("independent_win") if r.get("independent_status") == "ok" else None,
}


def per_prompt(records: Sequence[Record], key: str, seed: int = 0) -> dict[tuple[int, str], float]:
    """``(seed, prompt id) -> score`` of the answered records that have a ``key`` score (:data:`PER_PROMPT`); the seed
    is the record's own ``seed`` (records of several seed replicates pooled), ``seed`` for a record without one."""
    out = {}
    for r in records:
        value = PER_PROMPT[key](r) if r.get("status") == "ok" else None
        if value is not None:
            out[(int(r.get("seed", seed)), str(r["id"]))] = float(value)
    return out


def paired_difference(a: dict[Any, float], b: dict[Any, float], n_boot: int = 2000, n_perm: int = 2000,
                      seed: int = 0, alpha: float = 0.05) -> dict[str, Any]:
    """Mean of ``a - b`` over the keys both have (prompt x seed pairs), its paired bootstrap ``1 - alpha`` interval
    (the pairs resampled with replacement) and a two-sided sign-flip permutation p-value (each pair's difference
    flipped at random; ``(1 + hits) / (1 + n_perm)``). None where fewer than 2 pairs."""
    keys = sorted(set(a) & set(b))
    out: dict[str, Any] = {"n": len(keys), "diff": None, "lo": None, "hi": None, "p": None}
    if len(keys) < 2:
        return out
    d = np.array([a[k] - b[k] for k in keys])
    rng = np.random.default_rng(seed)
    observed = float(d.mean())
    boots = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    flips = rng.choice(np.array([-1.0, 1.0]), size=(n_perm, len(d)))
    hits = int(np.sum(np.abs((flips * d).mean(axis=1)) >= abs(observed) - 1e-12))
    out.update(diff=observed, lo=float(lo), hi=float(hi), p=(1 + hits) / (1 + n_perm))
    return out


def seed_spread(scores: dict[tuple[int, str], float]) -> dict[str, Any]:
    """Per seed, the arm's mean score, and the standard deviation (ddof 1) of those means (None with one seed)."""
    by_seed: dict[int, list[float]] = {}
    for (s, _), v in scores.items():
        by_seed.setdefault(s, []).append(v)
    means = {s: float(np.mean(v)) for s, v in sorted(by_seed.items())}
    std = float(np.std(list(means.values()), ddof=1)) if len(means) >= 2 else None
    return {"seed_means": means, "std": std}
