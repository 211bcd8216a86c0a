"""What the reward function reads from the service's answers: each completion's judged components, discrete and
graded (:class:`ItemScore`), and what one call measured (:class:`RewardBatchStats`, logged as metrics).

A completion's reward is its discrete total (the paper's +1/-1 verdicts) or its graded total (expected rewards under
the judge's label probabilities), as ``reward_kind`` says (:class:`cer.rewards.RewardKind`); both are kept so both
are logged. A total the server did not return stays None: never filled in from the other kind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cer.rewards import RewardKind, total_reward
from data_builder.policy_negatives import is_degenerate
from reward_server.types import CandidateResult, ErrorInfo, GroupResponse, Rewards, Status

log = logging.getLogger(__name__)


class GradedRewardsUnavailable(ValueError):
    """``reward_kind: graded`` but the reward server serves no graded rewards."""


@dataclass
class ItemScore:
    """One completion's judged components (None where not obtained); ``graded_*``: the graded ones."""

    total: float | None = None
    steps: list[float | None] = field(default_factory=list)
    preference: float | None = None
    format: float | None = None
    status: Status | None = None  # None: the call for it failed
    s_in: float | None = None
    s_hi: float | None = None
    graded_total: float | None = None
    graded_steps: list[float | None] = field(default_factory=list)
    graded_preference: float | None = None

    def reward(self, kind: RewardKind) -> float | None:
        """The total of ``kind``."""
        return self.graded_total if kind is RewardKind.GRADED else self.total


@dataclass
class RewardBatchStats:
    """What one call of the reward function measured; also logged as ``compeer/<name>`` metrics.

    ``step_rewards`` .. ``format_rewards`` and ``discrete_totals`` are the discrete components of the scored items,
    ``graded_*`` the graded ones, ``raw_rewards`` the totals of the kind trained on, before reweighting."""

    items: int = 0
    groups: int = 0
    scored: int = 0
    parse_failed: int = 0
    engine_errors: int = 0
    timeouts: int = 0
    call_failures: int = 0
    group_errors: int = 0
    similarity_missing: int = 0
    step_rewards: list[float] = field(default_factory=list)
    preference_rewards: list[float] = field(default_factory=list)
    format_rewards: list[float] = field(default_factory=list)
    discrete_totals: list[float] = field(default_factory=list)
    graded_step_rewards: list[float] = field(default_factory=list)
    graded_preference_rewards: list[float] = field(default_factory=list)
    graded_totals: list[float] = field(default_factory=list)
    raw_rewards: list[float] = field(default_factory=list)
    reweighted_rewards: list[float] = field(default_factory=list)
    s_in: list[float] = field(default_factory=list)
    s_hi: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    rpc_s: float = 0.0
    total_s: float = 0.0
    wait_s: float = 0.0  # how long TRL's call waited for these rewards (less than total_s when prefetched)
    prefetched: bool = False  # judged since the rollouts existed (reward_overlap), not when TRL asked
    server_inference_ms: list[float] = field(default_factory=list)
    server_group_ms: list[float] = field(default_factory=list)  # queue + inference of each group
    reply_marks: list[str | None] = field(default_factory=list)  # the degenerate-reply rule's mark, per completion
    # the same rule on the real supporter reply of each completion's prompt (a prompt with a reference only)
    reference_marks: list[str | None] = field(default_factory=list)

    def add(self, s: ItemScore) -> None:
        """Count one item's status and components (the rewards it is trained on are counted by the caller)."""
        if s.total is not None:
            self.discrete_totals.append(s.total)
            self.step_rewards.extend(v for v in s.steps if v is not None)
            if s.preference is not None:
                self.preference_rewards.append(s.preference)
        if s.graded_total is not None:
            self.graded_totals.append(s.graded_total)
            self.graded_step_rewards.extend(v for v in s.graded_steps if v is not None)
            if s.graded_preference is not None:
                self.graded_preference_rewards.append(s.graded_preference)
        if s.format is not None:
            self.format_rewards.append(s.format)
        if s.status is Status.PARSE_FAILED:
            self.parse_failed += 1
        elif s.status is Status.TIMEOUT:
            self.timeouts += 1
        elif s.status is Status.ENGINE_ERROR:
            self.engine_errors += 1

    def metrics(self) -> dict[str, float]:
        """Metric name (without prefix) -> value; means over empty lists are left out rather than made up."""
        n = max(self.items, 1)
        out: dict[str, float] = {
            "parse_failure_rate": self.parse_failed / n,
            "engine_error_rate": self.engine_errors / n,
            # capped: in prm_orm mode a timed-out batch is counted once per call
            "timeout_rate": min(1.0, self.timeouts / n),
            "unscored_rate": (self.items - self.scored) / n,
            "reward_call_failures": float(self.call_failures),
            "reward_call_latency_s": self.rpc_s,
            "reward_fn_overhead_s": max(0.0, self.total_s - self.rpc_s),
            # what the trainer waited: the whole call, or what was left of a prefetched one (reward_overlap)
            "reward_wait_s": self.wait_s,
            "reward_prefetched": float(self.prefetched),
        }
        means = {"step_reward_mean": self.step_rewards, "preference_reward_mean": self.preference_rewards,
                 "format_reward_mean": self.format_rewards, "discrete_total_mean": self.discrete_totals,
                 "graded_step_reward_mean": self.graded_step_rewards,
                 "graded_preference_reward_mean": self.graded_preference_rewards,
                 "graded_total_mean": self.graded_totals, "reward_raw_mean": self.raw_rewards,
                 "reward_reweighted_mean": self.reweighted_rewards, "s_in_mean": self.s_in, "s_hi_mean": self.s_hi,
                 "tau_mean": self.taus, "server_inference_ms": self.server_inference_ms}
        for name, values in means.items():
            if values:
                out[name] = sum(values) / len(values)
        if self.reply_marks:
            # the dataset pipeline's rule (data_builder.policy_negatives): degenerate or generic replies, any mark
            marks = self.reply_marks
            out["degenerate_share"] = sum(1 for m in marks if is_degenerate(m)) / len(marks)
            out["marked_share"] = sum(1 for m in marks if m is not None) / len(marks)
        if self.reference_marks:
            # what the real supporters' replies at these prompts score under that rule ("I see." is marked)
            out["reference_degenerate_share"] = (sum(1 for m in self.reference_marks if is_degenerate(m))
                                                 / len(self.reference_marks))
        if self.server_group_ms:
            # groups are judged concurrently, so a call lasts at least its slowest group; the rest of
            # reward_call_latency_s is transport, (de)serialisation and the client
            out["server_group_max_ms"] = max(self.server_group_ms)
        return out


def check_graded(reply: list[GroupResponse | ErrorInfo], kind: RewardKind) -> None:
    """Raise :class:`GradedRewardsUnavailable` when ``kind`` is graded and a server answered without graded rewards
    (``meta.graded`` false): training on discrete totals instead would be a silent switch."""
    if kind is RewardKind.GRADED and any(isinstance(o, GroupResponse) and not o.meta.graded for o in reply):
        raise GradedRewardsUnavailable(
            "reward_kind is graded, but the reward server (reward_server) serves no graded rewards (meta.graded is "
            "false: "
            "its engine returns no logprobs, or it runs with --no-verdict-probs); set `reward_kind: discrete` to "
            "train on the discrete totals, or serve the judge with an engine that returns logprobs")


def outcomes(reply: list[GroupResponse | ErrorInfo] | None, n_groups: int) -> list[GroupResponse | ErrorInfo | None]:
    """One outcome per group sent (None for each when the call failed)."""
    if reply is None:
        return [None] * n_groups
    if len(reply) != n_groups:
        raise RuntimeError(f"reward server answered {len(reply)} groups for {n_groups} sent (protocol violation)")
    return list(reply)


def _group_results(outcome: GroupResponse | ErrorInfo | None, size: int,
                   stats: RewardBatchStats) -> list[CandidateResult] | None:
    if outcome is None:
        return None
    if isinstance(outcome, ErrorInfo):
        stats.group_errors += 1
        log.warning("reward server rejected a group: %s at %s", outcome.code, outcome.field)
        return None
    if len(outcome.results) != size:
        raise RuntimeError(f"reward server answered {len(outcome.results)} candidates for {size} sent")
    if outcome.meta.inference_ms:
        stats.server_inference_ms.append(outcome.meta.inference_ms)
        stats.server_group_ms.append(outcome.meta.queue_ms + outcome.meta.inference_ms)
    return outcome.results


def _similarity(r: CandidateResult) -> tuple[float | None, float | None]:
    return (r.similarity.s_in, r.similarity.s_hi) if r.similarity is not None else (None, None)


def _graded(r: CandidateResult) -> Rewards:
    return r.graded_rewards or Rewards(steps=[], preference=None, format=None, total=None)


def single(outcome: GroupResponse | ErrorInfo | None, size: int, stats: RewardBatchStats) -> list[ItemScore]:
    """The items of one group judged in one call."""
    results = _group_results(outcome, size, stats)
    if results is None:
        return [ItemScore() for _ in range(size)]
    items = []
    for r in results:
        ok = r.status is Status.OK
        s_in, s_hi = _similarity(r)
        g = _graded(r)
        items.append(ItemScore(total=r.rewards.total if ok else None, steps=list(r.rewards.steps),
                               preference=r.rewards.preference, format=r.rewards.format, status=r.status,
                               s_in=s_in, s_hi=s_hi, graded_total=g.total if ok else None, graded_steps=list(g.steps),
                               graded_preference=g.preference))
    return items


def combine_prm_orm(prm: GroupResponse | ErrorInfo | None, orm: GroupResponse | ErrorInfo | None, size: int,
                    stats: RewardBatchStats) -> list[ItemScore]:
    """POR: steps (mode prm) + preference (mode orm) + format, None unless both calls scored the item; the graded
    total likewise from the graded components."""
    p_res = _group_results(prm, size, stats)
    o_res = _group_results(orm, size, stats)
    if p_res is None or o_res is None:
        return [ItemScore() for _ in range(size)]
    items = []
    for p, o in zip(p_res, o_res):
        status = p.status if p.status is not Status.OK else o.status
        ok = status is Status.OK
        total = total_reward([*p.rewards.steps, o.rewards.preference, p.rewards.format]) if ok else None
        pg, og = _graded(p), _graded(o)
        both = p.graded_rewards is not None and o.graded_rewards is not None
        graded = total_reward([*pg.steps, og.preference, pg.format]) if ok and both else None
        s_in, s_hi = _similarity(p)
        items.append(ItemScore(total=total, steps=list(p.rewards.steps), preference=o.rewards.preference,
                               format=p.rewards.format, status=status, s_in=s_in, s_hi=s_hi, graded_total=graded,
                               graded_steps=list(pg.steps), graded_preference=og.preference))
    return items


__all__ = ["GradedRewardsUnavailable", "ItemScore", "RewardBatchStats", "check_graded", "combine_prm_orm", "outcomes",
           "single"]
