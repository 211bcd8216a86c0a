"""cer.redundancy (paper Eq.5-7) against values worked out by hand.

Worked example used below (G = 4, alpha = 0.5, beta = 5, every output 5 long, so L = 5):
    tau = 1 / (1 + exp(-0.5 * (5 - 5))) = 1 / (1 + 1) = 0.5
    rewards r = [2, -1, 0, None], s_in = [0.2, 0.4, 0.0, 0.6], s_hi = [0.1, 0.0, 0.5, 0.3]
    divisors (1 + tau s_in)(1 + tau s_hi) = [1.1 * 1.05, 1.2 * 1.0, 1.0 * 1.25, 1.3 * 1.15]
                                          = [1.155, 1.2, 1.25, 1.495]
    paper:      r' = r / d            = [1.7316017, -0.8333333, 0.0, None]
    sign_aware: r' = r * d if r < 0   = [1.7316017, -1.2,       0.0, None]
"""

from __future__ import annotations

import numpy as np
import pytest

from cer.redundancy import RedundancyMode, reweight, similarities, tau

R = [2.0, -1.0, 0.0, None]
S_IN = [0.2, 0.4, 0.0, 0.6]
S_HI = [0.1, 0.0, 0.5, 0.3]
LENGTHS = [5.0, 5.0, 5.0, 5.0]


def test_tau_hand_values() -> None:
    assert tau(5.0, 0.5, 5.0) == pytest.approx(0.5)
    # L = 7: 1 / (1 + e^-1)
    assert tau(7.0, 0.5, 5.0) == pytest.approx(0.7310585786)
    # L = 0: 1 / (1 + e^2.5)
    assert tau(0.0, 0.5, 5.0) == pytest.approx(0.0758581800)


def test_paper_mode_g4() -> None:
    out = reweight(R, S_IN, S_HI, LENGTHS, alpha=0.5, beta=5.0, mode="paper")
    assert out.tau == pytest.approx(0.5)
    assert out.factors == pytest.approx([1.155, 1.2, 1.25, 1.495])
    assert out.rewards[:3] == pytest.approx([1.7316017316, -0.8333333333, 0.0])
    assert out.rewards[3] is None


def test_paper_mode_makes_negative_reward_less_negative() -> None:
    """The documented quirk of the formula as written: redundancy shrinks a penalty."""
    out = reweight([-1.0], [0.0], [0.8], [5.0], mode=RedundancyMode.PAPER)
    assert out.rewards[0] is not None and -1.0 < out.rewards[0] < 0.0


def test_sign_aware_mode_g4() -> None:
    out = reweight(R, S_IN, S_HI, LENGTHS, alpha=0.5, beta=5.0, mode=RedundancyMode.SIGN_AWARE)
    assert out.rewards[:3] == pytest.approx([1.7316017316, -1.2, 0.0])
    assert out.rewards[3] is None


def test_off_mode_keeps_rewards() -> None:
    out = reweight(R, S_IN, S_HI, LENGTHS, mode="off")
    assert out.rewards == R
    assert out.factors == [1.0, 1.0, 1.0, 1.0]
    assert out.tau == pytest.approx(0.5)  # still reported


def test_g1_has_no_in_group_redundancy() -> None:
    # G = 1: s_in = 0 by definition; L = 7 so tau = 0.7310586; divisor = 1 + 0.7310586 * 0.4 = 1.2924234
    s_in, s_hi = similarities(np.array([[1.0, 0.0]]), np.array([[1.0, 0.0]]))
    assert s_in == [0.0]
    assert s_hi == pytest.approx([1.0])
    out = reweight([3.0], [0.0], [0.4], [7.0], alpha=0.5, beta=5.0, mode="paper")
    assert out.factors == pytest.approx([1.2924234315])
    assert out.rewards == pytest.approx([2.3212206828])
    neg = reweight([-3.0], [0.0], [0.4], [7.0], alpha=0.5, beta=5.0, mode="sign_aware")
    assert neg.rewards == pytest.approx([-3.8772702944])


def test_similarities_hand_values() -> None:
    # outputs e1, e2, e1+e2: cos(e1,e2) = 0, cos(e1, e1+e2) = cos(e2, e1+e2) = 1/sqrt(2) = 0.70710678
    outputs = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    history = np.array([[2.0, 0.0]])  # not unit length on purpose
    s_in, s_hi = similarities(outputs, history)
    assert s_in == pytest.approx([0.3535533906, 0.3535533906, 0.7071067812])
    assert s_hi == pytest.approx([1.0, 0.0, 0.7071067812])


def test_empty_history_gives_zero_s_hi_and_only_in_group_penalty() -> None:
    outputs = np.array([[1.0, 0.0], [1.0, 0.0]])
    s_in, s_hi = similarities(outputs, np.zeros((0, 2)))
    assert s_hi == [0.0, 0.0]
    assert s_in == pytest.approx([1.0, 1.0])
    # tau = 0.5 (L = 5): divisor = (1 + 0.5)(1 + 0) = 1.5
    out = reweight([1.5, -1.5], s_in, s_hi, [5.0, 5.0], mode="paper")
    assert out.rewards == pytest.approx([1.0, -1.0])


def test_short_outputs_tau_near_zero_leave_rewards_unchanged() -> None:
    # L = 0 with alpha = 0.5, beta = 5: tau = 0.0758582 -> divisor (1 + 0.0758582)(1 + 0.0758582 * 0.5) = 1.1166645
    out = reweight([1.0], [1.0], [0.5], [0.0], alpha=0.5, beta=5.0, mode="paper")
    assert out.tau == pytest.approx(0.0758581800)
    assert out.factors == pytest.approx([1.1166645018])
    # a steep gate (alpha 10, beta 50, L 1): tau = 1 / (1 + e^490), effectively 0
    steep = reweight([2.0, -2.0], [0.9, 0.9], [0.9, 0.9], [1.0, 1.0], alpha=10.0, beta=50.0, mode="sign_aware")
    assert steep.tau == pytest.approx(0.0, abs=1e-200)
    assert steep.rewards == pytest.approx([2.0, -2.0])
    # exp overflow branch: z = 10 * 100 = 1000 > 700, the gate is exactly closed
    assert tau(0.0, 10.0, 100.0) == 0.0


def test_empty_group_and_length_mismatch() -> None:
    empty = reweight([], [], [], [])
    assert empty.rewards == [] and empty.factors == [] and empty.tau == 0.0
    with pytest.raises(ValueError, match="one entry per output"):
        reweight([1.0, 2.0], [0.0], [0.0, 0.0], [1.0, 1.0])


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError):
        reweight([1.0], [0.0], [0.0], [1.0], mode="halve")
