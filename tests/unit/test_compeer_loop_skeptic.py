"""Issue 26 item 4, the evaluation a skeptic accepts: kappa (one definition, cer.agreement), the majority-strategy
baseline, degenerate and repeated replies, the judge total among format-valid replies, distinct-n on the first
tokens, the constant-reply control, paired comparisons with seeds pooled, the independent scorer's plan check (its
comparisons: test_compeer_loop_independent.py) and the report's "judge not verified"."""

from __future__ import annotations

import pytest

from cer.agreement import kappa, label_matrix
from compeer_loop.plan import NO_SCORER, LoopSettings
from compeer_loop.replies import CONSTANT_REPLY, first_tokens, is_degenerate, mark_reply, top_reply_share
from compeer_loop.report_checks import NOT_VERIFIED, constant_row, independent_section, skeptic_table
from compeer_loop.stats import (
    FIGURES,
    add_item_figures,
    majority_baseline,
    paired_difference,
    per_prompt,
    seed_spread,
    strategy_kappa,
    summarise,
    summarise_answers,
)

HISTORY = [{"role": "seeker", "text": "I lost my job last week and I cannot sleep."}]


def _rec(i: int, strategy: str | None, gold: str, text: str = "That sounds hard. What happened at work?",
         total: float | None = 1.0, fmt: bool = True) -> dict:
    return {"id": f"p{i}", "status": "ok", "strategy": strategy, "gold_strategy": gold, "text": text,
            "reference": "I am sorry about your job.", "history": HISTORY, "format_ok": fmt,
            "judge_status": "ok" if total is not None else None, "reward_total": total, "rouge_l": 10.0,
            "length": 5.0}


def test_kappa_is_zero_for_the_majority_predictor_and_one_for_perfect_agreement() -> None:
    gold = ["Question", "Question", "Question", "Reflection"]
    assert kappa(label_matrix(gold, ["Question"] * 4)) == pytest.approx(0.0)
    assert kappa(label_matrix(gold, gold)) == pytest.approx(1.0)
    # a prediction of None is a class of its own, never right
    m = label_matrix(gold, [None, "Question", "Question", "Reflection"])
    assert m == [[2, 0, 1], [0, 1, 0]]
    assert 0.0 < kappa(m) < 1.0  # type: ignore[operator]
    with pytest.raises(ValueError):
        label_matrix(gold, ["Question"])


def test_majority_baseline_and_kappa_on_the_same_prompts() -> None:
    rs = [_rec(0, "Question", "Question"), _rec(1, "Question", "Question"), _rec(2, "Question", "Reflection"),
          _rec(3, "Question", "Affirmation")]
    assert majority_baseline(rs) == pytest.approx(50.0)
    assert FIGURES["strategy_accuracy"](rs) == pytest.approx(50.0)  # accuracy equals the baseline ...
    assert strategy_kappa(rs) == pytest.approx(0.0)  # ... and kappa says it is chance
    assert strategy_kappa([_rec(0, "Question", "Question"), _rec(1, "Reflection", "Reflection")]) == pytest.approx(1.0)


def test_degenerate_rule_marks_the_judge_wording_and_generic_templates_not_a_real_reply() -> None:
    assert is_degenerate(mark_reply("I would place this in the comforting stage.", HISTORY))
    assert is_degenerate(mark_reply("", HISTORY))
    assert not is_degenerate(mark_reply("Losing your job is hard. How have you been coping with the sleepless "
                                        "nights since it happened?", HISTORY))
    share, reply = top_reply_share(["a", "b ", "b", "c"])
    assert share == pytest.approx(50.0) and reply == "b"
    assert top_reply_share([]) == (None, None)


def test_judge_total_among_format_valid_replies_and_distinct_on_first_tokens() -> None:
    rs = [_rec(0, "Question", "Question", total=3.0), _rec(1, "Question", "Question", total=-5.0, fmt=False)]
    assert FIGURES["reward_total"](rs) == pytest.approx(-1.0)
    assert FIGURES["reward_total_format_ok"](rs) == pytest.approx(3.0)
    assert first_tokens("One, two three four", 3) == "one , two"
    long_a = "hello there " + " ".join(f"w{i}" for i in range(40))
    long_b = "hello there " + " ".join(f"v{i}" for i in range(40))
    rs2 = [{**_rec(0, None, "Question"), "text": long_a, "first_text": first_tokens(long_a, 2)},
           {**_rec(1, None, "Question"), "text": long_b, "first_text": first_tokens(long_b, 2)}]
    # the full replies look diverse; their first two tokens are the same
    assert FIGURES["distinct_2"](rs2) > 90 and FIGURES["distinct_2_first"](rs2) == pytest.approx(50.0)


def test_constant_reply_control_row() -> None:
    row = constant_row([_rec(0, None, "Q"), _rec(1, None, "Q"), {"id": "x", "status": "failed"}])
    assert row["prompts"] == 2 and row["rouge_l"] is not None and row["rouge_l"] > 0
    assert "understand" in CONSTANT_REPLY


def test_paired_difference_separates_a_real_gap_and_not_noise() -> None:
    a = {(0, f"p{i}"): 1.0 + 0.1 * (i % 3) for i in range(40)}
    b = {k: v - 1.0 for k, v in a.items()}
    d = paired_difference(a, b, n_boot=500, n_perm=500)
    assert d["n"] == 40 and d["diff"] == pytest.approx(1.0) and d["lo"] > 0 and d["p"] < 0.01
    same = paired_difference(a, dict(a), n_boot=200, n_perm=200)
    assert same["diff"] == pytest.approx(0.0) and same["p"] == pytest.approx(1.0)
    # only prompts both arms answered are paired; fewer than 2: nothing made up
    assert paired_difference({(0, "p0"): 1.0}, {(0, "p0"): 0.0})["diff"] is None


def test_seeds_are_pooled_as_pairs_and_their_spread_reported() -> None:
    rs = [_rec(0, "Question", "Question"), _rec(1, "Reflection", "Question")]
    pooled = {**per_prompt(rs, "strategy_correct", 0), **per_prompt(rs[:1], "strategy_correct", 1)}
    assert pooled == {(0, "p0"): 100.0, (0, "p1"): 0.0, (1, "p0"): 100.0}
    sp = seed_spread(pooled)
    assert sp["seed_means"] == {0: 50.0, 1: 100.0} and sp["std"] == pytest.approx(35.3553, abs=1e-3)
    assert seed_spread(per_prompt(rs, "strategy_correct", 0))["std"] is None


def test_plan_refuses_a_training_judge_as_independent_scorer() -> None:
    with pytest.raises(ValueError, match="training judge"):
        LoopSettings(independent_scorer_adapter="default")
    with pytest.raises(ValueError, match="training judge"):
        LoopSettings(prm_adapter="/j/prm", orm_adapter="/j/orm", independent_scorer_adapter="/j/orm")
    assert LoopSettings().independent_scorer_adapter == "none"
    old = LoopSettings().to_json()
    del old["independent_scorer"]
    assert LoopSettings.from_json(old).independent_scorer == NO_SCORER  # an old plan did not run it


def test_report_table_says_judge_not_verified_and_not_run() -> None:
    rs = [_rec(0, "Question", "Question"), _rec(1, "Question", "Reflection")]
    figs = {"c": summarise(rs, n_boot=20)}
    text = skeptic_table(figs, {"c": rs}, {"c": "(c) arm"}, {"c": False}, 16)
    assert f"(c) arm ({NOT_VERIFIED})" in text and "not run" in text
    assert "not run" in independent_section(figs, "judge-base").lower()
    assert NOT_VERIFIED not in skeptic_table(figs, {"c": rs}, {"c": "(c) arm"}, {"c": True}, 16)


def test_answers_summary_of_a_probe_needs_no_judge_and_counts_what_the_replies_are(tmp_path) -> None:
    """`compeer-loop answers`: the warm-up probe's answers summarised without a judge (format, accuracy beside the
    majority baseline and kappa, degenerate marks, named strategies, missing CER parts), written beside them."""
    import json

    from compeer_loop.cli import main

    rows = [_rec(0, "Question", "Question", total=None), _rec(1, "Question", "Question", total=None),
            _rec(2, "Question", "Reflection", total=None),
            _rec(3, None, "Affirmation", text="I would place this in the comforting stage.", total=None, fmt=False)]
    rows[3]["missing"] = ["strategy", "response"]
    rows.append({"id": "p4", "status": "failed", "gold_strategy": "Question"})  # not answered: counted, not scored
    out = tmp_path / "eval" / "a"
    out.mkdir(parents=True)
    (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["answers", "--root", str(tmp_path), "--policy", "a", "--n-boot", "50"]) == 0
    s = json.loads((out / "answers-summary.json").read_text())
    assert (s["prompts"], s["answered"]) == (5, 4)
    f = s["figures"]
    assert f["format_ok"]["value"] == pytest.approx(75.0)
    assert f["strategy_accuracy"]["value"] == pytest.approx(50.0) and f["majority_baseline"]["value"] == pytest.approx(50.0)
    assert 0.0 < f["strategy_kappa"]["value"] < 1.0
    assert f["degenerate"]["value"] == pytest.approx(25.0)
    assert s["named_strategies"] == {"Question": 3, "null": 1}
    assert s["missing_parts"] == {"none": 3, "strategy,response": 1}
    assert s["marks"]["none"] == 3 and sum(s["marks"].values()) == 4
    assert "reward_total" not in f  # no judge figure in a judge-free summary
    assert main(["answers", "--root", str(tmp_path), "--policy", "b"]) == 2  # no answers: a usage error


def test_degenerate_share_stands_beside_the_real_replies_share_under_the_same_rule() -> None:
    """ESConv's own supporters write short turns the rule marks ("I see."): the table shows that rate at the same
    prompts beside each policy's degenerate share, so that a < 2% goal is read against it."""
    rs = [add_item_figures(r) for r in (
        {**_rec(0, "Question", "Question"), "reference": "I see."},
        {**_rec(1, "Question", "Question", text="I see."), "reference": "I am sorry about your job."},
        _rec(2, "Question", "Question"), _rec(3, "Question", "Question"))]
    figs = summarise(rs, n_boot=20)["figures"]
    assert figs["reference_degenerate"]["value"] == pytest.approx(25.0)  # the real reply of p0 only
    assert figs["degenerate"]["value"] == pytest.approx(25.0)  # the policy's reply of p1 only
    text = skeptic_table({"c": summarise(rs, n_boot=20)}, {"c": rs}, {"c": "(c) arm"}, {}, 16)
    assert "degenerate % (the real replies')" in text and "| 25.00 [" in text and "(25.00 [" in text
    assert summarise_answers(rs, n_boot=20)["figures"]["reference_degenerate"]["value"] == pytest.approx(25.0)


def test_the_training_judge_against_the_independent_scorer_arm_by_arm() -> None:
    """Per arm against (a) on the same prompt: the judge's higher / level / lower counts with the scorer's mean win
    difference in each, and the share of pairs both told apart where the scorer sides with the judge; a prompt one
    of them did not score is left out; no table without (a)."""
    from compeer_loop.report_checks import judge_against_scorer

    def rec(i: int, total: float, win: float | None) -> dict[str, object]:
        return {"id": f"p{i}", "status": "ok", "judge_status": "ok", "reward_total": total,
                "independent_status": "ok" if win is not None else "call_failed", "independent_win": win}

    a = [rec(i, 3.0, 0.5) for i in range(6)]
    c = [rec(0, 4.0, 1.0), rec(1, 4.0, 0.0), rec(2, 4.0, 1.0),  # judge higher: scorer agrees twice, once not
         rec(3, 3.0, 0.5),  # level, scorer level
         rec(4, 2.0, 1.0),  # judge lower, scorer higher: disagrees
         rec(5, 5.0, None)]  # not scored: left out
    text = judge_against_scorer({"a": a, "c": c})
    assert "| (c) - (a) | 5 | 3 (+0.17) | 1 (+0.00) | 1 (+0.50) | 50.0 (4) |" in text
    assert ", graded" not in text  # records without a graded total: no graded row
    # graded totals: a difference within the judge-flat rule (0.05) is level
    for r, g in zip(a, [3.0] * 6):
        r["reward_total_graded"] = g
    for r, g in zip(c, [3.04, 2.5, 3.5, 3.0, 3.0, 3.0]):
        r["reward_total_graded"] = g
    text = judge_against_scorer({"a": a, "c": c})
    assert "| (c) - (a), graded | 5 | 1 (+0.50) | 3 (+0.33) | 1 (-0.50) | 100.0 (2) |" in text
    assert judge_against_scorer({"c": c}) == "" and judge_against_scorer({"a": a}) == ""
