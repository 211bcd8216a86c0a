"""The transport-neutral core: validate, look up the cache, judge, compute similarities, assemble results.

Both fronts (``grpc/servicer.py``, ``http/app.py``) only convert, await this core and convert back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

import numpy as np

from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import PARTS, RESPONSE_PART, ParsedOutput, parse, strip_tags
from cer.redundancy import similarities
from cer.taxonomy import load_taxonomy
from judge.conversation import Judge
from judge.engines.base import Engine, EngineError
from judge.protocol import COMPONENTS, REPLY, load_template
from reward_server import __version__
from reward_server.admission import Admission
from reward_server.cache import ResultCache, cache_key
from reward_server.config import ServerConfig
from reward_server.embeddings import Embedder
from reward_server.error_codes import ErrorCode
from reward_server.errors import DeadlineExceeded, InvalidArgument, NotReady, Overloaded, ServiceError
from reward_server.metrics import Metrics
from reward_server.results import Outcome, assemble, invalid_result, judgment_from_record, judgment_to_record
from reward_server.types import (
    SCORE_MODES,
    CandidateResult,
    ErrorInfo,
    GroupMeta,
    GroupRequest,
    GroupResponse,
    InfoResponse,
    SamplingInfo,
    Similarity,
    Status,
)
from reward_server.validation import candidate_error, validate_group
from reward_server.workload import group_cost

log = logging.getLogger(__name__)
T = TypeVar("T")


def reply_text(candidate: str, parsed: ParsedOutput) -> str:
    """The text similarities are computed on: the reply part, or the whole candidate without tags when the
    reply part is missing (documented in docs/reward_server.md)."""
    return parsed.response if parsed.response is not None else strip_tags(candidate)


def judged_parts(candidate: str, mode: JudgeMode) -> ParsedOutput:
    """What the judge is shown of a candidate: its parsed CER parts, or in mode ``reply`` only the reply
    (:func:`reply_text`: the ``<response>`` part, else the text without tags)."""
    parsed = parse(candidate)
    if not mode.judges_reply:
        return parsed
    reply = reply_text(candidate, parsed) or None
    return ParsedOutput(parts={p: reply if p == RESPONSE_PART else None for p in PARTS},
                        missing=[p for p in PARTS if p != RESPONSE_PART or reply is None])


class RewardCore:
    """The reward service, independent of transport. Owns the engine, judge, embedder, cache and metrics."""

    def __init__(self, config: ServerConfig, engine: Engine, embedder: Embedder | None, cache: ResultCache,
                 metrics: Metrics | None = None) -> None:
        self.config = config
        self.engine = engine
        self.embedder = embedder
        self.cache = cache
        self.metrics = metrics or Metrics()
        self.template = load_template(config.template)
        self.judge = Judge(engine, self.template, load_taxonomy(config.taxonomy), config.judge)
        #: the modes this server serves: mode reply only with a template that has a reply round
        self.modes = [m for m in SCORE_MODES if not m.judges_reply or self.template.reply_round is not None]
        self._ready = False
        self.admission = Admission(config.in_flight_groups(on_cpu=config.engine.device == "cpu"),
                                   None if config.max_waiting_groups < 0 else config.max_waiting_groups, self.metrics,
                                   window_s=config.admission_window_s)
        self.metrics.queue_depth.set_function(lambda: float(self.engine.queue_depth()))
        s = config.judge
        self.sampling = SamplingInfo(temperature=s.temperature, top_p=s.top_p,
                                     max_tokens=s.max_tokens_per_component,
                                     seed=s.seed if s.seed is not None else config.engine.seed,
                                     max_retries=s.max_retries, constrained=self.judge.constrained)

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine; the core is ready once it is."""
        await self.engine.start()
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        await self.engine.stop()
        await self.cache.close()

    @property
    def ready(self) -> bool:
        """The engine is loaded and healthy: requests can be served (``/readyz``, gRPC health SERVING)."""
        return self._ready and self.engine.healthy()

    @property
    def alive(self) -> bool:
        """False once a started engine has died: the process should be restarted (``/healthz``)."""
        return not (self._ready and not self.engine.healthy())

    @property
    def graded(self) -> bool:
        """Graded rewards are served: the judge reads verdict probabilities (``--no-verdict-probs`` turns it off; an
        engine without logprobs cannot)."""
        return self.judge.graded

    @property
    def cacheable(self) -> bool:
        """Greedy or seeded sampling: the same input gives the same judgment, so it may be cached."""
        return self.config.judge.temperature == 0.0 or self.config.judge.seed is not None

    def info(self) -> InfoResponse:
        e = self.config.engine
        return InfoResponse(model=e.model_id, revision=e.revision, adapter=e.adapter_id or e.adapter,
                            backend=e.backend,
                            template_version=self.template.version, modes=list(self.modes),
                            default_mode=self.config.default_mode, limits=self.config.limits,
                            sampling=self.sampling, version=__version__, cache=self.cache.kind,
                            embedding_model=self.embedder.model_id if self.embedder else "off", graded=self.graded,
                            independent_rounds=self.config.judge.independent_rounds,
                            answer_prefix=self.judge.prefixed,
                            verdict_top_k=self.judge.logprobs or 0,
                            verdict_temperature=self.judge.temperature if self.graded else None)

    # ---- scoring ------------------------------------------------------------------------------------------------
    def timeout_for(self, timeout_ms: int, transport_timeout_s: float | None) -> float:
        """The tightest of the server default, the transport deadline and the request's ``timeout_ms`` (0: unset)."""
        limits = [self.config.default_timeout_s]
        if transport_timeout_s is not None:
            limits.append(transport_timeout_s)
        if timeout_ms:
            limits.append(timeout_ms / 1000.0)
        return max(0.0, min(limits))

    async def bounded(self, work: Awaitable[T], timeout: float, field: str) -> T:
        """Await ``work`` within ``timeout`` seconds; past it its engine requests are cancelled and
        :class:`DeadlineExceeded` names ``field``."""
        try:
            async with asyncio.timeout(timeout):
                return await work
        except TimeoutError:
            self.metrics.failures.labels("deadline").inc()
            raise DeadlineExceeded(f"the request was not judged within {timeout:.3f} s; its engine requests were "
                                   "cancelled", field) from None

    def check_ready(self) -> None:
        """Raise :class:`NotReady` unless requests can be served."""
        if not self.ready:
            raise NotReady("the judge engine is not ready; retry after /readyz reports ready")

    async def score_group(self, req: GroupRequest, timeout_s: float | None = None, prefix: str = "") -> GroupResponse:
        """Score one group. Raises :class:`ServiceError` for group-level failures (bad input, not ready, deadline)."""
        self.check_ready()
        mode = req.options.mode or self.config.default_mode
        validate_group(req, mode, self.config.limits, prefix, self.modes)
        timeout = self.timeout_for(req.options.timeout_ms, timeout_s)
        return await self.bounded(self._score(req, mode, prefix, time.monotonic() + timeout), timeout,
                                  f"{prefix}options.timeout_ms")

    async def score_validated(self, req: GroupRequest, mode: JudgeMode, prefix: str = "") -> GroupResponse:
        """Score a group already checked with :func:`validate_group` (dialogue turns, ``/get_reward`` queries);
        the caller bounds it (:meth:`bounded`)."""
        return await self._score(req, mode, prefix)

    async def score_batch(self, groups: list[GroupRequest | ErrorInfo],
                          timeout_s: float | None = None) -> list[GroupResponse | ErrorInfo]:
        """Score many groups; each succeeds or fails on its own (entries that failed conversion pass through)."""
        self.check_ready()
        if not groups:
            raise InvalidArgument("at least 1 group is required", "groups")
        if len(groups) > self.config.limits.max_groups:
            raise InvalidArgument(f"{len(groups)} groups exceed the limit of {self.config.limits.max_groups} per "
                                  "batch; split the batch", "groups")

        async def one(i: int, g: GroupRequest | ErrorInfo) -> GroupResponse | ErrorInfo:
            if isinstance(g, ErrorInfo):
                return g
            try:
                return await self.score_group(g, timeout_s, prefix=f"groups[{i}].")
            except ServiceError as exc:
                return exc.info()

        out = list(await asyncio.gather(*(one(i, g) for i, g in enumerate(groups))))
        shed = [o for o in out if isinstance(o, ErrorInfo) and o.code is Overloaded.code]
        if shed and len(shed) == sum(1 for g in groups if isinstance(g, GroupRequest)):
            # nothing was admitted: refuse the call as a whole, so the caller retries it elsewhere
            raise Overloaded(shed[0].message, "groups", retry_after_s=self.admission.retry_after_s())
        return out

    async def _score(self, req: GroupRequest, mode: JudgeMode, prefix: str,
                     deadline: float | None = None) -> GroupResponse:
        """Score a validated group; ``deadline`` (``time.monotonic()``) lets admission refuse it early when the
        engine cannot finish it in time."""
        t0 = time.perf_counter()
        errors = [candidate_error(c, i, self.config.limits, prefix) for i, c in enumerate(req.candidates)]
        valid = [i for i, e in enumerate(errors) if e is None]
        # rejected candidates are neither parsed nor hashed
        parsed = {i: judged_parts(req.candidates[i], mode) for i in valid}
        # a candidate with nothing to judge (every component failed by rule) has no key: never looked up or stored
        keys = {i: cache_key(self.judge, mode, req.history, req.reference, parsed[i]) or f"rule:{i}" for i in valid}
        lookups = [i for i in valid if not keys[i].startswith("rule:")]
        outcomes: dict[str, Outcome] = {}
        if self.cacheable:
            distinct = list(dict.fromkeys(keys[i] for i in lookups))
            for k, rec in zip(distinct, await self.cache.get_many(distinct)):
                judgment = None if rec is None else judgment_from_record(rec)
                if judgment is not None:  # a record of another format is a miss
                    outcomes[k] = Outcome(judgment, Status.OK, cache_hit=True)
        todo = {keys[i]: i for i in valid if keys[i] not in outcomes}
        # a group answered from the cache alone needs no judge slot, so cache hits are served under overload too
        cost = group_cost(req.history, req.reference, [req.candidates[i] for i in todo.values()], mode)
        async with self.admission.slot(prefix.rstrip("."), cost, deadline) if todo else contextlib.nullcontext():
            t1 = time.perf_counter()
            if self.cacheable:
                self.metrics.cache_hits.inc(sum(1 for i in lookups if keys[i] in outcomes))
                self.metrics.cache_misses.inc(sum(1 for i in lookups if keys[i] not in outcomes))
            sims_task = None
            if req.options.include_similarity and self.embedder is not None and valid:
                texts = [reply_text(req.candidates[i], parsed[i]) for i in valid]
                sims_task = asyncio.create_task(asyncio.to_thread(self._similarities, texts, req.history))
            judged = await asyncio.gather(*(self._judge_one(req.history, req.reference, parsed[i], mode)
                                            for i in todo.values()))
            outcomes.update(zip(todo.keys(), judged))
            sims = await sims_task if sims_task is not None else None
        fresh = {k: judgment_to_record(o.judgment) for k, o in zip(todo.keys(), judged)
                 if o.status is Status.OK and o.judgment is not None and not k.startswith("rule:")}
        if self.cacheable and fresh:
            await self.cache.set_many(fresh)
        results: list[CandidateResult] = []
        sim_of = dict(zip(valid, zip(*sims))) if sims is not None else {}
        for i, c in enumerate(req.candidates):
            err = errors[i]
            if err is not None:
                results.append(invalid_result(mode, err))
                continue
            r = assemble(parsed[i], mode, outcomes[keys[i]], parse(c) if mode.judges_reply else None, self.graded)
            if not req.options.include_judgment:
                r.judgment = None
            if i in sim_of:
                r.similarity = Similarity(*sim_of[i])
            results.append(r)
        for r in results:
            self.metrics.candidates.labels(r.status.value).inc()
        t2 = time.perf_counter()
        meta = self.meta(mode)
        meta.queue_ms, meta.inference_ms = (t1 - t0) * 1000, (t2 - t1) * 1000
        meta.cache_hits = sum(1 for r in results if r.cache_hit)
        meta.judge_rounds = sum(o.judgment.generations for o in judged if o.judgment is not None)
        return GroupResponse(results=results, meta=meta)

    def meta(self, mode: JudgeMode) -> GroupMeta:
        """The response metadata of this server for ``mode`` (timings and counts zero)."""
        return GroupMeta(model=self.config.engine.model_id, revision=self.config.engine.revision,
                         adapter=self.config.engine.adapter_id or self.config.engine.adapter,
                         template_version=self.template.version,
                         sampling=self.sampling, mode=mode, graded=self.graded)

    async def _judge_one(self, history: list[Turn], reference: str | None, parsed: ParsedOutput,
                         mode: JudgeMode) -> Outcome:
        t = time.perf_counter()
        try:
            j = await asyncio.wait_for(self.judge.judge(history, reference, parsed, mode), self.config.judge_timeout_s)
        except TimeoutError:
            return Outcome(None, Status.TIMEOUT, error=ErrorInfo(
                ErrorCode.DEADLINE_EXCEEDED, "", f"judging took longer than the per-candidate limit of "
                f"{self.config.judge_timeout_s} s"))
        except EngineError as exc:
            self.metrics.failures.labels("engine").inc()
            return Outcome(None, Status.ENGINE_ERROR, error=ErrorInfo(ErrorCode.INTERNAL, "", str(exc)))
        self.metrics.judge_latency.labels(mode.value).observe(time.perf_counter() - t)
        self.metrics.judge_rounds.labels(mode.value).inc(j.generations)
        failed = [c for c in (*COMPONENTS, REPLY) if c in j.judged and j.verdicts.get(c) is None]
        for c in failed:
            self.metrics.parse_failures.labels(c).inc()
        return Outcome(j, Status.PARSE_FAILED if failed else Status.OK)

    def _similarities(self, replies: list[str], history: list[Turn]) -> tuple[list[float], list[float]]:
        assert self.embedder is not None
        vecs = self.embedder.encode(replies + [t.text for t in history])
        return similarities(vecs[: len(replies)], vecs[len(replies):] if history else np.zeros((0, vecs.shape[1])))
