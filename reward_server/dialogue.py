"""Dialogue scoring, transport-neutral (``POST /v1/dialogues:score`` and gRPC ``ScoreDialogue`` both call
:func:`score_dialogue`): every supporter turn of a whole dialogue is judged against the turns before it, through the
core's one scoring path (:meth:`RewardCore.score_validated`), concurrently under one deadline.

A supporter turn that carries CER parts (any ``<analysis>``/``<emotion>``/``<strategy>``/``<response>`` tag) is
judged in the request's mode (default: the server's); a turn without any tag is a plain reply and is judged in mode
``reply`` (point-wise, no reference, no step or format score). In the history a later turn sees, a supporter turn is
its reply (:func:`reward_server.core.reply_text`), as the seeker heard it.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.reasoning import TAG, parse
from judge.protocol import STEP_COMPONENTS
from reward_server.core import RewardCore, reply_text
from reward_server.errors import InvalidArgument
from reward_server.results import invalid_result
from reward_server.types import (
    DialogueAggregate,
    DialogueRequest,
    DialogueResponse,
    DialogueTurn,
    ErrorInfo,
    GroupRequest,
    GroupResponse,
    Limits,
    ModeAggregate,
    ScoreOptions,
    Status,
    TurnResult,
)
from reward_server.validation import check_mode

#: The reward components the aggregate averages, in order.
AGGREGATE_COMPONENTS: tuple[str, ...] = (*STEP_COMPONENTS, "preference", "format", "reply")


def turn_mode(text: str, cer_mode: JudgeMode) -> JudgeMode:
    """The mode a supporter turn is judged in: ``cer_mode`` when it has any CER tag, else ``reply``."""
    return cer_mode if TAG.search(text) else JudgeMode.REPLY


def validate_dialogue(req: DialogueRequest, limits: Limits) -> None:
    """Raise InvalidArgument (field path + limit) for what makes the whole dialogue unscorable: the turn count, an
    empty or over-long turn (every later turn's history holds it), a reference on a seeker turn, the timeout."""
    n = len(req.turns)
    if n == 0:
        raise InvalidArgument("at least 1 turn is required", "turns")
    if n > limits.max_dialogue_turns:
        raise InvalidArgument(f"{n} turns exceed the limit of {limits.max_dialogue_turns} per dialogue; score a "
                              "shorter window or raise --max-dialogue-turns", "turns")
    for i, t in enumerate(req.turns):
        if not t.text.strip():
            raise InvalidArgument("turn text must not be empty", f"turns[{i}].text")
        if len(t.text) > limits.max_text_chars:
            raise InvalidArgument(f"{len(t.text)} characters exceed the limit of {limits.max_text_chars}",
                                  f"turns[{i}].text")
        if t.reference is not None and t.role is not Role.SUPPORTER:
            raise InvalidArgument("only a supporter turn may carry a reference", f"turns[{i}].reference")
    if not any(t.role is Role.SUPPORTER for t in req.turns):
        raise InvalidArgument("the dialogue has no supporter turn to score", "turns")
    if not 0 <= req.options.timeout_ms <= limits.max_timeout_ms:
        raise InvalidArgument(f"timeout_ms {req.options.timeout_ms} outside 0..{limits.max_timeout_ms}",
                              "options.timeout_ms")


def _turn_error(t: DialogueTurn, i: int, mode: JudgeMode, core: RewardCore) -> ErrorInfo | None:
    """What keeps one supporter turn from being judged (the others still are), or None."""
    if mode not in core.modes:
        return InvalidArgument(f"this turn has no CER tags, so it is judged in mode 'reply', which judge template "
                               f"{core.template.version} has no round for", f"turns[{i}].text").info()
    if t.reference is not None:
        if not t.reference.strip():
            return InvalidArgument("reference must not be empty (omit it or send null)", f"turns[{i}].reference").info()
        if len(t.reference) > core.config.limits.max_text_chars:
            return InvalidArgument(f"{len(t.reference)} characters exceed the limit of "
                                   f"{core.config.limits.max_text_chars}", f"turns[{i}].reference").info()
    elif mode.judges_preference:
        return InvalidArgument(f"a reference reply is required for a CER turn in mode {mode.value!r} (its preference "
                               "round compares the turn's reply with it); add one or use mode 'prm'",
                               f"turns[{i}].reference").info()
    return None


def aggregate(results: list[TurnResult]) -> DialogueAggregate:
    """The dialogue's aggregate over its supporter turns' results."""
    ok = [t for t in results if t.result.status is Status.OK and t.result.rewards.total is not None]
    totals = [t.result.rewards.total for t in ok if t.result.rewards.total is not None]
    values: dict[str, list[float]] = {c: [] for c in AGGREGATE_COMPONENTS}
    for t in ok:
        r = t.result.rewards
        for c, v in zip(STEP_COMPONENTS, r.steps):
            if v is not None:
                values[c].append(v)
        for c, v in (("preference", r.preference), ("format", r.format), ("reply", r.reply)):
            if v is not None:
                values[c].append(v)
    by_mode: dict[str, ModeAggregate] = {}
    for m in dict.fromkeys(t.mode for t in results):
        mt = [t.result.rewards.total for t in ok if t.mode is m and t.result.rewards.total is not None]
        by_mode[m.value] = ModeAggregate(len(mt), statistics.fmean(mt) if mt else None, min(mt) if mt else None)
    return DialogueAggregate(
        turns=len(results), scorable=sum(1 for t in results if t.result.status is not Status.INVALID_INPUT),
        scored=len(ok), mean_total=statistics.fmean(totals) if totals else None,
        min_total=min(totals) if totals else None,
        components={c: statistics.fmean(v) for c, v in values.items() if v}, by_mode=by_mode)


async def score_dialogue(core: RewardCore, req: DialogueRequest, timeout_s: float | None = None) -> DialogueResponse:
    """Score every supporter turn of a dialogue. Raises :class:`ServiceError` for dialogue-level failures (bad input,
    not ready, deadline); a turn that cannot be judged gets its own ``invalid_input`` result."""
    core.check_ready()
    cer_mode = req.options.mode or core.config.default_mode
    check_mode(cer_mode, core.modes, "options.mode")
    validate_dialogue(req, core.config.limits)
    timeout = core.timeout_for(req.options.timeout_ms, timeout_s)
    return await core.bounded(_score(core, req, cer_mode), timeout, "options.timeout_ms")


async def _score(core: RewardCore, req: DialogueRequest, cer_mode: JudgeMode) -> DialogueResponse:
    t0 = time.perf_counter()
    history: list[Turn] = []
    plans: list[tuple[int, JudgeMode, GroupRequest | ErrorInfo]] = []
    for i, t in enumerate(req.turns):
        if t.role is Role.SUPPORTER:
            mode = turn_mode(t.text, cer_mode)
            err = _turn_error(t, i, mode, core)
            o = req.options
            plans.append((i, mode, err or GroupRequest(
                history=list(history), reference=t.reference if mode.judges_preference else None,
                candidates=[t.text], options=ScoreOptions(mode=mode, include_judgment=o.include_judgment,
                                                          include_similarity=o.include_similarity))))
        history.append(Turn(t.role, t.text if t.role is Role.SEEKER else reply_text(t.text, parse(t.text))))

    async def one(mode: JudgeMode, g: GroupRequest | ErrorInfo) -> GroupResponse | ErrorInfo:
        return g if isinstance(g, ErrorInfo) else await core.score_validated(g, mode)

    outcomes = await asyncio.gather(*(one(mode, g) for _, mode, g in plans))
    results: list[TurnResult] = []
    meta = core.meta(cer_mode)
    for (i, mode, _), out in zip(plans, outcomes):
        if isinstance(out, ErrorInfo):
            results.append(TurnResult(i, mode, invalid_result(mode, out)))
            continue
        results.append(TurnResult(i, mode, out.results[0]))
        meta.queue_ms = max(meta.queue_ms, out.meta.queue_ms)
        meta.cache_hits += out.meta.cache_hits
        meta.judge_rounds += out.meta.judge_rounds
    meta.inference_ms = (time.perf_counter() - t0) * 1000 - meta.queue_ms
    return DialogueResponse(turns=results, aggregate=aggregate(results), meta=meta)
