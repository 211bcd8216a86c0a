"""Eq.1 Gaussian round sampling: the formula, the distribution, uniqueness, dialogue order, seeding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from data_builder.sample import dialogue_rng, gaussian_weights, make_round, rounds_of, sample_dialogues, sample_rounds


def test_weights_follow_eq1_by_hand() -> None:
    nr = 8
    mu, sigma = nr / 2, nr / 4
    raw = [math.exp(-((i - mu) ** 2) / (2 * sigma**2)) for i in range(1, nr + 1)]
    expected = [r / sum(raw) for r in raw]
    assert gaussian_weights(nr) == pytest.approx(expected, rel=1e-12)
    assert int(np.argmax(gaussian_weights(nr))) + 1 == 4  # the peak is at i = mu


def test_single_draw_distribution_matches_eq1() -> None:
    nr, n = 10, 20_000
    rng = np.random.default_rng(123)
    counts = np.bincount([sample_rounds(nr, 1, rng)[0] - 1 for _ in range(n)], minlength=nr)
    expected = gaussian_weights(nr) * n
    assert chisquare(counts, expected).pvalue > 0.001


def test_multi_draw_inclusion_matches_sequential_law() -> None:
    # Ns = 2 without replacement: P(i in sample) = p_i + sum_{j != i} p_j p_i / (1 - p_j).
    nr, n = 6, 20_000
    p = gaussian_weights(nr)
    incl = np.array([p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(nr) if j != i) for i in range(nr)])
    rng = np.random.default_rng(7)
    hits = np.zeros(nr)
    for _ in range(n):
        for i in sample_rounds(nr, 2, rng):
            hits[i - 1] += 1
    assert hits / n == pytest.approx(incl, abs=0.015)


@settings(max_examples=200, deadline=None)
@given(nr=st.integers(1, 60), ns=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_unique_sorted_in_range(nr: int, ns: int, seed: int) -> None:
    picked = sample_rounds(nr, ns, np.random.default_rng(seed))
    assert len(picked) == min(nr, ns)
    assert picked == sorted(set(picked))
    assert all(1 <= i <= nr for i in picked)


def test_seeded_and_order_independent() -> None:
    a = sample_rounds(30, 4, dialogue_rng(5, "d1"))
    assert a == sample_rounds(30, 4, dialogue_rng(5, "d1"))
    draws = {tuple(sample_rounds(30, 4, dialogue_rng(s, "d1"))) for s in range(20)}
    assert len(draws) > 1  # the seed matters

    def dlg(i: int) -> dict:
        turns = []
        for k in range(8):
            turns += [{"role": "seeker", "text": f"s{i}-{k}"}, {"role": "supporter", "text": f"r{i}-{k}", "strategy": None}]
        return {"id": f"d{i}", "turns": turns, "meta": {}}

    ds = [dlg(i) for i in range(6)]
    fwd, _ = sample_dialogues(ds, 3, seed=1)
    rev, _ = sample_dialogues(list(reversed(ds)), 3, seed=1)
    key = lambda rs: sorted((r["dialogue_id"], r["round_index"]) for r in rs)
    assert key(fwd) == key(rev)
    per = [r["round_index"] for r in fwd if r["dialogue_id"] == "d0"]
    assert per == sorted(per) and len(per) == 3


def test_rounds_and_history_end_with_seeker() -> None:
    turns = [{"role": "supporter", "text": "hi"}, {"role": "seeker", "text": "a"}, {"role": "supporter", "text": "b"},
             {"role": "supporter", "text": "c"}, {"role": "seeker", "text": "d"}, {"role": "seeker", "text": "e"},
             {"role": "supporter", "text": "f", "strategy": "Question"}]
    starts = rounds_of(turns)
    assert starts == [2, 6]
    r = make_round({"id": "x", "turns": turns, "meta": {"emotion_type": "fear"}}, starts, 2)
    assert r["history"][-1] == {"role": "seeker", "text": "e"}
    assert r["reference"] == "f" and r["strategy"] == "Question" and r["num_rounds"] == 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        gaussian_weights(0)
    with pytest.raises(ValueError):
        sample_rounds(5, 0, np.random.default_rng(0))
