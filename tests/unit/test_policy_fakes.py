"""FakeRewardClient: a stand-in for ``reward_server.client.RewardClient`` in unit tests (a fake, named as such),
plus tests of the fake itself (so the policy tests stand on a checked double).

It answers ``score_batch`` from a table keyed by candidate text, records every call, and can be told to fail
(raise ``RewardCallError``) or hang, to exercise the reward function's failure paths without a server. It serves
graded rewards unless ``graded=False`` (a server without them): a candidate's graded components are the ones its
``FakeScore`` names, by default its discrete ones (a judge sure of every verdict).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import pytest

from cer.modes import JudgeMode
from reward_server.client import RewardCallError
from reward_server.types import (
    CandidateResult,
    ErrorCode,
    ErrorInfo,
    FormatResult,
    GroupMeta,
    GroupRequest,
    GroupResponse,
    PreferenceResult,
    Rewards,
    SamplingInfo,
    ScoreOptions,
    Similarity,
    Status,
    StepResult,
)


@dataclass
class FakeScore:
    """What the fake judge says about one candidate text."""

    steps: list[float | None] = field(default_factory=lambda: [1.0, 1.0, 1.0])
    preference: float | None = 1.0
    format: float = 1.0
    status: Status = Status.OK
    s_in: float | None = 0.0
    s_hi: float | None = 0.0
    #: graded (steps, preference); None: the discrete ones (a judge sure of every verdict)
    graded: tuple[list[float | None], float | None] | None = None


def _rewards(steps: list[float | None], pref: float | None, fmt: float, mode: JudgeMode, ok: bool) -> Rewards:
    steps = [] if mode is JudgeMode.ORM else list(steps)
    pref = None if mode is JudgeMode.PRM else pref
    parts: list[float | None] = [*steps, *([] if mode is JudgeMode.PRM else [pref]), fmt]
    total = None
    if ok and all(p is not None for p in parts):
        total = float(sum(p for p in parts if p is not None))
    return Rewards(steps=steps, preference=pref, format=fmt, total=total)


def _result(score: FakeScore, mode: JudgeMode, with_similarity: bool, graded: bool = True) -> CandidateResult:
    ok = score.status is Status.OK
    discrete = _rewards(score.steps, score.preference, score.format, mode, ok)
    g_steps, g_pref = score.graded or (score.steps, score.preference)
    graded_rewards = _rewards(g_steps, g_pref, score.format, mode, ok) if graded else None
    steps, pref = discrete.steps, discrete.preference
    sim = None
    if with_similarity and score.s_in is not None and score.s_hi is not None:
        sim = Similarity(score.s_in, score.s_hi)
    return CandidateResult(
        status=score.status,
        steps=[StepResult(verdict=None if s is None else s > 0, valid=s is not None, judged=True) for s in steps],
        preference=None if mode is JudgeMode.PRM else PreferenceResult(None, pref is not None, True),
        format=FormatResult(ok=score.format > 0, missing=[]),
        rewards=discrete,
        graded_rewards=graded_rewards,
        similarity=sim,
    )


def _meta(mode: JudgeMode, graded: bool = True) -> GroupMeta:
    sampling = SamplingInfo(temperature=0.0, top_p=1.0, max_tokens=64, seed=0, max_retries=1, constrained=False)
    return GroupMeta(model="fake-judge", revision="0", adapter=None, template_version="fake", sampling=sampling,
                     mode=mode, queue_ms=3.0, inference_ms=12.0, graded=graded)


class FakeRewardClient:
    """Answers from ``table`` (candidate text -> FakeScore); other texts get ``default(text)`` (a plain FakeScore)."""

    def __init__(self, table: dict[str, FakeScore] | None = None, *, fail_with: grpc.StatusCode | None = None,
                 hang_s: float = 0.0, reject_groups: Sequence[int] = (),
                 default: Callable[[str], FakeScore] | None = None, graded: bool = True) -> None:
        self.table = table or {}
        self.graded = graded
        self.default = default or (lambda _text: FakeScore())
        self.fail_with = fail_with
        self.hang_s = hang_s
        self.reject_groups = set(reject_groups)
        self.calls: list[list[GroupRequest]] = []
        self.timeouts: list[float | None] = []
        self.closed = False

    async def score_batch(self, groups: Sequence[GroupRequest],
                          timeout_s: float | None = None) -> list[GroupResponse | ErrorInfo]:
        self.calls.append(list(groups))
        self.timeouts.append(timeout_s)
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        if self.fail_with is not None:
            raise RewardCallError(self.fail_with, "fake failure", "fake:1")
        out: list[GroupResponse | ErrorInfo] = []
        for i, g in enumerate(groups):
            if i in self.reject_groups:
                out.append(ErrorInfo(ErrorCode.INVALID_ARGUMENT, f"groups[{i}].reference", "fake rejection"))
                continue
            mode = g.options.mode or JudgeMode.UNIFIED
            out.append(GroupResponse(results=[_result(self.table[c] if c in self.table else self.default(c), mode,
                                                      g.options.include_similarity, self.graded)
                                              for c in g.candidates],
                                     meta=_meta(mode, self.graded)))
        return out

    async def close(self) -> None:
        self.closed = True


def test_fake_answers_per_mode_and_fails_on_request() -> None:
    req = GroupRequest(history=[], reference="r", candidates=["x", "y"])
    fake = FakeRewardClient({"x": FakeScore(steps=[1.0, -1.0, 1.0], preference=-1.0, format=1.0)})
    out = asyncio.run(fake.score_batch([req]))
    assert isinstance(out[0], GroupResponse)
    assert [r.rewards.total for r in out[0].results] == [1.0, 5.0]
    prm = GroupRequest(history=[], reference=None, candidates=["x"], options=ScoreOptions(mode=JudgeMode.PRM))
    (res,) = asyncio.run(fake.score_batch([prm]))
    assert isinstance(res, GroupResponse) and res.results[0].rewards.total == 2.0
    assert res.results[0].rewards.preference is None
    failing = FakeRewardClient(fail_with=grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(RewardCallError):
        asyncio.run(failing.score_batch([req]))
