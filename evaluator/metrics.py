"""Judge-independent figures of a run: distinct-n, reply length, and against gold replies BLEU-2, ROUGE-L and
strategy accuracy.

Tokens: lower-cased words and punctuation marks, with every CJK character a token of its own (the usual way
Chinese ESC papers count). BLEU-2 is NLTK's corpus BLEU with weights (0.5, 0.5) and Chen & Cherry's smoothing 1,
times 100; ROUGE-L is the mean F-measure of Google's ``rouge-score`` over the pairs (on the same tokens), times 100;
distinct-n is the number of distinct n-grams over all n-grams of all replies (Li et al., 2016), times 100.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from cer.taxonomy import strategy_accuracy

_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+|[^\w\s]",
                    re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased word, punctuation and single-CJK-character tokens."""
    return _TOKEN.findall(text.lower())


@lru_cache(maxsize=1 << 17)
def _tokens(text: str) -> tuple[str, ...]:
    """:func:`tokenize`, kept: a bootstrap recomputes corpus figures on resamples of the same texts."""
    return tuple(tokenize(text))


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Distinct n-grams / all n-grams over ``texts``, times 100 (None when there is no n-gram at all)."""
    grams = [toks[i:i + n] for toks in map(_tokens, texts) for i in range(len(toks) - n + 1)]
    return 100.0 * len(set(grams)) / len(grams) if grams else None


def mean_length(texts: Sequence[str]) -> float | None:
    """Mean number of tokens per text (None for no text)."""
    return sum(len(tokenize(t)) for t in texts) / len(texts) if texts else None


def bleu2(hypotheses: Sequence[str], references: Sequence[str]) -> float | None:
    """Corpus BLEU-2 (NLTK, smoothing 1) times 100; None for no pair."""
    if len(hypotheses) != len(references):
        raise ValueError(f"bleu2: {len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        return None
    from nltk.translate.bleu_score import Fraction, SmoothingFunction, brevity_penalty

    # NLTK's corpus_bleu, its sums taken over per-pair statistics kept by _bleu2_pair (the same numbers: a test
    # compares them; a bootstrap then costs a sum per resample instead of every pair's n-gram counts again)
    num1, den1, num2, den2, hyp_len, ref_len = (sum(col) for col in zip(*map(_bleu2_pair, hypotheses, references)))
    if num1 == 0:
        return 0.0
    p_n = SmoothingFunction().method1([Fraction(num1, den1, _normalize=False), Fraction(num2, den2, _normalize=False)])
    score = brevity_penalty(ref_len, hyp_len) * math.exp(math.fsum(0.5 * math.log(p) for p in p_n if p > 0))
    return 100.0 * float(score)


@lru_cache(maxsize=1 << 17)
def _bleu2_pair(hypothesis: str, reference: str) -> tuple[int, int, int, int, int, int]:
    """One pair's share of corpus BLEU-2: NLTK's clipped unigram and bigram matches and counts, the hypothesis
    length and the reference length closest to it."""
    from nltk.translate.bleu_score import closest_ref_length, modified_precision

    hyp, refs = list(_tokens(hypothesis)), [list(_tokens(reference))]
    p1, p2 = modified_precision(refs, hyp, 1), modified_precision(refs, hyp, 2)
    return p1.numerator, p1.denominator, p2.numerator, p2.denominator, len(hyp), closest_ref_length(refs, len(hyp))


class _Tokens:
    """``rouge-score`` tokenizer protocol over :func:`tokenize` (its own drops non-ASCII text)."""

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text)


def rouge_l(hypotheses: Sequence[str], references: Sequence[str]) -> float | None:
    """Mean ROUGE-L F-measure (``rouge-score``) times 100; None for no pair."""
    if len(hypotheses) != len(references):
        raise ValueError(f"rouge_l: {len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        return None
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Tokens())
    scores = [scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hypotheses, references)]
    return 100.0 * sum(scores) / len(scores)


def strategy_figures(predicted: Sequence[str | None], gold: Sequence[str | None]) -> dict[str, Any]:
    """Strategy accuracy (:func:`cer.taxonomy.strategy_accuracy`) over the items with a gold strategy, their count
    ``n`` and ``unnamed``, those whose prediction is None (no ``<strategy>`` part, or one naming no taxonomy
    strategy: counted as wrong)."""
    pairs = [(p, g) for p, g in zip(predicted, gold, strict=True) if g]
    return {"accuracy": strategy_accuracy(predicted, gold), "n": len(pairs),
            "unnamed": sum(1 for p, _ in pairs if p is None)}


def reply_figures(replies: Sequence[str]) -> dict[str, Any]:
    """distinct-1/2 and mean length of a run's replies."""
    return {"replies": len(replies), "distinct_1": distinct_n(replies, 1), "distinct_2": distinct_n(replies, 2),
            "mean_length": mean_length(replies)}


def gold_figures(replies: Sequence[str], references: Sequence[str], predicted: Sequence[str | None] | None,
                 gold_strategies: Sequence[str | None]) -> dict[str, Any]:
    """BLEU-2, ROUGE-L and (when the model names strategies) strategy accuracy against gold replies."""
    out: dict[str, Any] = {"bleu_2": bleu2(replies, references), "rouge_l": rouge_l(replies, references)}
    if predicted is not None:
        out["strategy"] = strategy_figures(predicted, gold_strategies)
    return out
