"""Agreement between two labelings: Cohen's kappa, the one definition every package uses (the judge's verdicts
against gold labels in :mod:`reward_trainer.metrics`, a policy's named strategy against the annotated one in
:mod:`compeer_loop.stats`)."""

from __future__ import annotations

from collections.abc import Sequence


def kappa(matrix: list[list[int]]) -> float | None:
    """Cohen's kappa of a confusion matrix (rows gold, columns predicted; a column past the rows, such as
    ``invalid``, counts as a class of its own): agreement beyond what the two label distributions give by chance; 0
    for a constant predictor such as the majority baseline, None for an empty matrix or one where chance agreement
    is already 1."""
    n = sum(sum(row) for row in matrix)
    if n == 0:
        return None
    k = len(matrix)
    observed = sum(matrix[i][i] for i in range(k)) / n
    chance = sum((sum(matrix[i]) / n) * (sum(row[i] for row in matrix) / n) for i in range(k))
    return None if chance >= 1.0 else (observed - chance) / (1.0 - chance)


def label_matrix(gold: Sequence[str], predicted: Sequence[str | None], missing: str = "(none)") -> list[list[int]]:
    """The confusion matrix :func:`kappa` reads, from aligned label lists: rows the gold labels (sorted), columns
    the same labels then any other predicted label (a prediction of None is ``missing``, a class of its own)."""
    if len(gold) != len(predicted):
        raise ValueError("label_matrix: label lists differ in length")
    pred = [missing if p is None else p for p in predicted]
    rows = sorted(set(gold))
    cols = rows + sorted(set(pred) - set(rows))
    at = {c: j for j, c in enumerate(cols)}
    matrix = [[0] * len(cols) for _ in rows]
    row_of = {g: i for i, g in enumerate(rows)}
    for g, p in zip(gold, pred):
        matrix[row_of[g]][at[p]] += 1
    return matrix
