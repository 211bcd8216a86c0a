"""Seed replicates in the loop's report (issue 26: three seeds for arms a, b and c, paired comparisons with seeds
pooled, the goal "(c) beats (a) and (b) on the independent scorer ... in each seed"): several loop folders, one per
seed, read as one experiment; refused when two have one seed or their plans differ in more than the seed; one folder
gives the report it gave before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compeer_loop.report import goals, write_report
from compeer_loop.report_checks import beats_in_each_seed
from compeer_loop.seeds import load_replicates
from tests.unit.loop_report_fixture import GOLDEN, PROMPTS, seed_folder, single_root_report


def _two_seeds(tmp_path: Path) -> tuple[Path, Path]:
    """Seed 0: base, a, b, c; (c) wins every prompt, (a) and (b) none. Seed 1: a and c only, level on every prompt.
    Pooled, (c) - (a) is 0.5 with an interval above 0; within seed 1 it is 0."""
    s0 = seed_folder(tmp_path / "s0", 0, {"base": [0.0] * PROMPTS, "a": [0.0] * PROMPTS, "b": [0.0] * PROMPTS,
                                          "c": [1.0] * PROMPTS})
    s1 = seed_folder(tmp_path / "s1", 1, {"a": [0.5] * PROMPTS, "c": [0.5] * PROMPTS})
    return s0, s1


def _goal(report: str, start: str) -> str:
    return next(line for line in report.splitlines() if line.startswith(f"- {start}"))


def test_two_seeds_pool_prompt_x_seed_pairs_and_the_goal_needs_every_seed(tmp_path: Path) -> None:
    s0, s1 = _two_seeds(tmp_path)
    out = tmp_path / "out"
    report = write_report([s1, s0], out, n_boot=200).read_text()  # any order: the seeds are sorted
    figs = json.loads((out / "figures.json").read_text())
    # pooled: (c) has 12 prompts x 2 seeds, its win share the mean over both; (b) ran in seed 0 only
    assert figs["c"]["prompts"] == 2 * PROMPTS and figs["b"]["prompts"] == PROMPTS
    assert figs["c"]["figures"]["independent_win_share"]["value"] == pytest.approx(0.75)
    pooled = figs["_paired"]["pairs"]["c-a:independent_win"]
    assert pooled["n"] == 2 * PROMPTS and pooled["diff"] == pytest.approx(0.5) and pooled["lo"] > 0
    per_seed = figs["_paired"]["per_seed"]["c-a:independent_win"]
    assert {k: (d["n"], d["diff"]) for k, d in per_seed.items()} == {"0": (PROMPTS, 1.0), "1": (PROMPTS, 0.0)}
    assert set(figs["_paired"]["per_seed"]["c-b:independent_win"]) == {"0"}
    assert figs["_paired"]["seed_spread"]["c:independent_win"]["seed_means"] == {"0": 1.0, "1": 0.5}
    assert figs["_seeds"]["seeds"] == [0, 1] and figs["_seeds"]["policies"]["b"] == [0]
    assert figs["_seeds"]["policies"]["c"] == [0, 1]
    # the goal: met in seed 0, missed in seed 1 -> missed, though the pooled interval lies above 0
    line = _goal(report, "(c) beats (a) on the independent scorer")
    assert line.startswith("- (c) beats (a) on the independent scorer: missed: the paired 95% interval of (c) - (a) "
                           "lies above 0 in 1 of 2 seeds (seed 0: 1.00 [1.00, 1.00] (12 pairs, p "), line
    assert "; seed 1: 0.00 [0.00, 0.00] (12 pairs, p 1.0000); seeds pooled: 0.50 [" in line and "(24 pairs" in line
    assert "seed 1: not measured" in _goal(report, "(c) beats (b) on the independent scorer")
    assert "(c) beats (a) on the independent scorer" in report.split("Not supported by the data: ")[1].split(".")[0]
    # the tables name each policy's seeds; the per-seed table; the settings line
    assert "| (c) GRPO, trained judge, reweighting paper (seeds 0, 1) | 24 (24 / 24) |" in report
    assert "| (b) GRPO, untrained base judge, reweighting paper (seed 0) | 12 (12 / 12) |" in report
    assert "### Paired comparisons per seed" in report
    assert "| (c) - (a) | independent_win | 1 | 12 | 0.00 [0.00, 0.00] | 1.0000 |" in report
    assert "| (c) - (a) | strategy_correct | 0 | 12 |" in report
    assert ("Policy SmolLM2-135M-Instruct + LoRA (profile `gpu-paper`), seeds 0, 1 (a loop folder each), 30 GRPO "
            "steps per arm from each seed's own SFT warm-up") in report
    assert "compeer-loop report --root ROOT0 --root ROOT1 --out" in report
    assert ("(200 resamples). BLEU-2, distinct-n and the most frequent reply's share are corpus figures: with several "
            "seeds, the mean of each seed's figure") in report


def test_several_seeds_show_how_each_seed_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judges table has a seed column and a control line per seed, "trained against" names each seed's judge
    where the seeds differ, the training table a row per arm and seed, the curves a line per arm and seed."""
    import matplotlib.axes

    s0, s1 = _two_seeds(tmp_path)
    (s0 / "c" / "judge.json").write_text(json.dumps({"judges": [{
        "server": "trained", "flag": "default", "served": {"model": "m", "revision": "r", "adapter": "ad@sha256:1"},
        "probe": {"preference": 0.5}}]}))
    labels: list[str] = []
    plot = matplotlib.axes.Axes.plot

    def recording(self: Any, *args: Any, **kw: Any) -> Any:
        labels.append(kw.get("label"))
        return plot(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    calls = tmp_path / "calls.txt"
    calls.write_text("run(command='compeer_loop.sh start') 600 s\n")
    report = write_report([s0, s1], tmp_path / "out", n_boot=20, gpu_log=calls).read_text()
    assert set(labels) == {"b s0", "c s0", "c s1"}
    assert ("| seed | arm | judge server | base model (revision) | adapter (hash) | probe: preference / graded "
            "| probe: total, own / other's candidate | ran on (host, GPUs, card) |") in report
    assert "| 0 | (c) | trained (`--adapter default`) | m (r) | ad@sha256:1 | 0.50 / n/a |" in report
    assert "| 1 | (c) | judge not verified (no judge.json) |" in report
    assert "Seed 0: Control (b) vs the trained judge" in report and "Seed 1: Control (b)" in report
    assert ("| seed 0: trained: m (r), ad@sha256:1; seed 1: judge not verified (no judge.json) |" in report)
    assert "| judge not verified (no judge.json) |" in report  # (b): one seed, one phrase
    assert "| (c) seed 1 | 0.27 -> 0.15 | 21.50 -> 27.50 |" in report and "| (b) seed 0 |" in report
    assert "(c) seed 1 1.15 -> 1.75" in report  # the conclusion's training reward per arm and seed
    gpu = report.split("## GPU time and run status\n")[1]
    assert gpu.startswith("**Seed 0** (`") and "\n\n**Seed 1** (`" in gpu and "- seed 1: `" in report
    assert gpu.count("GPU calls") == 1 and "- arm (c): done, None steps\n\nGPU calls (as logged by the lead)" in gpu


def test_met_in_each_seed_is_met_and_one_seed_reads_as_before() -> None:
    figs: dict[str, Any] = {}
    d = {"n": 12, "diff": 0.4, "lo": 0.1, "hi": 0.7, "p": 0.01}
    pooled = {"c-a:independent_win": {**d, "n": 24}}
    both = {"c-a:independent_win": {0: d, 1: {**d, "lo": 0.05}}}
    met = beats_in_each_seed(figs, "c", "a", "independent_win_share", pooled, both, [0, 1])
    assert met.startswith("met: the paired 95% interval of (c) - (a) lies above 0 in 2 of 2 seeds")
    one = {"c-a:independent_win": {0: d, 1: {**d, "lo": -0.05}}}
    assert beats_in_each_seed(figs, "c", "a", "independent_win_share", pooled, one, [0, 1]).startswith("missed")
    by_goal = {g.split(":")[0]: g for g in goals(figs, pooled, one, [0, 1])}
    assert "in 1 of 2 seeds" in by_goal["(c) beats (a) on the independent scorer"]
    single = goals(figs, pooled)  # one seed: the pooled interval decides, as before
    assert ": met: (c) - (a) = 0.40" in next(g for g in single if g.startswith("(c) beats (a) on the independent"))


def test_roots_of_one_seed_or_other_settings_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from compeer_loop.cli import main

    s0 = seed_folder(tmp_path / "s0", 0, {"a": [0.0] * 3, "c": [1.0] * 3})
    again = seed_folder(tmp_path / "again", 0, {"a": [0.0] * 3, "c": [1.0] * 3})
    with pytest.raises(ValueError, match="s0 and .*again have the same seed 0: seed replicates need one folder"):
        load_replicates([s0, again])
    other_lr = seed_folder(tmp_path / "lr", 1, {"a": [0.0] * 3}, learning_rate=1e-4)
    with pytest.raises(ValueError, match=r"lr was planned with other settings than .*s0 \(learning_rate; only seed, "):
        load_replicates([s0, other_lr])
    other_steps = seed_folder(tmp_path / "steps", 2, {"a": [0.0] * 3}, steps=40, max_completion_length=128)
    with pytest.raises(ValueError, match=r"\(max_completion_length, steps; only"):
        load_replicates([s0, other_steps])
    fine = seed_folder(tmp_path / "s1", 1, {"a": [0.0] * 3, "b": [0.5] * 3}, cards=["0", "1"])  # arms, cards differ
    assert [r.seed for r in load_replicates([fine, s0])] == [0, 1]
    assert main(["report", "--root", str(s0), "--root", str(again), "--out", str(tmp_path / "out")]) == 2
    assert "have the same seed 0" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_one_root_gives_the_report_it_gave_before_seeds(tmp_path: Path) -> None:
    """Byte for byte the report and figures.json the code before several roots wrote for the same folder
    (tests/unit/loop_report_fixture.py says how the golden files were made)."""
    report, figures = single_root_report(tmp_path)
    assert report == (GOLDEN / "single-root-report.md").read_text()
    assert figures == (GOLDEN / "single-root-figures.json").read_text()


def test_the_settings_line_names_the_plans_policy_model() -> None:
    from compeer_loop.plan import LoopSettings
    from compeer_loop.report import policy_name

    assert policy_name(LoopSettings()) == "SmolLM2-135M-Instruct"
    assert policy_name(LoopSettings(), short=True) == "SmolLM2-135M"
    qwen = LoopSettings(policy_model="qwen2.5-coder-1.5b")
    assert (policy_name(qwen), policy_name(qwen, short=True)) == ("Qwen2.5-Coder-1.5B-Instruct", "Qwen2.5-Coder-1.5B")
    assert policy_name(LoopSettings(policy_model="/models/my-policy"), short=True) == "/models/my-policy"


def test_corpus_figures_average_the_seeds_so_more_seeds_do_not_lower_distinct_n() -> None:
    """Distinct-n of a corpus falls as replies are added: pooling a policy's replies over three seeds would rank it
    below one evaluated under two for that alone. With several seeds a corpus figure is the mean of each seed's; one
    seed's records give the figure itself."""
    from compeer_loop.stats import FIGURES

    def records(seed: int) -> list[dict[str, Any]]:
        return [{"text": f"reply {k} of one seed", "reference": "a real reply", "seed": seed} for k in range(4)]

    one = FIGURES["distinct_2"](records(0))
    assert one is not None and one > 0
    three = records(0) + records(1) + records(2)  # the same four replies under each seed
    assert FIGURES["distinct_2"](three) == pytest.approx(one)
    assert FIGURES["top_reply_share"](three) == pytest.approx(FIGURES["top_reply_share"](records(0)))
    from evaluator.metrics import distinct_n
    assert distinct_n([r["text"] for r in three], 2) < one  # what pooling the replies would have reported


def test_the_second_half_slope_says_whether_the_training_reward_has_flattened(tmp_path: Path) -> None:
    """A reward still rising in its second half has an interval above 0; one that flattened (noise around a level)
    an interval holding 0; an arm with too few steps is left out."""
    from compeer_loop.report_runs import late_slopes

    root = seed_folder(tmp_path / "loop", 0, {"a": [0.5] * PROMPTS, "b": [0.5] * PROMPTS, "c": [0.5] * PROMPTS})
    noise = [0.05, -0.04, 0.02, -0.05, 0.04, -0.01, 0.03, -0.03, 0.01, -0.02]
    rising = [{"step": k, "reward": 0.01 * k + noise[k % 10]} for k in range(1, 41)]
    flat = [{"step": k, "reward": (0.01 * k if k <= 20 else 0.2) + noise[k % 10]} for k in range(1, 41)]
    (root / "b" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rising))
    (root / "c" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flat))
    slopes = late_slopes(load_replicates([root]), n_boot=500)
    b, c = slopes["(b)"], slopes["(c)"]
    assert b[0] == pytest.approx(0.01, abs=0.003) and b[1] > 0
    assert abs(c[0]) < 0.003 and c[1] < 0 < c[2]
    # resumed from step 20: steps 21-40 logged again, level; each counts once, with its later value
    resumed = [*rising, *({"step": k, "reward": 0.2} for k in range(21, 41))]
    (root / "b" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in resumed))
    assert late_slopes(load_replicates([root]), n_boot=50)["(b)"] == pytest.approx((0.0, 0.0, 0.0), abs=1e-9)
    (root / "c" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flat[:10]))
    assert "(c)" not in late_slopes(load_replicates([root]), n_boot=50)


def test_judge_flat_groups_show_what_the_reweighting_alone_pushed(tmp_path: Path) -> None:
    """A group the judge scored alike but whose reward used varies (the reweighting) is counted as judge-flat with a
    spread, its correlation with s_hi and the favoured reply's words; a group the judge told apart is not flat; a flat
    group with no spread favours nothing; an arm without completions.jsonl gets no row."""
    from compeer_loop.report_groups import flat_group_figures, flat_groups_section

    def cand(group: int, total: float, reward: float, s_hi: float | None, words: int,
             step: int = 1) -> dict[str, object]:
        return {"step": step, "call": 1, "group": group, "status": "ok", "total": total, "graded_total": total,
                "reward": reward, "s_hi": s_hi, "text": f"<response>{' '.join(['w'] * words)}</response>"}

    flat_pushed = [cand(0, 5.0, 3.0 - 0.5 * k, 0.1 * k, 10 + k) for k in range(4)]  # least on-topic favoured
    told_apart = [cand(1, float(k), float(k), 0.2, 8) for k in range(4)]
    flat_still = [cand(2, 4.0, 4.0, None, 5 + k) for k in range(4)]  # reweighting off: no spread, no s_hi
    f = flat_group_figures([*flat_pushed, *told_apart, *flat_still, cand(3, 1.0, 1.0, 0.1, 3)])  # a lone candidate
    assert (f["groups"], f["flat"]) == (3, 2) and f["flat_share"] == pytest.approx(2 / 3)
    assert f["rho_s_hi"] == pytest.approx(-1.0)
    assert f["flat_reward_std"] == pytest.approx((float(np.std([3.0, 2.5, 2.0, 1.5])) + 0.0) / 2)
    assert (f["words_favoured"], f["words_others"]) == (10, pytest.approx(12.0))  # only the pushed group counts
    # a resumed arm logs call 1, group 0 again at a later step: another group, not one of 8
    resumed = flat_group_figures([*flat_pushed, *(cand(0, float(k), float(k), 0.2, 8, step=11) for k in range(4))])
    assert (resumed["groups"], resumed["flat"]) == (2, 1)
    # TRL's advantage: |r - mean| / (std with Bessel's correction + 1e-4); the pushed group's are full-size, the flat
    # one's 0
    pushed = np.array([3.0, 2.5, 2.0, 1.5])
    full = float(np.mean(np.abs(pushed - pushed.mean())) / (pushed.std(ddof=1) + 1e-4))
    assert f["flat_advantage"] == pytest.approx(full / 2) and full > 0.7
    root = seed_folder(tmp_path / "loop", 0, {"a": [0.5] * PROMPTS, "b": [0.5] * PROMPTS, "c": [0.5] * PROMPTS})
    assert flat_groups_section(load_replicates([root])) == []
    (root / "c" / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flat_pushed + told_apart))
    lines = flat_groups_section(load_replicates([root]))
    assert lines[-1].startswith("| (c) | 2 | 50.0 (1) | 0.559 | 0.774 (0.775) | -1.00 | 10.0 / 12.0 (1) |")


def test_training_drift_reads_the_first_and_last_quarter_of_an_arms_rollouts(tmp_path: Path) -> None:
    """Per arm: the strategy named most in step 3 (and its share), reply words and the degenerate share, first ->
    last quarter of the logged steps; an arm logging fewer than 4 steps, or none, gets no row."""
    from compeer_loop.report_drift import drift_section, quarter_figures

    def rollout(step: int, strategy: str | None, words: int, mark: str | None = None) -> dict[str, object]:
        step3 = f"<strategy>I will use {strategy}.</strategy>" if strategy else ""
        return {"step": step, "mark": mark, "text": f"{step3}<response>{' '.join(['w'] * words)}</response>"}

    early = [rollout(s, "Question", 20) for s in (1, 2)] + [rollout(s, "Self-disclosure", 30) for s in (1, 2, 2)]
    middle = [rollout(s, "Providing Suggestions", 25) for s in range(3, 7)]
    late = [rollout(7, "Question", 10, "generic/template"), rollout(8, "Question", 10), rollout(8, None, 4,
            "degenerate/stage_label"), rollout(7, "Question", 12, "echo/echo")]  # an echo is not degenerate
    q = quarter_figures([*early, *middle, *late])
    assert q is not None
    assert (q["first"]["top"], q["first"]["top_share"], q["first"]["n"]) == ("Self-disclosure", pytest.approx(0.6), 5)
    assert q["first"]["words"] == pytest.approx(26.0) and q["first"]["degenerate"] == 0.0
    assert (q["last"]["top"], q["last"]["top_share"]) == ("Question", pytest.approx(0.75))
    assert q["last"]["words"] == pytest.approx(9.0) and q["last"]["degenerate"] == pytest.approx(0.5)
    assert quarter_figures(early) is None  # 2 steps logged
    root = seed_folder(tmp_path / "loop", 0, {"a": [0.5] * PROMPTS, "c": [0.5] * PROMPTS})
    assert drift_section(load_replicates([root])) == []
    (root / "c" / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*early, *middle, *late]))
    lines = drift_section(load_replicates([root]))
    assert lines[-1] == "| (c) | Self-disclosure 60% -> Question 75% | 26.0 -> 9.0 | 0.0 -> 50.0 | 5 / 4 |"
