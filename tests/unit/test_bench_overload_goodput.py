"""The pure parts of bench.overload_goodput: real ESConv groups (histories cut before a supporter turn, CER
candidates) and the per-candidate tally of an answer."""

from __future__ import annotations

import pytest

from bench.overload_goodput import DATA, esconv_groups, tally
from cer.reasoning import parse


@pytest.mark.skipif(not DATA.exists(), reason="the shared ESConv data is not on this machine")
def test_esconv_groups_are_real_length_cer_groups() -> None:
    groups = esconv_groups(DATA, 20, 4, 3, 30, seed=1)
    assert len(groups) == 20 and groups == esconv_groups(DATA, 20, 4, 3, 30, seed=1)
    for g in groups:
        assert 3 <= len(g["history"]) <= 30 and g["reference"]
        assert len(g["candidates"]) == len(set(g["candidates"])) == 4
        assert all(not parse(c).missing for c in g["candidates"])
    assert sum(len(t["text"]) for g in groups for t in g["history"]) / 20 > 500  # not the short example history


def test_tally_counts_candidates_by_outcome() -> None:
    answer = {"results": [{"status": "ok"}, {"status": "timeout"}, {"status": "parse_failed"}]}
    assert tally(200, answer, 3, 1.0, 30.0) == {"scored": 1, "timeout": 1, "other": 1}
    assert tally(200, answer, 3, 31.0, 30.0) == {"scored": 0, "timeout": 2, "other": 1}  # late is not scored
    assert tally(429, None, 4, 0.1, 30.0) == {"shed": 4}
    assert tally(504, None, 4, 30.0, 30.0) == {"timeout": 4}
