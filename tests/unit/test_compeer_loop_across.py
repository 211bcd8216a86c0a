"""``compeer-loop across``: arms of two loop runs compared through their own warm-ups (compeer_loop/across.py), and
the caveat for an arm the independent scorer shares weights with (report_runs.scored_by_training_weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compeer_loop.across import compare_runs, parse_run
from compeer_loop.report_runs import scored_by_training_weights
from compeer_loop.seeds import load_replicates
from tests.unit.loop_report_fixture import seed_folder

SCORER = "Qwen/Qwen2.5-Coder-1.5B-Instruct"


def _judged(root: Path, arm: str, adapter: str | None) -> None:
    """``ARM/judge.json`` as the loop writes it, and the scorer's identity on the arm's evaluation records."""
    served = {"model": SCORER, "revision": "r", "adapter": adapter}
    (root / arm / "judge.json").write_text(json.dumps({"arm": arm, "judges": [
        {"server": "base" if adapter is None else "trained", "flag": adapter or "none", "served": served}]}))
    path = root / "eval" / arm / "records.jsonl"
    rows = [{**json.loads(line), "independent_scorer": SCORER} for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _runs(tmp_path: Path) -> dict[str, list[Path]]:
    """Run `new` (seeds 0, 1: a and c) and run `old` (seeds 0, 1: a and b). c loses to its warm-up on half the
    prompts; b gains on a quarter; the two warm-ups differ on a quarter of the prompts."""
    a_new, a_old = [0.5, 0.5, 0.5, 0.5] * 3, [0.5, 0.5, 0.5, 1.0] * 3
    c_new, b_old = [0.0, 0.5, 0.0, 0.5] * 3, [1.0, 0.5, 0.5, 1.0] * 3
    runs: dict[str, list[Path]] = {"new": [], "old": []}
    for seed in (0, 1):
        new = seed_folder(tmp_path / f"new{seed}", seed, {"a": a_new, "c": c_new})
        old = seed_folder(tmp_path / f"old{seed}", seed, {"a": a_old, "b": b_old})
        _judged(new, "c", "unifireward-v3")
        _judged(old, "b", None)
        runs["new"].append(new)
        runs["old"].append(old)
    return runs


def test_gains_over_own_warmups_and_their_difference(tmp_path: Path) -> None:
    """The warm-ups' difference is the noise floor; each arm's gain is over its own run's warm-up; the gain
    difference cancels what the warm-ups did differently (here it differs from the direct difference)."""
    text, figs = compare_runs(_runs(tmp_path), keys=("independent_win",), n_boot=200)
    warm = figs["warmups"]["new:a - old:a:independent_win"]
    assert warm["n"] == 24 and warm["diff"] == pytest.approx(-0.125)
    assert figs["gains"]["new:c - new:a:independent_win"]["diff"] == pytest.approx(-0.25)
    assert figs["gains"]["old:b - old:a:independent_win"]["diff"] == pytest.approx(0.125)
    direct = figs["direct"]["new:c - old:b:independent_win"]
    gain = figs["gain_difference"]["(new:c - new:a) - (old:b - old:a):independent_win"]
    assert direct["diff"] == pytest.approx(0.25 - 0.75) and gain["diff"] == pytest.approx(-0.375)
    assert gain["hi"] < 0 and gain["p"] < 0.05
    assert "### Warm-up against warm-up" in text and "| new:c - old:b | independent_win | -0.500 [" in text
    # b trained against the bare base the independent scorer also runs: said for the old run only
    assert text.count("is not independent for (b)") == 1
    assert "unifireward-v3" in text and "no adapter (bare base)" in text


def test_runs_with_no_seed_in_common_are_named_not_tabled(tmp_path: Path) -> None:
    """Pairs are prompt x seed: a run of seed 5 only pairs with no run of seeds 0 and 1, so no row compares them
    (a row of "0 pairs" would say nothing); its own gain is still tabled."""
    runs = _runs(tmp_path)
    other = seed_folder(tmp_path / "s5", 5, {"a": [0.5] * 12, "c": [0.0] * 12})
    text, figs = compare_runs({**runs, "s5": [other]}, keys=("independent_win",), n_boot=100)
    assert "no prompt x seed pair): new and s5; old and s5." in text
    assert not [k for part in figs.values() for k in part if "s5:" in k and "s5:c - s5:a" not in k]
    assert figs["gains"]["s5:c - s5:a:independent_win"]["diff"] == pytest.approx(-0.5)
    assert "0 pairs" not in text and "new:a - old:a" in text


def test_the_shared_weights_caveat_needs_a_bare_judge_with_the_scorers_model(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    assert scored_by_training_weights(load_replicates(runs["old"])) == ["b"]
    assert scored_by_training_weights(load_replicates(runs["new"])) == []  # c's judge has an adapter
    other = tmp_path / "other"
    seed_folder(other, 0, {"a": [0.5] * 4, "b": [0.5] * 4}, independent_scorer_adapter="some-rater")
    _judged(other, "b", None)
    assert scored_by_training_weights(load_replicates([other])) == []  # the scorer runs with an adapter


def test_runs_that_cannot_be_compared_are_refused(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    with pytest.raises(ValueError, match="at least two runs"):
        compare_runs({"new": runs["new"]})
    steps = seed_folder(tmp_path / "steps", 0, {"a": [0.5] * 12, "c": [0.5] * 12}, steps=99)
    with pytest.raises(ValueError, match="steps"):
        compare_runs({"new": runs["new"], "steps": [steps]})
    # the ESC-Eval-style cards feed none of the compared scores: a run with fewer of them still compares
    cards = seed_folder(tmp_path / "cards", 0, {"a": [0.5] * 12, "c": [0.5] * 12}, esc_cards=10)
    assert "cards:c - cards:a:independent_win" in compare_runs({"new": runs["new"], "cards": [cards]})[1]["gains"]
    bare = seed_folder(tmp_path / "nowarm", 0, {"c": [0.5] * 12})
    with pytest.raises(ValueError, match="no evaluated warm-up"):
        compare_runs({"new": runs["new"], "nowarm": [bare]})
    for bad in ("old", "=r", "a:b=r", "x="):
        with pytest.raises(ValueError, match="NAME=ROOT"):
            parse_run(bad)
    assert parse_run("v3=r0,r1") == ("v3", [Path("r0"), Path("r1")])


def test_the_cli_writes_the_section_and_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from compeer_loop.cli import main

    runs = _runs(tmp_path)
    out = tmp_path / "out" / "across.md"
    args = ["across", "--n-boot", "50", "--out", str(out)]
    for name, roots in runs.items():
        args += ["--run", f"{name}=" + ",".join(map(str, roots))]
    assert main(args) == 0
    assert out.read_text().startswith("## Arms of different runs")
    assert "gain_difference" in json.loads(out.with_suffix(".json").read_text())
    assert main(["across", "--out", str(out), "--run", f"x={runs['new'][0]}", "--run", f"x={runs['old'][0]}"]) == 2
    assert "given twice" in capsys.readouterr().err


def test_the_report_compares_another_runs_arm_b_and_checks_the_goal_on_it(tmp_path: Path) -> None:
    """`compeer-loop report --across-run`: the section, the goal "(c) beats (b)" measured across runs (missed here:
    c lost to its warm-up, b gained on its own), the figures in figures.json; this run's own name is refused."""
    from compeer_loop.report import THIS_RUN, write_report

    runs = _runs(tmp_path)
    report = write_report(runs["new"], tmp_path / "rep", n_boot=50, across={"old": runs["old"]}).read_text()
    assert "## Arms of different runs, each through its own warm-up" in report
    within = "- (c) beats (b) on the independent scorer: not measured"
    across = ("- (c) beats old:b on the independent scorer, across runs (each arm's gain over its own run's warm-up): "
              "missed: -0.375 [")
    assert within in report and across in report
    assert report.index("## Arms of different runs") < report.index("## The issue's goals")
    figures = json.loads((tmp_path / "rep" / "figures.json").read_text())
    assert figures["_across"]["gain_difference"][f"({THIS_RUN}:c - {THIS_RUN}:a) - (old:b - old:a):independent_win"]
    old = write_report(runs["old"], tmp_path / "rep-old", n_boot=50).read_text()
    scorer = old.split("### Independent scorer", 1)[1].split("###", 1)[0]
    assert "The independent scorer is not independent for (b)" in scorer  # the report on (b)'s own run says it
    assert "not independent" not in report.split("## Arms of different runs")[0]  # (c)'s judge has an adapter
    with pytest.raises(ValueError, match="own run"):
        write_report(runs["new"], tmp_path / "rep2", n_boot=50, across={THIS_RUN: runs["old"]})
