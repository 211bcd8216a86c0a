"""Verdict temperature: calibrated verdict probabilities for graded rewards (temperature scaling, Guo et al. 2017).

A trained judge is near-certain of every verdict (its label probabilities sit within 1e-5 of 0 or 1), so the graded
reward (:mod:`cer.rewards`) equals the discrete one up to tie-breaks of a few millionths, which GRPO's group
normalisation cannot use. Temperature scaling divides the label log-probabilities by ``T`` and renormalises
(:func:`temper`): the verdict each distribution ranks first stays first, so discrete verdicts never change, but the
probabilities spread out to what the judge's accuracy on held-apart items supports. One ``T`` per verdict kind
(:class:`VerdictTemperature`: the True/False steps and reply verdict, and the preference) is fitted by minimising the
negative log-likelihood of the gold labels (:func:`fit_temperature`; ``reward_trainer calibrate`` writes it).

Where ``T`` comes from (:func:`resolve_temperature`): ``JudgeSettings.verdict_temperature`` when set (1: the raw
probabilities), else the ``verdict_temperature`` entry of the served adapter's ``compeer_judge.json``, else 1 (an
adapter that was never calibrated, or no adapter). The result says which (``source``), and the server's ``Info``
reports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cer.verdicts import Kind

#: The adapter metadata file (written by ``reward_trainer.sft``) and its calibration entry.
ADAPTER_META = "compeer_judge.json"
CALIBRATION_KEY = "verdict_temperature"
#: The range :func:`fit_temperature` searches.
T_MIN, T_MAX = 0.05, 200.0
#: Probabilities below this count as this in the fit's log-likelihood only (a label outside the engine's top-k has
#: probability 0, which no temperature can move).
P_FLOOR = 1e-12


@dataclass(frozen=True)
class VerdictTemperature:
    """The temperature of each verdict kind's label distribution, and where it came from (``setting``, ``adapter``
    or ``none``)."""

    step: float = 1.0
    preference: float = 1.0
    source: str = "none"

    def __post_init__(self) -> None:
        for name, t in (("step", self.step), ("preference", self.preference)):
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"verdict temperature {name} {t}: expected a positive number")

    def of(self, kind: Kind) -> float:
        """The temperature of ``kind``'s distributions."""
        return self.step if kind is Kind.STEP else self.preference

    @property
    def identity(self) -> bool:
        """Both temperatures are 1: the probabilities are the engine's."""
        return self.step == 1.0 and self.preference == 1.0

    def to_json(self) -> dict[str, float | str]:
        return {"step": self.step, "preference": self.preference, "source": self.source}


def temper(dist: Mapping[str, float], t: float) -> dict[str, float]:
    """``dist`` with its log-probabilities divided by ``t`` and renormalised; a label of probability 0 stays 0, and
    the order of the labels never changes. ``t`` 1 returns the probabilities as they are (no float round trip on the
    judge's hot path)."""
    if t == 1.0:
        return dict(dist)
    logs = {k: (math.log(p) / t if p > 0 else -math.inf) for k, p in dist.items()}
    top = max(logs.values())
    if top == -math.inf:
        return dict(dist)
    w = {k: math.exp(v - top) for k, v in logs.items()}
    s = sum(w.values())
    return {k: v / s for k, v in w.items()}


def read_temperature(adapter_dir: str | Path | None) -> VerdictTemperature | None:
    """The calibration an adapter folder's ``compeer_judge.json`` records, or None when it records none. A malformed
    entry is an error naming the file, never ignored."""
    if adapter_dir is None:
        return None
    meta = Path(adapter_dir) / ADAPTER_META
    if not meta.is_file():
        return None
    entry = json.loads(meta.read_text(encoding="utf-8")).get(CALIBRATION_KEY)
    if entry is None:
        return None
    try:
        return VerdictTemperature(float(entry["step"]), float(entry["preference"]), "adapter")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{meta}: {CALIBRATION_KEY} must hold positive 'step' and 'preference' numbers "
                         f"({exc})") from None


def resolve_temperature(setting: float | None, adapter_dir: str | Path | None) -> VerdictTemperature:
    """The temperature a judge applies: ``setting`` (``JudgeSettings.verdict_temperature``) for both kinds when
    given, else the adapter's calibration (:func:`read_temperature`), else 1."""
    if setting is not None:
        return VerdictTemperature(setting, setting, "setting")
    return read_temperature(adapter_dir) or VerdictTemperature()


def _nll(samples: Sequence[tuple[Mapping[str, float], str]], t: float) -> float:
    return -sum(math.log(max(temper(d, t)[gold], P_FLOOR)) for d, gold in samples) / len(samples)


def fit_temperature(samples: Sequence[tuple[Mapping[str, float], str]]) -> float:
    """The ``T`` in [:data:`T_MIN`, :data:`T_MAX`] minimising the mean negative log-likelihood of the gold labels
    (``samples``: (label distribution, gold label)); a bounded scalar search over log T."""
    if not samples:
        raise ValueError("no samples to fit a verdict temperature on")
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(lambda lt: _nll(samples, math.exp(lt)), bounds=(math.log(T_MIN), math.log(T_MAX)),
                          method="bounded", options={"xatol": 1e-4})
    return float(math.exp(res.x))


def calibration_metrics(samples: Sequence[tuple[Mapping[str, float], str]], t: float = 1.0,
                        bins: int = 10) -> dict[str, float | int]:
    """NLL, Brier score, expected calibration error (``bins`` equal-width bins of the top label's probability),
    accuracy and mean top-label confidence of ``samples`` under temperature ``t``."""
    if not samples:
        return {"n": 0}
    nll = brier = 0.0
    correct = conf_sum = 0.0
    by_bin: list[list[tuple[float, bool]]] = [[] for _ in range(bins)]
    for d, gold in samples:
        p = temper(d, t)
        nll -= math.log(max(p[gold], P_FLOOR))
        brier += sum((q - (1.0 if k == gold else 0.0)) ** 2 for k, q in p.items())
        top = max(p, key=lambda k: p[k])
        ok = top == gold
        correct += ok
        conf_sum += p[top]
        by_bin[min(bins - 1, int(p[top] * bins))].append((p[top], ok))
    n = len(samples)
    ece = sum(abs(sum(c for c, _ in b) - sum(ok for _, ok in b)) for b in by_bin) / n
    return {"n": n, "nll": nll / n, "brier": brier / n, "ece": ece, "accuracy": correct / n,
            "confidence": conf_sum / n}


__all__ = ["ADAPTER_META", "CALIBRATION_KEY", "VerdictTemperature", "calibration_metrics", "fit_temperature",
           "read_temperature", "resolve_temperature", "temper"]
