"""bench.judge_bases_cpu's pure parts: the ESConv contrast groups it judges, the verdict tally (parse failures, a judge
that gives every candidate one verdict), the 1.5B / 135M ratios and the table; bench.common's machine description."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.common import machine_description
from bench.judge_bases_cpu import (
    FIGURES,
    esconv_groups,
    favourable_shares,
    load_notes,
    parse_dtypes,
    ratios,
    same_verdict_components,
    table_rows,
    tally,
    workload,
)

ESCONV = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder" / "esconv.json"


def test_groups_are_real_contrast_groups_of_distinct_dialogues() -> None:
    groups = esconv_groups(ESCONV, 3, 4, seed=0)
    assert len({g["dialogue_id"] for g in groups}) == 3
    for g in groups:
        kinds = [k for k, _ in g["candidates"]]
        assert kinds[0] == "positive" and len(set(kinds)) == 4
        assert g["history"][-1]["role"] == "seeker"
        # the positive is the real supporter turn with its gold reasoning; the reference is that turn (as GRPO sends it)
        assert g["candidates"][0][1].endswith(f"<response>{g['reference']}</response>")
        assert all(text.startswith("<analysis>") for _, text in g["candidates"])
    assert esconv_groups(ESCONV, 3, 4, seed=0) == groups  # deterministic
    with pytest.raises(ValueError, match="only 3 dialogues"):
        esconv_groups(ESCONV, 4, 4, seed=0)


def test_workload_splits_first_answer_and_sets_without_sharing_a_dialogue() -> None:
    args = argparse.Namespace(data=ESCONV, groups=1, group_size=3, sets=2, seed=0)
    first, sets = workload(args)
    ids = [g["dialogue_id"] for g in first + [g for s in sets for g in s]]
    assert len(first) == 1 and [len(s) for s in sets] == [1, 1] and len(set(ids)) == 3


def test_tally_counts_verdicts_failures_and_flat_components() -> None:
    kinds = ["positive", "wrong_emotion", "positive"]
    verdicts = [{"step1": True, "preference": "both_good"}, {"step1": True, "preference": None},
                {"step1": True, "preference": "second"}]
    t = tally(kinds, verdicts)
    assert t["by_component"]["step1"] == {"positive": {"True": 2}, "wrong_emotion": {"True": 1}}
    assert t["by_component"]["preference"]["wrong_emotion"] == {"None": 1}
    assert t["parse_failure_share"] == pytest.approx(1 / 6) and t["components_judged"] == 6
    assert t["modal_share"] == {"step1": 1.0, "preference": pytest.approx(1 / 3)}
    assert same_verdict_components(t) == ["step1"]
    assert same_verdict_components(t, at_least=0.3) == ["preference", "step1"]
    assert tally([], [])["parse_failure_share"] == 0.0
    # favourable: True, second, both_good; unparsed verdicts left out of the share
    assert favourable_shares(t) == {"step1": {"positive": 1.0, "wrong_emotion": 1.0},
                                    "preference": {"positive": 1.0}}
    t2 = tally(["positive", "positive", "other_dialogue"], [{"preference": "first"}, {"preference": "second"},
                                                            {"preference": "neither"}])
    assert favourable_shares(t2) == {"preference": {"positive": 0.5, "other_dialogue": 0.0}}


def test_ratios_are_large_over_small_and_absent_where_undefined() -> None:
    small = {"start_s": 50.0, "judgments_per_s": 2.0, "parse_failure_share": 0.0, "peak_rss_mb": 4000}
    large = {"start_s": 150.0, "judgments_per_s": 0.5, "parse_failure_share": 0.1, "peak_rss_mb": 10000}
    r = ratios(small, large)
    assert r["start_s"] == 3.0 and r["judgments_per_s"] == 0.25 and r["peak_rss_mb"] == 2.5
    assert r["parse_failure_share"] is None and r["first_answer_s"] is None  # 0 below, and missing
    assert set(r) == set(FIGURES)
    rows = table_rows({"135m": small, "1.5b": large}, {"1.5b / 135m": r})
    assert ("engine start, s [1.5b / 135m]", 3.0, "ratio") in rows
    assert ("first answer (1 candidate, 4 rounds, cold), s [135m]", "n/a", "") in rows
    assert len(rows) == 3 * len(FIGURES)
    three = table_rows({"135m": small, "1.5b": large, "1.5b-judge": large},
                       {"1.5b / 135m": r, "1.5b-judge / 135m": r})
    assert ("GRPO step (32 judgments), s [1.5b-judge / 135m]", "n/a", "ratio") in three
    assert len(three) == 5 * len(FIGURES)


def test_dtypes_per_judge() -> None:
    assert parse_dtypes("1.5b=bfloat16") == {"135m": "float32", "1.5b": "bfloat16", "1.5b-judge": "float32"}
    with pytest.raises(ValueError, match="JUDGE=float32"):
        parse_dtypes("7b=bfloat16")
    with pytest.raises(ValueError):
        parse_dtypes("135m=int8")


def test_machine_description_names_the_cpu_features_that_pick_kernels() -> None:
    m = machine_description()
    assert {"cpu_model", "cpus", "cpu_flags", "mem_gib", "load_avg_1_5_15"} <= set(m)
    assert {"avx512_bf16", "amx_bf16"} <= set(m["cpu_flags"]) and len(m["load_avg_1_5_15"]) == 3


def test_a_busy_machine_is_noted_per_judge() -> None:
    results = {"135m": {"load_1min": {"start": 2.1, "throughput": 5.4}}, "1.5b": {"load_1min": {"start": 2.9}}}
    notes = load_notes(results, cpus=2)
    assert len(notes) == 1 and notes[0].startswith("135m: 1-minute load above 3 on 2 cores") and "5.4" in notes[0]
    assert load_notes(results, cpus=2, extra=4.0) == []
