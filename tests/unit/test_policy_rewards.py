"""policy_trainer.rewards.CompeerReward against FakeRewardClient (no server)."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from cer.modes import JudgeMode, RewardJudgeMode
from cer.redundancy import RedundancyMode
from cer.rewards import RewardKind
from policy_trainer.config import LengthUnit
from policy_trainer.rewards import (
    CompeerReward,
    GradedRewardsUnavailable,
    GroupingError,
    RewardSettings,
    completion_text,
)
from reward_server.types import Status
from tests.unit.test_policy_fakes import FakeRewardClient, FakeScore

HIST_A = [{"role": "seeker", "text": "history A"}]
HIST_B = [{"role": "seeker", "text": "history B"}, {"role": "supporter", "text": "ok"}]


def _call(reward: CompeerReward, completions: list[str], ids: list[list[int]], histories: list, refs: list,
          metrics: dict[str, list[float]] | None = None) -> list[float | None]:
    def log_metric(name: str, value: float) -> None:
        if metrics is not None:
            metrics.setdefault(name, []).append(value)

    prompts = [[{"role": "user", "content": h[0]["text"]}] for h in histories]
    convo = [[{"role": "assistant", "content": c}] for c in completions]
    return asyncio.run(reward(prompts=prompts, completions=convo, completion_ids=ids, history=histories,
                              reference=refs, log_metric=log_metric, trainer_state=None))


def _two_groups_table() -> dict[str, FakeScore]:
    # a1: 1+1+1 +1 -1 = 3; a2: -1-1+1 -1 +1 = -1; b1 parse_failed; b2: 1-1-1 +1 +1 = 1
    return {
        "a1": FakeScore(steps=[1.0, 1.0, 1.0], preference=1.0, format=-1.0, s_in=0.5, s_hi=0.2),
        "a2": FakeScore(steps=[-1.0, -1.0, 1.0], preference=-1.0, format=1.0, s_in=0.5, s_hi=0.0),
        "b1": FakeScore(status=Status.PARSE_FAILED, steps=[None, 1.0, 1.0], s_in=0.2, s_hi=0.2),
        "b2": FakeScore(steps=[1.0, -1.0, -1.0], preference=1.0, format=1.0, s_in=0.0, s_hi=0.0),
    }


def test_one_batch_call_grouped_by_prompt_and_reweighted() -> None:
    fake = FakeRewardClient(_two_groups_table())
    reward = CompeerReward(RewardSettings(num_generations=2), lambda: fake)
    metrics: dict[str, list[float]] = {}
    out = _call(reward, ["a1", "a2", "b1", "b2"], [[0] * 4, [0] * 6, [0] * 5, [0] * 5],
                [HIST_A, HIST_A, HIST_B, HIST_B], ["ref A", "ref A", "ref B", "ref B"], metrics)
    # group A: L = 5 -> tau = 0.5; a1: 3 / ((1.25)(1.1)) = 2.181818; a2: -1 / (1.25 * 1) = -0.8
    # group B: b1 unscored -> None (never 0); b2: 1 / 1 = 1
    assert out[0] == pytest.approx(2.1818181818)
    assert out[1] == pytest.approx(-0.8)
    assert out[2] is None
    assert out[3] == pytest.approx(1.0)
    assert len(fake.calls) == 1, "one ScoreBatch per generation batch"
    groups = fake.calls[0]
    assert [g.candidates for g in groups] == [["a1", "a2"], ["b1", "b2"]]
    assert groups[1].reference == "ref B" and [t.text for t in groups[1].history] == ["history B", "ok"]
    assert groups[0].options.mode is JudgeMode.UNIFIED and groups[0].options.include_similarity
    m = {k: v[0] for k, v in metrics.items()}
    assert m["compeer/parse_failure_rate"] == pytest.approx(0.25)
    assert m["compeer/unscored_rate"] == pytest.approx(0.25)
    assert m["compeer/timeout_rate"] == 0.0
    assert m["compeer/reward_raw_mean"] == pytest.approx((3 - 1 + 1) / 3)
    assert m["compeer/reward_reweighted_mean"] == pytest.approx((2.1818181818 - 0.8 + 1.0) / 3)
    assert m["compeer/tau_mean"] == pytest.approx(0.5)  # both groups have L = 5
    assert m["compeer/s_in_mean"] == pytest.approx((0.5 + 0.5 + 0.2 + 0.0) / 4)
    # step rewards of scored items: a1 (1,1,1), a2 (-1,-1,1), b2 (1,-1,-1) -> 1/9
    assert m["compeer/step_reward_mean"] == pytest.approx(1 / 9)
    assert m["compeer/preference_reward_mean"] == pytest.approx(1 / 3)
    assert m["compeer/format_reward_mean"] == pytest.approx((-1 + 1 + 1 + 1) / 4)
    assert m["compeer/reward_call_failures"] == 0.0
    assert m["compeer/reward_call_latency_s"] >= 0.0 and "compeer/reward_fn_overhead_s" in m
    assert m["compeer/server_inference_ms"] == pytest.approx(12.0)
    assert m["compeer/server_group_max_ms"] == pytest.approx(15.0)  # queue 3 + inference 12, slowest group


def test_sign_aware_and_off_modes() -> None:
    table = _two_groups_table()
    args = (["a1", "a2"], [[0] * 4, [0] * 6], [HIST_A, HIST_A], ["r", "r"])
    sign = CompeerReward(RewardSettings(2, redundancy_mode=RedundancyMode.SIGN_AWARE),
                         lambda: FakeRewardClient(table))
    assert _call(sign, *args) == pytest.approx([2.1818181818, -1.25])
    fake = FakeRewardClient(table)
    off = CompeerReward(RewardSettings(2, redundancy_mode=RedundancyMode.OFF), lambda: fake)
    assert _call(off, *args) == [3.0, -1.0]
    assert not fake.calls[0][0].options.include_similarity


def test_length_unit_words_changes_tau() -> None:
    # words: "a1" and "a2" are one word each -> L = 1 -> tau = 1 / (1 + e^2) = 0.1192029
    metrics: dict[str, list[float]] = {}
    reward = CompeerReward(RewardSettings(2, length_unit=LengthUnit.WORDS),
                           lambda: FakeRewardClient(_two_groups_table()))
    _call(reward, ["a1", "a2"], [[0] * 40, [0] * 40], [HIST_A, HIST_A], ["r", "r"], metrics)
    assert metrics["compeer/tau_mean"][0] == pytest.approx(0.1192029220)


def test_server_unavailable_gives_none_not_zero_and_is_counted() -> None:
    fake = FakeRewardClient(fail_with=grpc.StatusCode.UNAVAILABLE)
    reward = CompeerReward(RewardSettings(2), lambda: fake)
    metrics: dict[str, list[float]] = {}
    out = _call(reward, ["a1", "a2"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"], metrics)
    assert out == [None, None]
    assert metrics["compeer/reward_call_failures"] == [1.0]
    assert metrics["compeer/unscored_rate"] == [1.0]
    assert "compeer/reward_raw_mean" not in metrics, "no made-up mean when nothing was scored"
    assert reward.total_call_failures == 1


def test_deadline_exceeded_counts_as_timeouts() -> None:
    reward = CompeerReward(RewardSettings(2), lambda: FakeRewardClient(fail_with=grpc.StatusCode.DEADLINE_EXCEEDED))
    metrics: dict[str, list[float]] = {}
    assert _call(reward, ["a1", "a2"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"], metrics) == [None, None]
    assert metrics["compeer/timeout_rate"] == [1.0]


def test_a_hanging_server_never_blocks_past_the_deadline() -> None:
    fake = FakeRewardClient(hang_s=30.0)
    reward = CompeerReward(RewardSettings(2, timeout_s=0.2, guard_s=0.1), lambda: fake)
    t0 = time.perf_counter()
    out = _call(reward, ["a1", "a2"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"])
    assert time.perf_counter() - t0 < 5.0
    assert out == [None, None]
    assert fake.timeouts == [0.2], "the client gets the configured deadline"


def test_rejected_group_only_loses_its_own_rewards() -> None:
    reward = CompeerReward(RewardSettings(2), lambda: FakeRewardClient(_two_groups_table(), reject_groups=[0]))
    out = _call(reward, ["a1", "a2", "b1", "b2"], [[0] * 5] * 4, [HIST_A, HIST_A, HIST_B, HIST_B], ["r"] * 2 + ["s"] * 2)
    assert out[:3] == [None, None, None]
    assert out[3] == pytest.approx(1.0)


def test_missing_similarity_leaves_item_unscored_under_reweighting() -> None:
    table = {"x": FakeScore(s_in=None, s_hi=None), "y": FakeScore(s_in=0.0, s_hi=0.0)}
    metrics: dict[str, list[float]] = {}
    reward = CompeerReward(RewardSettings(2), lambda: FakeRewardClient(table))
    out = _call(reward, ["x", "y"], [[0] * 5, [0] * 5], [HIST_A, HIST_A], ["r", "r"], metrics)
    assert out == [None, pytest.approx(5.0)]
    assert metrics["compeer/unscored_rate"] == [0.5]


def test_prm_orm_mode_sums_two_calls() -> None:
    table = {"p": FakeScore(steps=[1.0, -1.0, 1.0], preference=-1.0, format=1.0),
             "q": FakeScore(steps=[1.0, 1.0, 1.0], preference=1.0, format=-1.0)}
    fake = FakeRewardClient(table)
    reward = CompeerReward(RewardSettings(2, judge_mode=RewardJudgeMode.PRM_ORM,
                                          redundancy_mode=RedundancyMode.OFF), lambda: fake)
    out = _call(reward, ["p", "q"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"])
    # p: steps 1 + pref -1 + format 1 = 1; q: 3 + 1 - 1 = 3
    assert out == [1.0, 3.0]
    assert sorted(c[0].options.mode.value for c in fake.calls) == ["orm", "prm"]


def test_group_mixing_two_prompts_is_refused() -> None:
    reward = CompeerReward(RewardSettings(2), lambda: FakeRewardClient())
    with pytest.raises(GroupingError, match="share one prompt"):
        _call(reward, ["a", "b"], [[0], [0]], [HIST_A, HIST_B], ["r", "r"])
    with pytest.raises(GroupingError, match="multiple of num_generations"):
        _call(reward, ["a", "b", "c"], [[0]] * 3, [HIST_A] * 3, ["r"] * 3)


def test_client_is_made_on_the_calling_loop_and_closed() -> None:
    made: list[FakeRewardClient] = []

    def factory() -> FakeRewardClient:
        made.append(FakeRewardClient())
        return made[-1]

    reward = CompeerReward(RewardSettings(2), factory)
    _call(reward, ["a", "b"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"])
    _call(reward, ["a", "b"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"])  # asyncio.run: a new loop each time
    assert len(made) == 2
    asyncio.run(reward.aclose())
    assert made[-1].closed


def test_completion_text_forms() -> None:
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "x"}]) == "x"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "y"}]}]) == "y"


def test_engine_errors_are_unscored_and_counted() -> None:
    table = {"e": FakeScore(status=Status.ENGINE_ERROR), "f": FakeScore(s_in=0.0, s_hi=0.0)}
    metrics: dict[str, list[float]] = {}
    reward = CompeerReward(RewardSettings(2), lambda: FakeRewardClient(table))
    out = _call(reward, ["e", "f"], [[0] * 5, [0] * 5], [HIST_A, HIST_A], ["r", "r"], metrics)
    assert out == [None, pytest.approx(5.0)]
    assert metrics["compeer/engine_error_rate"] == [0.5]
    assert metrics["compeer/parse_failure_rate"] == [0.0]


# ---- graded rewards (reward_kind) -------------------------------------------------------------------------------
def _graded_table() -> dict[str, FakeScore]:
    # the judge's verdicts agree (discrete totals equal: 5) but its certainty differs (graded totals 4.2 and 2.6)
    return {"sure": FakeScore(graded=([0.8, 0.8, 0.8], 0.8)), "unsure": FakeScore(graded=([0.4, 0.4, 0.4], 0.4)),
            "half": FakeScore(graded=([0.8, None, 0.8], 0.8))}


def test_graded_total_is_the_default_reward_and_discrete_stays_selectable() -> None:
    args = (["sure", "unsure"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"])
    off = RedundancyMode.OFF
    metrics: dict[str, list[float]] = {}
    graded = CompeerReward(RewardSettings(2, redundancy_mode=off), lambda: FakeRewardClient(_graded_table()))
    assert graded.settings.reward_kind is RewardKind.GRADED
    assert _call(graded, *args, metrics=metrics) == pytest.approx([4.2, 2.6])
    m = {k: v[0] for k, v in metrics.items()}
    assert m["compeer/graded_total_mean"] == pytest.approx(3.4) and m["compeer/discrete_total_mean"] == 5.0
    assert m["compeer/graded_step_reward_mean"] == pytest.approx(0.6) and m["compeer/step_reward_mean"] == 1.0
    assert m["compeer/graded_preference_reward_mean"] == pytest.approx(0.6)
    assert m["compeer/reward_raw_mean"] == pytest.approx(3.4)  # the reward trained on
    discrete = CompeerReward(RewardSettings(2, redundancy_mode=off, reward_kind=RewardKind.DISCRETE),
                             lambda: FakeRewardClient(_graded_table()))
    assert _call(discrete, *args) == [5.0, 5.0]
    # reweighting applies to the graded total: s_in 0.5, L = 5 -> tau 0.5 -> / 1.25
    table = {k: FakeScore(graded=v.graded, s_in=0.5) for k, v in _graded_table().items()}
    reweighted = CompeerReward(RewardSettings(2), lambda: FakeRewardClient(table))
    assert _call(reweighted, ["sure", "unsure"], [[0] * 5] * 2, [HIST_A] * 2, ["r"] * 2) == pytest.approx(
        [4.2 / 1.25, 2.6 / 1.25])
    # a missing graded component leaves the item unscored, never filled in from the discrete verdict
    assert _call(graded, ["half", "sure"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"]) == [None, pytest.approx(4.2)]


def test_graded_reward_from_a_server_without_them_is_an_error_naming_the_setting() -> None:
    args = (["sure", "unsure"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"])
    reward = CompeerReward(RewardSettings(2), lambda: FakeRewardClient(_graded_table(), graded=False))
    with pytest.raises(GradedRewardsUnavailable, match="reward_kind: discrete"):
        _call(reward, *args)
    discrete = CompeerReward(RewardSettings(2, redundancy_mode=RedundancyMode.OFF, reward_kind=RewardKind.DISCRETE),
                             lambda: FakeRewardClient(_graded_table(), graded=False))
    assert _call(discrete, *args) == [5.0, 5.0]


def test_prm_orm_graded_total_sums_the_graded_components() -> None:
    reward = CompeerReward(RewardSettings(2, judge_mode=RewardJudgeMode.PRM_ORM, redundancy_mode=RedundancyMode.OFF),
                           lambda: FakeRewardClient(_graded_table()))
    assert _call(reward, ["sure", "unsure"], [[0], [0]], [HIST_A, HIST_A], ["r", "r"]) == pytest.approx([4.2, 2.6])


def test_each_step_logs_the_share_of_degenerate_completions_by_the_pipelines_rule() -> None:
    """The judge's own stage wording and a known generic template are degenerate; a real reply is not; a fragment
    with no tags is read as its text (as the evaluator reads it)."""
    hist = [{"role": "seeker", "text": "My sister stopped talking to me after the wedding and I miss her."}]
    real = ("<analysis>The seeker misses her sister.</analysis><emotion>sadness</emotion><strategy>Question"
            "</strategy><response>What happened between you two at the wedding?</response>")
    stage = "I would place this in the comforting stage."
    generic = ("<analysis>a</analysis><emotion>sadness</emotion><strategy>Affirmation</strategy>"
               "<response>I understand how you feel. It must be hard.</response>")
    table = {t: FakeScore(steps=[1.0, 1.0, 1.0], preference=1.0, format=1.0, s_in=0.0, s_hi=0.0)
             for t in (real, stage, generic, real + " ")}
    reward = CompeerReward(RewardSettings(num_generations=4, redundancy_mode=RedundancyMode.OFF),
                           lambda: FakeRewardClient(table))
    metrics: dict[str, list[float]] = {}
    _call(reward, [real, stage, generic, real + " "], [[0]] * 4, [hist] * 4, ["r"] * 4, metrics)
    marks = reward.last_stats.reply_marks  # type: ignore[union-attr]
    assert marks[0] is None and marks[3] is None
    assert marks[1] == "degenerate/stage_label" and marks[2] is not None and marks[2].startswith("generic/")
    assert metrics["compeer/degenerate_share"] == [0.5] and metrics["compeer/marked_share"] == [0.5]


def test_each_step_logs_the_real_replies_share_under_the_same_rule() -> None:
    """ESConv's own short turns ("I see.") are marked by the rule too: the step logs the share of its completions
    whose prompt's real reply is marked, and the run summary its mean over steps, beside degenerate_share."""
    hist = [{"role": "seeker", "text": "My sister stopped talking to me after the wedding and I miss her."}]
    reply = "<analysis>a</analysis><emotion>b</emotion><strategy>Question</strategy><response>Why?</response>"
    table = {reply: FakeScore(steps=[1.0, 1.0, 1.0], preference=1.0, format=1.0, s_in=0.0, s_hi=0.0)}
    reward = CompeerReward(RewardSettings(num_generations=2, redundancy_mode=RedundancyMode.OFF),
                           lambda: FakeRewardClient(table))
    metrics: dict[str, list[float]] = {}
    refs = ["I see.", "I see.", "What happened with your sister at the wedding?",
            "What happened with your sister at the wedding?"]
    _call(reward, [reply] * 4, [[0]] * 4, [hist] * 4, refs, metrics)
    assert metrics["compeer/reference_degenerate_share"] == [0.5]
    rows = [{"step": i, "step_time": 1.0, "compeer/reference_degenerate_share": v} for i, v in enumerate((0.5, 0.25))]
    from policy_trainer.report import summarise
    assert summarise(rows)["reference_degenerate_share"] == pytest.approx(0.375)
    assert "reference_degenerate_share" not in summarise([{"step": 0, "step_time": 1.0}])  # not logged: not made up


def test_log_completions_file_writes_each_completion_with_its_reward_and_mark(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run" / "completions.jsonl"
    reward = CompeerReward(RewardSettings(num_generations=2, completions_path=path), lambda: FakeRewardClient(
        _two_groups_table()))
    prompts = [[{"role": "user", "content": "x"}]] * 4
    convo = [[{"role": "assistant", "content": c}] for c in ("a1", "a2", "b1", "b2")]
    for _ in range(2):
        asyncio.run(reward(prompts=prompts, completions=convo, completion_ids=[[0] * 4, [0] * 6, [0] * 5, [0] * 5],
                           history=[HIST_A, HIST_A, HIST_B, HIST_B], reference=["A", "A", "B", "B"],
                           dialogue_id=["d1", "d1", "d2", "d2"], log_metric=None, trainer_state=None))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["call"], r["index"], r["group"], r["dialogue_id"], r["text"]) for r in rows[:4]] == [
        (1, 0, 0, "d1", "a1"), (1, 1, 0, "d1", "a2"), (1, 2, 1, "d2", "b1"), (1, 3, 1, "d2", "b2")]
    assert rows[4]["call"] == 2 and len(rows) == 8
    assert rows[0]["reward"] == pytest.approx(2.1818181818) and rows[0]["total"] == 3.0
    assert rows[2]["reward"] is None and rows[2]["status"] == "parse_failed"  # unscored: no made-up reward
    assert all("mark" in r for r in rows)
    # the components the total is made of, as judged (a1: steps 1, 1, 1, preference +1, format -1)
    assert (rows[0]["steps"], rows[0]["preference"], rows[0]["format"]) == ([1.0, 1.0, 1.0], 1.0, -1.0)
    assert (rows[0]["s_in"], rows[0]["s_hi"]) == (0.5, 0.2) and rows[2]["steps"] == [None, 1.0, 1.0]  # as judged
    assert {"graded_steps", "graded_preference"} <= rows[0].keys()


def test_a_resumed_run_drops_the_metrics_and_completions_of_the_steps_after_its_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from policy_trainer.report import read_metrics, truncate_metrics

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    lines = [{"call": 1, "step": 1}, {"call": 2, "step": 2}, {"call": 3, "step": 3}, {"call": 3}]  # last: an old line
    for name in ("completions.jsonl", "completions.rank1.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    truncate_metrics(tmp_path, 2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    for name in ("completions.jsonl", "completions.rank1.jsonl"):
        kept = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert kept == [{"call": 1, "step": 1}, {"call": 2, "step": 2}, {"call": 3}]


def test_completions_are_not_written_unless_asked(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from policy_trainer.config import CompeerGRPOConfig

    cfg = CompeerGRPOConfig(output_dir=str(tmp_path), policy_model="x", reward_server=["localhost:1"])
    assert RewardSettings.from_config(cfg).completions_path is None
    cfg.log_completions_file = True
    assert RewardSettings.from_config(cfg).completions_path == tmp_path / "completions.jsonl"
    monkeypatch.setenv("RANK", "3")  # one file a process in a distributed run
    assert RewardSettings.from_config(cfg).completions_path == tmp_path / "completions.rank3.jsonl"


def test_run_summary_says_whether_the_reward_pays_for_degenerate_completions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from policy_trainer.report import summarise_completions

    rows = [  # group (1, 0): a degenerate completion beats one other and ties one; group (1, 1): none degenerate
        (1, 0, "degenerate/stage_label", 2.0), (1, 0, None, 1.0), (1, 0, None, 2.0), (1, 0, "generic/template", None),
        (1, 1, None, 0.5), (1, 1, "echo/echo", 0.1),
        (1, 0, None, 9.0)]  # a resumed run appends its call 1 again: another group, not group (1, 0)
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps({"call": c, "group": g, "mark": m, "reward": r}) + "\n" for c, g, m, r in rows))
    s = summarise_completions(path)
    assert s["completions"] == 7 and s["groups"] == 3 and s["degenerate_share"] == pytest.approx(2 / 7)
    assert s["groups_with_both"] == 1 and s["degenerate_wins_share"] == pytest.approx(0.75)
    assert s["reward_mean_degenerate"] == 2.0 and s["reward_mean_other"] == pytest.approx(12.6 / 5)


def test_a_run_that_starts_from_step_one_drops_an_earlier_attempts_logs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 2026-12-01: a --resume call found no checkpoint (the first call was cut at step 3), trained from step 1 again
    # and appended its completions after the cut attempt's, so steps 1-3 were counted twice
    from policy_trainer.runner import checkpoint_to_resume

    def attempt() -> None:
        (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
        for name in ("completions.jsonl", "completions.rank1.jsonl"):
            (tmp_path / name).write_text(json.dumps({"call": 1, "step": 1}) + "\n")

    for resume in (True, False):
        attempt()
        assert checkpoint_to_resume(tmp_path, resume) is None
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    attempt()
    state = {"global_step": 1}
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "trainer_state.json").write_text(json.dumps(state))
    assert checkpoint_to_resume(tmp_path, True) == str(tmp_path / "checkpoint-1")
    assert (tmp_path / "completions.jsonl").read_text() == json.dumps({"call": 1, "step": 1}) + "\n"  # kept to step 1
    assert checkpoint_to_resume(tmp_path, False) is None and not (tmp_path / "completions.jsonl").exists()
