"""Redundancy-aware reward reweighting (paper Eq.5-7) and the similarities it uses.

    s_in_i = 1/(G-1) * sum_{j != i} cos(o_i, o_j)        (0 when G = 1)
    s_hi_i = 1/|H|   * sum_{u in H} cos(o_i, u)          (0 when the history is empty)
    tau    = 1 / (1 + exp(-alpha * (L - beta))),  L = mean length of the group's outputs
    paper:      r'_i = r_i / ((1 + tau s_in_i)(1 + tau s_hi_i))
    sign_aware: r'_i = r_i * ((1 + tau s_in_i)(1 + tau s_hi_i))   when r_i < 0, else as paper

As written, the paper's formula shrinks a *negative* reward towards 0 when the output is redundant, i.e. it
rewards redundancy among bad outputs; ``sign_aware`` makes redundancy always cost reward.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class RedundancyMode(str, enum.Enum):
    """How the redundancy penalty treats negative rewards."""

    OFF = "off"
    PAPER = "paper"
    SIGN_AWARE = "sign_aware"


@dataclass(frozen=True)
class Reweighted:
    """Result of :func:`reweight`: the new rewards, tau and the per-item divisor (1+tau s_in)(1+tau s_hi)."""

    rewards: list[float | None]
    tau: float
    factors: list[float]


def tau(mean_length: float, alpha: float, beta: float) -> float:
    """Eq.7: the length gate, a logistic in the group's mean output length."""
    z = -alpha * (mean_length - beta)
    if z > 700:  # exp overflow: the gate is closed
        return 0.0
    return 1.0 / (1.0 + math.exp(z))


def reweight(
    rewards: Sequence[float | None],
    s_in: Sequence[float],
    s_hi: Sequence[float],
    lengths: Sequence[float],
    *,
    alpha: float = 0.5,
    beta: float = 5.0,
    mode: RedundancyMode | str = RedundancyMode.PAPER,
) -> Reweighted:
    """Apply Eq.5-7 to one rollout group. ``None`` rewards (unscored items) stay None.

    ``lengths`` are the lengths of all G outputs in the chosen unit (tokens by default in the trainer);
    L is their mean, scored or not.
    """
    mode = RedundancyMode(mode)
    n = len(rewards)
    if not (len(s_in) == len(s_hi) == len(lengths) == n):
        raise ValueError(f"reweight: rewards, s_in, s_hi and lengths must have one entry per output (got {n}, "
                         f"{len(s_in)}, {len(s_hi)}, {len(lengths)})")
    if n == 0:
        return Reweighted([], 0.0, [])
    t = tau(float(np.mean(lengths)), alpha, beta)
    factors = [(1.0 + t * a) * (1.0 + t * b) for a, b in zip(s_in, s_hi)]
    if mode is RedundancyMode.OFF:
        return Reweighted(list(rewards), t, [1.0] * n)
    out: list[float | None] = []
    for r, f in zip(rewards, factors):
        if r is None:
            out.append(None)
        elif mode is RedundancyMode.SIGN_AWARE and r < 0:
            out.append(r * f)
        else:
            out.append(r / f)
    return Reweighted(out, t, factors)


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def similarities(outputs: np.ndarray, history: np.ndarray) -> tuple[list[float], list[float]]:
    """s_in and s_hi (Eq.5-6) for a group, from embeddings: ``outputs`` (G, d), ``history`` (|H|, d)."""
    g = outputs.shape[0]
    o = _unit(outputs.astype(np.float64))
    if g > 1:
        sim = o @ o.T
        s_in = ((sim.sum(axis=1) - np.diag(sim)) / (g - 1)).tolist()
    else:
        s_in = [0.0] * g
    if history.shape[0] > 0:
        s_hi = (o @ _unit(history.astype(np.float64)).T).mean(axis=1).tolist()
    else:
        s_hi = [0.0] * g
    return [float(v) for v in s_in], [float(v) for v in s_hi]
