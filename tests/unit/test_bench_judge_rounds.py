"""bench.judge_rounds' arithmetic: decode positions per path and verdict agreement (the engine run is the bench's)."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.judge_rounds import (
    _compared,
    agreement,
    baseline_mismatch,
    floor_multiple,
    main,
    positions,
    prob_gap,
    verdict_rows,
    with_baseline,
)
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


def test_a_baseline_of_other_rounds_is_refused_before_the_engine_starts(tmp_path, capsys) -> None:
    """A --baseline whose sets, groups, group size or seed differ fails at once (the engine's start and the whole run
    were once spent before the mismatch was found); one without per-candidate verdicts too."""
    work = {"groups": 8, "group_size": 4, "sets": 5, "seed": 0, "data": "/tmp/cp-stage/esconv-valid.json"}
    base = tmp_path / "counted.json"
    base.write_text(json.dumps({"workload": work, "verdicts": {"sequential": []}}))
    args = argparse.Namespace(groups=8, group_size=4, sets=5, seed=0, data="valid.json")
    assert baseline_mismatch(json.loads(base.read_text()), args) is None  # the file's name is not the rounds
    assert baseline_mismatch(json.loads(base.read_text()), argparse.Namespace(**{**vars(args), "sets": 3})) == \
        "sets: 5 in the baseline, 3 here"
    assert "no per-candidate verdicts" in str(baseline_mismatch({"workload": work}, args))
    with pytest.raises(SystemExit) as stop:
        main(["--sets", "3", "--baseline", str(base), "--data", str(tmp_path / "none.json")])
    assert stop.value.code == 2
    assert "not comparable with this run (sets: 5 in the baseline, 3 here" in capsys.readouterr().err


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
    assert _compared("discrete,top5") == ("discrete", "top5")
    for bad in ("", "sequential", "prefix,prefix", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="--compare"):
            _compared(bad)


def test_floor_multiple_is_the_step_over_its_positions_at_the_floor() -> None:
    assert floor_multiple(0.2, 50, 2.0) == pytest.approx(2.0)  # 50 positions x 2 ms = 0.1 s at the floor


def test_probability_gap_is_the_total_variation_per_component_and_counts_one_sided_rows() -> None:
    a = [{"step1": {"True": 0.9, "False": 0.1}, "preference": {"first": 0.5, "second": 0.5}},
         {"step1": {"True": 1.0, "False": 0.0}, "preference": None}]
    b = [{"step1": {"True": 0.8, "False": 0.2}, "preference": {"first": 0.5, "second": 0.3, "neither": 0.2}},
         {"step1": {"True": 1.0, "False": 0.0}, "preference": {"first": 1.0}}]
    gap = prob_gap(a, b)
    assert gap["step1"]["candidates"] == 2 and gap["step1"]["one_side_only"] == 0
    assert gap["step1"]["tv_max"] == pytest.approx(0.1) and gap["step1"]["tv_mean"] == pytest.approx(0.05)
    assert gap["preference"]["candidates"] == 1 and gap["preference"]["one_side_only"] == 1
    assert gap["preference"]["tv_max"] == pytest.approx(0.2)  # a label on one side only counts from 0


def test_the_launch_floor_is_refused_on_the_transformers_engine_before_it_starts(tmp_path, capsys) -> None:
    """The launch floor is vLLM's (``launch_bound`` drives its AsyncLLM): ``--backend transformers --launch-bound``
    is a usage error before any engine loads; without the flag the transformers run leaves it off."""
    with pytest.raises(SystemExit) as e:
        main(["--backend", "transformers", "--launch-bound", "--device", "cuda", "--data", str(tmp_path / "none.json")])
    assert e.value.code == 2
    assert "--launch-bound measures vLLM's launch floor" in capsys.readouterr().err
