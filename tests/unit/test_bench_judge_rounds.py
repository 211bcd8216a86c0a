"""bench.judge_rounds' arithmetic: decode positions per path and verdict agreement (the engine run is the bench's)."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.judge_rounds import _compared, agreement, floor_multiple, positions, verdict_rows, with_baseline
from cer.verdicts import Preference
from judge.conversation import CandidateJudgment


def test_positions_are_the_sum_of_rounds_when_sequential_and_the_longest_when_independent() -> None:
    texts = ["a b c", "a", "a b"]  # 3, 1, 2 words -> tokens, + 1 end token each

    def count(t: str) -> int:
        return len(t.split())

    assert positions(texts, independent=False, count=count) == 4 + 2 + 3
    assert positions(texts, independent=True, count=count) == 4
    assert positions([], independent=True, count=count) == 0


def test_agreement_counts_equal_parsed_verdicts_per_component() -> None:
    a = verdict_rows([CandidateJudgment(verdicts={"step1": True, "preference": Preference.FIRST}),
                      CandidateJudgment(verdicts={"step1": False, "preference": None})])
    b = verdict_rows([CandidateJudgment(verdicts={"step1": True, "preference": Preference.SECOND}),
                      CandidateJudgment(verdicts={"step1": False, "preference": None})])
    assert a[0] == {"step1": True, "preference": "first"}  # JSON values: what a --baseline file holds
    got = agreement(a, b)
    assert got["step1"] == {"candidates": 2, "same": 2, "share": 1.0}
    assert got["preference"] == {"candidates": 2, "same": 0, "share": 0.0}  # an unparsed verdict never agrees


def test_a_baseline_run_is_compared_path_by_path_and_must_be_on_the_same_rounds() -> None:
    rows = [{"step1": True, "preference": "first"}, {"step1": False, "preference": "second"}]
    fig = {"dialogues": ["d1", "d2"], "verdicts": {"sequential": rows, "prefix": [rows[0], {**rows[1], "step1": True}]}}
    baseline = json.loads(json.dumps({"dialogues": ["d1", "d2"], "rationale_bound": "counted",
                                      "verdicts": {"sequential": rows}}))
    got = with_baseline(fig, baseline, "counted.json")
    assert got["baseline"] == {"file": "counted.json", "rationale_bound": "counted"}
    assert got["agreement_with_baseline"]["sequential"]["step1"]["same"] == 2
    assert got["agreement_with_baseline"]["prefix"]["step1"]["same"] == 1
    with pytest.raises(ValueError, match="not a run of this benchmark on the same rounds"):
        with_baseline(fig, {**baseline, "dialogues": ["d1", "d3"]}, "other.json")


def test_positions_leave_out_the_tokens_an_answer_prefix_gave() -> None:
    texts = ["R: a b", "R: c"]  # 3 and 2 words, the first of each given by the prefix

    def count(t: str) -> int:
        return len(t.split())

    assert positions(texts, independent=False, count=count, given=1) == (2 + 1) + (1 + 1)
    assert positions(texts, independent=False, count=count) == (3 + 1) + (2 + 1)


def test_compare_takes_one_or_both_other_paths_each_once() -> None:
    assert _compared("prefix") == ("prefix",)
    assert _compared("independent, prefix") == ("independent", "prefix")
    assert _compared("prefix,discrete") == ("prefix", "discrete")
    for bad in ("", "sequential", "prefix,prefix", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="--compare"):
            _compared(bad)


def test_floor_multiple_is_the_step_over_its_positions_at_the_floor() -> None:
    assert floor_multiple(0.2, 50, 2.0) == pytest.approx(2.0)  # 50 positions x 2 ms = 0.1 s at the floor
