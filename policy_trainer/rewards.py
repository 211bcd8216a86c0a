"""The reward function TRL's GRPOTrainer calls: UnifiReward scores from the reward service, reweighted (Eq.5-7).

One call per generation batch: the batch's completions are split into rollout groups (TRL puts the
``num_generations`` completions of a prompt next to each other), all groups go to the server in ONE ``ScoreBatch``
RPC, and each group's rewards are reweighted with the similarities the server returned. Items the judge could not
score get ``None`` (TRL turns it into NaN and leaves the item out of the group baseline): never a made-up 0.
The reward is the graded total by default (``reward_kind``, :mod:`policy_trainer.scores`), the discrete one on
request; a server that serves no graded rewards while ``reward_kind`` is graded stops the run with
:class:`GradedRewardsUnavailable` naming the setting (never a silent switch to the discrete totals).
A failed or timed-out call (after the client's retries, within ``reward_timeout_s``) makes that batch's rewards
None and is counted; it never blocks training for longer than the deadline. A batch's call may start before TRL asks
(:meth:`CompeerReward.prefetch`, ``reward_overlap`` in :mod:`policy_trainer.overlap`); TRL's call then takes its
result, and ``compeer/reward_wait_s`` says how long the step still waited.

Only counts and statistics are logged; dialogue text never leaves DEBUG.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cer.dialogue import Turn
from cer.modes import JudgeMode, RewardJudgeMode
from cer.redundancy import RedundancyMode, reweight
from cer.rewards import RewardKind
from data_builder.policy_negatives import COMPLETIONS_FILE, mark_reply, round_index_of
from policy_trainer.batches import GroupingError, batch_key, completion_text, mark_completion, split_groups
from policy_trainer.config import CompeerGRPOConfig, LengthUnit
from policy_trainer.scores import (
    GradedRewardsUnavailable,
    ItemScore,
    RewardBatchStats,
    check_graded,
    combine_prm_orm,
    outcomes,
    single,
)
from reward_server.client import RewardCallError
from reward_server.types import ErrorInfo, GroupRequest, GroupResponse, ScoreOptions

log = logging.getLogger(__name__)

#: Prefix of every metric this module logs through TRL's ``log_metric``.
METRIC_PREFIX = "compeer/"


class ScoringClient(Protocol):
    """What the reward function needs from a client (``reward_server.client.RewardClient`` has it)."""

    async def score_batch(self, groups: Sequence[GroupRequest],
                          timeout_s: float | None = None) -> list[GroupResponse | ErrorInfo]: ...

    async def close(self) -> None: ...


ClientFactory = Callable[[], ScoringClient]
MetricLogger = Callable[[str, float], None]

#: prefetched batches held at once (``reward_overlap``: one in flight for the step being scored, one for the next)
MAX_PREFETCHED = 2


@dataclass(frozen=True)
class RewardSettings:
    """What the reward function needs from the config."""

    num_generations: int
    judge_mode: RewardJudgeMode = RewardJudgeMode.UNIFIED
    redundancy_mode: RedundancyMode = RedundancyMode.PAPER
    alpha: float = 0.5
    beta: float = 5.0
    length_unit: LengthUnit = LengthUnit.TOKENS
    reward_kind: RewardKind = RewardKind.GRADED
    timeout_s: float = 120.0
    #: seconds granted beyond the client's own deadline before a call is abandoned (a guard, not the deadline)
    guard_s: float = 5.0
    #: where every completion is appended with its reward and mark (``log_completions_file``); None: not written
    completions_path: Path | None = None

    @classmethod
    def from_config(cls, cfg: CompeerGRPOConfig) -> RewardSettings:
        return cls(num_generations=cfg.num_generations or 1, judge_mode=RewardJudgeMode(cfg.judge_mode),
                   redundancy_mode=RedundancyMode(cfg.redundancy_mode), alpha=cfg.redundancy_alpha,
                   beta=cfg.redundancy_beta, length_unit=LengthUnit(cfg.length_unit),
                   reward_kind=RewardKind(cfg.reward_kind), timeout_s=cfg.reward_timeout_s,
                   completions_path=completions_path(cfg))


def completions_path(cfg: CompeerGRPOConfig) -> Path | None:
    """``OUTPUT_DIR/completions.jsonl`` when ``log_completions_file`` is on (``completions.rankR.jsonl`` for a process
    of rank R > 0 of a distributed run, so processes never write one file), else None."""
    if not cfg.log_completions_file:
        return None
    rank = int(os.environ.get("RANK", "0") or 0)
    name = COMPLETIONS_FILE if rank == 0 else COMPLETIONS_FILE.replace(".jsonl", f".rank{rank}.jsonl")
    return Path(cfg.output_dir or ".") / name


@dataclass
class _Judged:
    """One judged batch: completion texts, rewards after reweighting, item scores, prompt rounds, statistics."""

    texts: list[str]
    rewards: list[float | None]
    scores: list[ItemScore]
    rounds: list[int]
    stats: RewardBatchStats


def _history(raw: Any) -> list[Turn]:
    if not isinstance(raw, list):
        raise ValueError("the dataset's `history` column must hold a list of {role, text} turns")  # noqa: TRY004
    return [t if isinstance(t, Turn) else Turn.from_dict(t) for t in raw]


class CompeerReward:
    """Async reward function for ``GRPOTrainer(reward_funcs=[...])``; logged by TRL as ``rewards/compeer``.

    Args:
        settings: grouping, judge mode, redundancy and deadline settings.
        client_factory: builds the scoring client. It is called lazily on the event loop TRL runs async reward
            functions on (gRPC aio channels belong to the loop they were made on).
    """

    __name__ = "compeer"

    def __init__(self, settings: RewardSettings, client_factory: ClientFactory) -> None:
        self.settings = settings
        self._factory = client_factory
        self._client: ScoringClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.last_stats: RewardBatchStats | None = None
        self.total_call_failures = 0
        self.calls = 0  # reward calls made (one per generation batch)
        self._prefetched: dict[str, concurrent.futures.Future[_Judged]] = {}
        self._prefetch_lock = threading.Lock()  # prefetch() runs on the training thread, __call__ on TRL's loop

    # ---- client lifecycle ------------------------------------------------------------------------------------
    def _client_for_loop(self) -> ScoringClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._factory()
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Cancel prefetched calls nobody will ask for, then close the client (on the loop it was made on)."""
        with self._prefetch_lock:
            held, self._prefetched = list(self._prefetched.values()), {}
        for pending in held:
            pending.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---- the call TRL makes -----------------------------------------------------------------------------------
    async def __call__(self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None = None,
                       *, history: list[Any] | None = None, reference: list[Any] | None = None,
                       log_metric: MetricLogger | None = None, **columns: Any) -> list[float | None]:
        t0 = time.perf_counter()
        with self._prefetch_lock:
            pending = self._prefetched.pop(batch_key(prompts, completions), None)
        if pending is not None:  # judged since the rollouts existed (prefetch): take that call's result
            judged = await asyncio.wrap_future(pending)
        else:
            judged = await self._judge(completions, completion_ids, history, reference)
        stats = judged.stats
        stats.wait_s, stats.prefetched = time.perf_counter() - t0, pending is not None
        self.last_stats = stats
        self.calls += 1
        if self.settings.completions_path is not None:
            state = columns.get("trainer_state")  # TRL's TrainerState: the step these rollouts train is the next one
            step = None if state is None else int(state.global_step) + 1
            self._write_completions(judged, columns.get("dialogue_id"), step)
        self.total_call_failures += stats.call_failures
        if log_metric is not None:
            for name, value in stats.metrics().items():
                if math.isfinite(value):
                    log_metric(METRIC_PREFIX + name, value)
        if stats.call_failures:
            log.warning("reward call failed: %d of %d completions unscored this step (%d failed calls so far)",
                        stats.items - stats.scored, stats.items, self.total_call_failures)
        return judged.rewards

    def prefetch(self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None,
                 columns: dict[str, list[Any]], loop: asyncio.AbstractEventLoop) -> None:
        """Start judging a batch of rollouts now, on ``loop`` (TRL's reward loop), before TRL asks for its rewards.

        ``columns`` are the batch's dataset columns (``history``, ``reference``, ...). The call made when TRL asks
        with the same prompts and completions takes this result instead of judging again; its metrics, completions
        file lines and ``wait_s`` (how long the trainer then still waited) are recorded at that point, in training
        order. At most :data:`MAX_PREFETCHED` batches are held: an older one's call is cancelled.
        """
        coro = self._judge(completions, completion_ids, columns.get("history"), columns.get("reference"))
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        with self._prefetch_lock:
            self._prefetched[batch_key(prompts, completions)] = future
            stale = [self._prefetched.pop(k) for k in list(self._prefetched)[:-MAX_PREFETCHED]]
        for old in stale:
            old.cancel()
            log.warning("a prefetched reward call was never asked for and is cancelled (%d held at most)",
                        MAX_PREFETCHED)

    async def _judge(self, completions: list[Any], completion_ids: list[list[int]] | None, history: list[Any] | None,
                     reference: list[Any] | None) -> _Judged:
        """Judge one batch and reweight each group; no side effect on this object but the client."""
        t0 = time.perf_counter()
        n = len(completions)
        if history is None:
            raise ValueError("the GRPO dataset needs a `history` column (list of {role, text}); see "
                             "policy_trainer.data")
        refs: list[Any] = list(reference) if reference is not None else [None] * n
        groups = split_groups(n, self.settings.num_generations, history, refs)
        texts = [completion_text(c) for c in completions]
        stats = RewardBatchStats(items=n, groups=len(groups))
        requests = [GroupRequest(history=_history(history[g[0]]), reference=refs[g[0]],
                                 candidates=[texts[i] for i in g]) for g in groups]
        rounds: list[int] = []  # each completion's round index in its dialogue (the completions file's prompt key)
        for g, req in zip(groups, requests):  # a group shares one conversation: converted once
            turns = [t.to_dict() for t in req.history]
            stats.reply_marks.extend(mark_completion(texts[i], turns) for i in g)
            if req.reference is not None:
                stats.reference_marks.extend([mark_reply(req.reference, turns)] * len(g))
            rounds.extend([round_index_of(turns)] * len(g))
        scores = await self._score(requests, stats)
        lengths = self._lengths(texts, completion_ids)
        rewards: list[float | None] = [None] * n
        for g, group_scores in zip(groups, scores):
            rewards[g.start:g.stop] = self._reweight_group(group_scores, [lengths[i] for i in g], stats)
        stats.total_s = time.perf_counter() - t0
        return _Judged(texts, rewards, [s for g in scores for s in g], rounds, stats)

    def as_reward_func(self) -> Callable[..., Awaitable[list[float | None]]]:
        """This reward as a plain ``async def`` function named ``compeer``, the form every TRL version runs as async.

        TRL before ``is_async_callable`` (trl PR #7213; in the wheels from 1.14.0 on, while 1.0.0 to 1.13.0
        test ``inspect.iscoroutinefunction(reward_func)``) reads an instance with an async ``__call__`` as sync,
        calls it on the training thread and fails on the coroutine it gets back (``TypeError: 'coroutine' object is
        not iterable``); a coroutine function is async to both tests. Pass this to ``GRPOTrainer(reward_funcs=...)``.
        """

        async def compeer(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None = None,
                          **kwargs: Any) -> list[float | None]:
            return await self(prompts, completions, completion_ids, **kwargs)

        compeer.__doc__ = self.__call__.__doc__
        return compeer

    # ---- helpers ------------------------------------------------------------------------------------------------
    def _write_completions(self, judged: _Judged, dialogue_ids: Sequence[Any] | None, step: int | None) -> None:
        """Append this call's completions to ``completions_path`` (one JSON line each; ``round_index``: the round of
        its dialogue the prompt ends before, :func:`data_builder.policy_negatives.round_index_of`; ``step``: the
        optimizer step they train, which a resumed run truncates by, as the metrics; the judged components beside the
        totals, so that what the judge paid for can be read per component)."""
        path = self.settings.completions_path
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        marks = judged.stats.reply_marks
        with path.open("a", encoding="utf-8") as fh:
            for i, (text, reward, score) in enumerate(zip(judged.texts, judged.rewards, judged.scores)):
                fh.write(json.dumps({
                    "call": self.calls, "step": step, "index": i, "group": i // self.settings.num_generations,
                    "dialogue_id": None if dialogue_ids is None else str(dialogue_ids[i]),
                    "round_index": judged.rounds[i], "text": text,
                    "mark": marks[i], "reward": reward, "total": score.total, "graded_total": score.graded_total,
                    "format": score.format, "steps": score.steps, "preference": score.preference,
                    "graded_steps": score.graded_steps, "graded_preference": score.graded_preference,
                    "s_in": score.s_in, "s_hi": score.s_hi,
                    "status": score.status.value if score.status is not None else None}, ensure_ascii=False) + "\n")

    def _lengths(self, texts: list[str], completion_ids: list[list[int]] | None) -> list[float]:
        if self.settings.length_unit is LengthUnit.TOKENS:
            if completion_ids is None:
                raise ValueError("length_unit tokens needs completion_ids (TRL passes them); use length_unit words")
            return [float(len(ids)) for ids in completion_ids]
        return [float(len(t.split())) for t in texts]

    async def _call(self, requests: list[GroupRequest], stats: RewardBatchStats) -> list[GroupResponse | ErrorInfo] | None:
        """One ScoreBatch RPC, bounded; None when it failed (counted in ``stats``)."""
        client = self._client_for_loop()
        timeout = self.settings.timeout_s
        t0 = time.perf_counter()
        try:
            reply = await asyncio.wait_for(client.score_batch(requests, timeout_s=timeout),
                                           timeout + self.settings.guard_s)
        except RewardCallError as exc:
            stats.call_failures += 1
            if exc.code.name == "DEADLINE_EXCEEDED":
                stats.timeouts += sum(len(r.candidates) for r in requests)
            log.warning("reward ScoreBatch failed: %s %s", exc.code.name, exc.address)
            return None
        except TimeoutError:
            stats.call_failures += 1
            stats.timeouts += sum(len(r.candidates) for r in requests)
            log.warning("reward ScoreBatch gave no answer within %.1f s; rewards of this batch are None", timeout)
            return None
        finally:
            stats.rpc_s += time.perf_counter() - t0
        check_graded(reply, self.settings.reward_kind)
        return reply

    async def _score(self, groups: list[GroupRequest], stats: RewardBatchStats) -> list[list[ItemScore]]:
        mode = self.settings.judge_mode
        similarity = self.settings.redundancy_mode is not RedundancyMode.OFF
        if mode is RewardJudgeMode.PRM_ORM:
            prm_req = [_with_options(g, JudgeMode.PRM, similarity) for g in groups]
            orm_req = [_with_options(g, JudgeMode.ORM, False) for g in groups]
            prm, orm = await asyncio.gather(self._call(prm_req, stats), self._call(orm_req, stats))
            return [combine_prm_orm(p, o, len(g.candidates), stats)
                    for g, p, o in zip(groups, outcomes(prm, len(groups)), outcomes(orm, len(groups)))]
        (judge,) = mode.judge_modes
        reply = await self._call([_with_options(g, judge, similarity) for g in groups], stats)
        return [single(o, len(g.candidates), stats) for g, o in zip(groups, outcomes(reply, len(groups)))]

    def _reweight_group(self, scores: list[ItemScore], lengths: list[float], stats: RewardBatchStats) -> list[float | None]:
        raw = [s.reward(self.settings.reward_kind) for s in scores]
        for s, r in zip(scores, raw):
            stats.add(s)
            if r is not None:
                stats.scored += 1
                stats.raw_rewards.append(r)
        if self.settings.redundancy_mode is RedundancyMode.OFF:
            stats.reweighted_rewards.extend(r for r in raw if r is not None)
            return raw
        # An item whose similarity the server did not return cannot be reweighted: it gets no reward rather
        # than an unreweighted one that would not be comparable with the rest of its group.
        usable: list[float | None] = []
        for s, r in zip(scores, raw):
            if r is not None and (s.s_in is None or s.s_hi is None):
                stats.similarity_missing += 1
                stats.scored -= 1
                usable.append(None)
            else:
                usable.append(r)
        s_in = [s.s_in if s.s_in is not None else 0.0 for s in scores]
        s_hi = [s.s_hi if s.s_hi is not None else 0.0 for s in scores]
        out = reweight(usable, s_in, s_hi, lengths, alpha=self.settings.alpha, beta=self.settings.beta,
                       mode=self.settings.redundancy_mode)
        stats.taus.append(out.tau)
        stats.s_in.extend(s.s_in for s in scores if s.s_in is not None)
        stats.s_hi.extend(s.s_hi for s in scores if s.s_hi is not None)
        stats.reweighted_rewards.extend(r for r in out.rewards if r is not None)
        return out.rewards


def _with_options(req: GroupRequest, mode: JudgeMode, similarity: bool) -> GroupRequest:
    return GroupRequest(history=req.history, reference=req.reference, candidates=req.candidates,
                        options=ScoreOptions(mode=mode, include_similarity=similarity))


__all__ = ["ClientFactory", "CompeerReward", "GradedRewardsUnavailable", "GroupingError", "ItemScore", "MetricLogger",
           "RewardBatchStats", "RewardSettings", "ScoringClient", "completion_text", "mark_completion", "split_groups"]
