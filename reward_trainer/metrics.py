"""The paper's Table 1 metrics on judge predictions (scikit-learn), plus parse failures.

Per reasoning step: weighted F1 over the classes True / False and the recall of the False class. Reply: weighted
F1 over the four preference classes and accuracy. A verdict the judge failed to give (unparsable after retries,
or a component it did not judge) is kept as the prediction ``invalid``: it is never dropped and never counts as
right, so it lowers recall and accuracy; weighted F1 averages only the gold classes (weights = their support).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cer.agreement import kappa  # the one definition (compeer_loop uses it too)
from cer.verdicts import PREFERENCE_LABELS, STEP_LABELS, Verdict
from judge.protocol import PREFERENCE, REPLY
from judge.protocol import STEP_COMPONENTS as STEPS

INVALID = "invalid"
FALSE_LABEL = "False"

#: The keys of one variant's figures in metrics.json.
METRIC_KEYS: tuple[str, ...] = ("step_weighted_f1", "step_false_recall", "response_weighted_f1", "response_accuracy",
                                "reply_weighted_f1", "reply_false_recall", "reply_accuracy", "parse_failure_rate",
                                "inconsistency_ratio")


def label_str(v: Verdict | None) -> str:
    """The label string of a verdict (``True``/``False``/preference value), ``invalid`` for None."""
    if v is None:
        return INVALID
    if isinstance(v, bool):
        return str(v)
    return v.value


def step_scores(gold: list[bool], pred: list[bool | None]) -> tuple[float, float]:
    """(weighted F1 over True/False, recall of False) for one step."""
    from sklearn.metrics import f1_score, recall_score

    y_true = [label_str(g) for g in gold]
    y_pred = [label_str(p) for p in pred]
    wf1 = f1_score(y_true, y_pred, labels=list(STEP_LABELS), average="weighted", zero_division=0)
    if FALSE_LABEL not in y_true:
        return float(wf1), float("nan")
    rec = recall_score(y_true, y_pred, labels=[FALSE_LABEL], average=None, zero_division=0)[0]
    return float(wf1), float(rec)


def response_scores(gold: list[Verdict], pred: list[Verdict | None]) -> tuple[float, float]:
    """(weighted F1 over the four preference classes, 4-class accuracy)."""
    from sklearn.metrics import accuracy_score, f1_score

    y_true = [label_str(g) for g in gold]
    y_pred = [label_str(p) for p in pred]
    wf1 = f1_score(y_true, y_pred, labels=list(PREFERENCE_LABELS), average="weighted", zero_division=0)
    return float(wf1), float(accuracy_score(y_true, y_pred))


def confusion(gold: list[Verdict], pred: list[Verdict | None], labels: tuple[str, ...]) -> list[list[int]]:
    """Confusion matrix, rows = gold ``labels``, columns = ``labels`` + ``invalid``."""
    from sklearn.metrics import confusion_matrix

    cols = [*labels, INVALID]
    m = confusion_matrix([label_str(g) for g in gold], [label_str(p) for p in pred], labels=cols)
    return [[int(x) for x in row] for row in m[: len(labels)]]


@dataclass
class VariantMetrics:
    """The Table 1 figures of one judge on one variant's held-out split (None where the variant has no such part)."""

    n_items: int
    step_weighted_f1: list[float | None] = field(default_factory=lambda: [None, None, None])
    step_false_recall: list[float | None] = field(default_factory=lambda: [None, None, None])
    response_weighted_f1: float | None = None
    response_accuracy: float | None = None
    #: mode ``reply`` (a plain reply judged True/False): weighted F1, False recall and accuracy
    reply_weighted_f1: float | None = None
    reply_false_recall: float | None = None
    reply_accuracy: float | None = None
    parse_failure_rate: float | None = None
    inconsistency_ratio: float | None = None
    confusion: dict[str, list[list[int]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: _clean(getattr(self, k)) for k in METRIC_KEYS}
        out["n_items"] = self.n_items
        out["confusion"] = self.confusion
        return out


def _clean(value: Any) -> Any:
    """NaN → None (JSON null), recursively for lists."""
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def score(gold: list[dict[str, Verdict]], pred: list[dict[str, Verdict | None]], components: tuple[str, ...],
          asked: int | None = None, failed: int | None = None) -> VariantMetrics:
    """Table 1 figures of predictions ``pred`` against ``gold`` on ``components`` (the variant's judged parts).

    ``asked`` / ``failed``: components the judge was asked for and could not answer (parse failures); when not
    given they are counted from ``pred`` (None = failed).
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold rows but {len(pred)} predictions")
    m = VariantMetrics(n_items=len(gold))
    for i, step in enumerate(STEPS):
        if step not in components:
            continue
        g = [row[step] for row in gold]
        p = [row.get(step) for row in pred]
        wf1, rec = step_scores([bool(x) for x in g], [x if isinstance(x, bool) else None for x in p])
        m.step_weighted_f1[i], m.step_false_recall[i] = wf1, rec
        m.confusion[step] = confusion(g, p, STEP_LABELS)
    if REPLY in components:
        g = [row[REPLY] for row in gold]
        p = [row.get(REPLY) for row in pred]
        m.reply_weighted_f1, m.reply_false_recall = step_scores([bool(x) for x in g],
                                                                [x if isinstance(x, bool) else None for x in p])
        m.reply_accuracy = sum(1 for a, b in zip(g, p) if a == b) / len(g) if g else None
        m.confusion[REPLY] = confusion(g, p, STEP_LABELS)
    if PREFERENCE in components:
        g = [row[PREFERENCE] for row in gold]
        p = [row.get(PREFERENCE) for row in pred]
        m.response_weighted_f1, m.response_accuracy = response_scores(g, p)
        m.confusion[PREFERENCE] = confusion(g, p, PREFERENCE_LABELS)
    if asked is None or failed is None:
        asked = len(pred) * len(components)
        failed = sum(1 for row in pred for c in components if row.get(c) is None)
    m.parse_failure_rate = (failed / asked) if asked else None
    return m


def majority_labels(gold: list[dict[str, Verdict]], components: tuple[str, ...]) -> dict[str, Verdict]:
    """The most frequent gold label per component (ties: the first label in the label order)."""
    out: dict[str, Verdict] = {}
    for c in components:
        values = [row[c] for row in gold]
        if not values:
            raise ValueError(f"no gold labels for {c!r} to take the majority of")
        order = list(PREFERENCE_LABELS if c == PREFERENCE else STEP_LABELS)
        counts = {lab: sum(1 for v in values if label_str(v) == lab) for lab in order}
        best = max(order, key=lambda lab: (counts[lab], -order.index(lab)))
        out[c] = next(v for v in values if label_str(v) == best)
    return out


__all__ = ["INVALID", "METRIC_KEYS", "PREFERENCE", "REPLY", "STEPS", "VariantMetrics", "confusion", "kappa",
           "label_str", "majority_labels", "response_scores", "score", "step_scores"]
