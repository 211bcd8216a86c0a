"""Protobuf <-> neutral types, both directions (the server and the client each use one half of each pair)."""

from __future__ import annotations

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.verdicts import Preference
from judge.calibration import VerdictTemperature
from reward_server.error_codes import ErrorCode, parse_code
from reward_server.errors import InvalidArgument
from reward_server.proto import pb
from reward_server.types import (
    CandidateResult,
    ErrorInfo,
    FormatResult,
    GroupMeta,
    GroupRequest,
    GroupResponse,
    InfoResponse,
    Limits,
    PreferenceResult,
    Rewards,
    SamplingInfo,
    ScoreOptions,
    Similarity,
    Status,
    StepResult,
)

_ROLE = {Role.SEEKER: pb.ROLE_SEEKER, Role.SUPPORTER: pb.ROLE_SUPPORTER}
_ROLE_BACK = {v: k for k, v in _ROLE.items()}
_MODE = {JudgeMode.UNIFIED: pb.JUDGE_MODE_UNIFIED, JudgeMode.SINGLE_PASS: pb.JUDGE_MODE_SINGLE_PASS,
         JudgeMode.PRM: pb.JUDGE_MODE_PRM, JudgeMode.ORM: pb.JUDGE_MODE_ORM, JudgeMode.REPLY: pb.JUDGE_MODE_REPLY}
_MODE_BACK = {v: k for k, v in _MODE.items()}
_STATUS = {Status.OK: pb.STATUS_OK, Status.PARSE_FAILED: pb.STATUS_PARSE_FAILED, Status.TIMEOUT: pb.STATUS_TIMEOUT,
           Status.INVALID_INPUT: pb.STATUS_INVALID_INPUT, Status.ENGINE_ERROR: pb.STATUS_ENGINE_ERROR}
_STATUS_BACK = {v: k for k, v in _STATUS.items()}
_PREF = {Preference.FIRST: pb.PREFERENCE_VERDICT_FIRST, Preference.SECOND: pb.PREFERENCE_VERDICT_SECOND,
         Preference.BOTH_GOOD: pb.PREFERENCE_VERDICT_BOTH_GOOD, Preference.NEITHER: pb.PREFERENCE_VERDICT_NEITHER}
_PREF_BACK = {v: k for k, v in _PREF.items()}


# ---- requests -------------------------------------------------------------------------------------------------
def options_to_pb(o: ScoreOptions) -> pb.ScoreOptions:
    return pb.ScoreOptions(mode=_MODE[o.mode] if o.mode else pb.JUDGE_MODE_UNSPECIFIED,
                           include_judgment=o.include_judgment, include_similarity=o.include_similarity,
                           timeout_ms=o.timeout_ms)


def options_from_pb(o: pb.ScoreOptions, field: str) -> ScoreOptions:
    """Raises :class:`InvalidArgument` for an unknown mode."""
    if o.mode != pb.JUDGE_MODE_UNSPECIFIED and o.mode not in _MODE_BACK:
        raise InvalidArgument(f"unknown judge mode {o.mode}", f"{field}.mode")
    return ScoreOptions(mode=_MODE_BACK.get(o.mode), include_judgment=o.include_judgment,
                        include_similarity=o.include_similarity if o.HasField("include_similarity") else True,
                        timeout_ms=o.timeout_ms)


def group_request_to_pb(req: GroupRequest) -> pb.ScoreGroupRequest:
    msg = pb.ScoreGroupRequest(history=[pb.Turn(role=_ROLE[t.role], text=t.text) for t in req.history],
                               candidates=list(req.candidates), options=options_to_pb(req.options))
    if req.reference is not None:
        msg.reference = req.reference
    return msg


def group_request_from_pb(msg: pb.ScoreGroupRequest, prefix: str = "") -> GroupRequest:
    """Raises :class:`InvalidArgument` naming the field for an unset role or an unknown mode."""
    history = []
    for i, t in enumerate(msg.history):
        if t.role not in _ROLE_BACK:
            raise InvalidArgument(f"role must be ROLE_SEEKER or ROLE_SUPPORTER (got {t.role})",
                                  f"{prefix}history[{i}].role")
        history.append(Turn(_ROLE_BACK[t.role], t.text))
    return GroupRequest(history=history, reference=msg.reference if msg.HasField("reference") else None,
                        candidates=list(msg.candidates), options=options_from_pb(msg.options, f"{prefix}options"))


# ---- responses ------------------------------------------------------------------------------------------------
def error_to_pb(err: ErrorInfo) -> pb.Error:
    return pb.Error(code=err.code.value, field=err.field, message=err.message)


def error_from_pb(msg: pb.Error) -> ErrorInfo:
    """A group's error as the client reads it; a code it does not know (a newer server's) is INTERNAL, with the
    code the server sent kept at the head of the message."""
    code = parse_code(msg.code)
    if code is None:
        return ErrorInfo(code=ErrorCode.INTERNAL, field=msg.field, message=f"{msg.code}: {msg.message}")
    return ErrorInfo(code=code, field=msg.field, message=msg.message)


def _sampling_to_pb(s: SamplingInfo) -> pb.SamplingParams:
    msg = pb.SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                            max_retries=s.max_retries, constrained=s.constrained)
    if s.seed is not None:
        msg.seed = s.seed
    return msg


def _sampling_from_pb(m: pb.SamplingParams) -> SamplingInfo:
    return SamplingInfo(temperature=m.temperature, top_p=m.top_p, max_tokens=m.max_tokens,
                        seed=m.seed if m.HasField("seed") else None, max_retries=m.max_retries,
                        constrained=m.constrained)


def _opt(value: float | None) -> pb.OptionalDouble:
    return pb.OptionalDouble() if value is None else pb.OptionalDouble(value=value)


def _step_to_pb(s: StepResult) -> pb.StepResult:
    msg = pb.StepResult(valid=s.valid, judged=s.judged)
    if s.verdict is not None:
        msg.verdict = s.verdict
    if s.p_true is not None:
        msg.p_true = s.p_true
    return msg


def _step_from_pb(s: pb.StepResult) -> StepResult:
    return StepResult(verdict=s.verdict if s.HasField("verdict") else None, valid=s.valid, judged=s.judged,
                      p_true=s.p_true if s.HasField("p_true") else None)


def _rewards_to_pb(r: Rewards) -> pb.Rewards:
    msg = pb.Rewards(steps=[_opt(v) for v in r.steps])
    for name in ("preference", "format", "total", "reply"):
        value = getattr(r, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def _rewards_from_pb(m: pb.Rewards) -> Rewards:
    def get(name: str) -> float | None:
        return float(getattr(m, name)) if m.HasField(name) else None

    return Rewards(steps=[v.value if v.HasField("value") else None for v in m.steps], preference=get("preference"),
                   format=get("format"), total=get("total"), reply=get("reply"))


def candidate_to_pb(r: CandidateResult) -> pb.CandidateResult:
    msg = pb.CandidateResult(
        status=_STATUS[r.status],
        steps=[_step_to_pb(s) for s in r.steps],
        format=pb.FormatResult(ok=r.format.ok, missing=r.format.missing),
        rewards=_rewards_to_pb(r.rewards),
        judgment=r.judgment or [],
        cache_hit=r.cache_hit,
    )
    if r.preference is not None:
        msg.preference.CopyFrom(pb.PreferenceResult(
            verdict=_PREF[r.preference.verdict] if r.preference.verdict else pb.PREFERENCE_VERDICT_UNSPECIFIED,
            valid=r.preference.valid, judged=r.preference.judged, probs=r.preference.probs or {}))
    if r.graded_rewards is not None:
        msg.graded_rewards.CopyFrom(_rewards_to_pb(r.graded_rewards))
    if r.reply is not None:
        msg.reply.CopyFrom(_step_to_pb(r.reply))
    if r.similarity is not None:
        msg.similarity.CopyFrom(pb.Similarity(s_in=r.similarity.s_in, s_hi=r.similarity.s_hi))
    if r.error is not None:
        msg.error.CopyFrom(error_to_pb(r.error))
    return msg


def candidate_from_pb(m: pb.CandidateResult, include_judgment: bool = True) -> CandidateResult:
    pref = None
    if m.HasField("preference"):
        pref = PreferenceResult(verdict=_PREF_BACK.get(m.preference.verdict), valid=m.preference.valid,
                                judged=m.preference.judged, probs=dict(m.preference.probs) or None)
    return CandidateResult(
        status=_STATUS_BACK[m.status],
        steps=[_step_from_pb(s) for s in m.steps],
        preference=pref,
        format=FormatResult(ok=m.format.ok, missing=list(m.format.missing)),
        rewards=_rewards_from_pb(m.rewards),
        graded_rewards=_rewards_from_pb(m.graded_rewards) if m.HasField("graded_rewards") else None,
        similarity=Similarity(m.similarity.s_in, m.similarity.s_hi) if m.HasField("similarity") else None,
        judgment=list(m.judgment) if m.judgment else None,
        cache_hit=m.cache_hit,
        error=error_from_pb(m.error) if m.HasField("error") else None,
        reply=_step_from_pb(m.reply) if m.HasField("reply") else None,
    )


def meta_to_pb(meta: GroupMeta) -> pb.Meta:
    msg = pb.Meta(model=meta.model, revision=meta.revision, template_version=meta.template_version,
                  sampling=_sampling_to_pb(meta.sampling), queue_ms=meta.queue_ms, inference_ms=meta.inference_ms,
                  cache_hits=meta.cache_hits, mode=_MODE[meta.mode], judge_rounds=meta.judge_rounds,
                  graded=meta.graded)
    if meta.adapter is not None:
        msg.adapter = meta.adapter
    return msg


def meta_from_pb(m: pb.Meta) -> GroupMeta:
    return GroupMeta(model=m.model, revision=m.revision, adapter=m.adapter if m.HasField("adapter") else None,
                     template_version=m.template_version, sampling=_sampling_from_pb(m.sampling),
                     mode=_MODE_BACK.get(m.mode, JudgeMode.UNIFIED), queue_ms=m.queue_ms,
                     inference_ms=m.inference_ms, cache_hits=m.cache_hits, judge_rounds=m.judge_rounds,
                     graded=m.graded)


def group_response_to_pb(r: GroupResponse) -> pb.ScoreGroupResponse:
    return pb.ScoreGroupResponse(results=[candidate_to_pb(c) for c in r.results], meta=meta_to_pb(r.meta))


def group_response_from_pb(m: pb.ScoreGroupResponse) -> GroupResponse:
    return GroupResponse(results=[candidate_from_pb(c) for c in m.results], meta=meta_from_pb(m.meta))


def batch_to_pb(outcomes: list[GroupResponse | ErrorInfo]) -> pb.ScoreBatchResponse:
    groups = []
    for o in outcomes:
        if isinstance(o, ErrorInfo):
            groups.append(pb.GroupOutcome(error=error_to_pb(o)))
        else:
            groups.append(pb.GroupOutcome(response=group_response_to_pb(o)))
    return pb.ScoreBatchResponse(groups=groups)


def batch_from_pb(m: pb.ScoreBatchResponse) -> list[GroupResponse | ErrorInfo]:
    return [error_from_pb(g.error) if g.WhichOneof("outcome") == "error" else group_response_from_pb(g.response)
            for g in m.groups]


def info_to_pb(info: InfoResponse) -> pb.InfoResponse:
    L = info.limits
    msg = pb.InfoResponse(model=info.model, revision=info.revision, backend=info.backend,
                          template_version=info.template_version, modes=[_MODE[m] for m in info.modes],
                          default_mode=_MODE[info.default_mode],
                          limits=pb.Limits(max_candidates=L.max_candidates, max_groups=L.max_groups,
                                           max_history_turns=L.max_history_turns, max_text_chars=L.max_text_chars,
                                           max_timeout_ms=L.max_timeout_ms,
                                           max_dialogue_turns=L.max_dialogue_turns, max_queries=L.max_queries),
                          sampling=_sampling_to_pb(info.sampling), version=info.version, cache=info.cache,
                          embedding_model=info.embedding_model, graded=info.graded,
                          independent_rounds=info.independent_rounds, answer_prefix=info.answer_prefix,
                          verdict_top_k=info.verdict_top_k)
    if info.verdict_temperature is not None:
        t = info.verdict_temperature
        msg.verdict_temperature.CopyFrom(pb.VerdictTemperature(step=t.step, preference=t.preference, source=t.source))
    if info.adapter is not None:
        msg.adapter = info.adapter
    return msg


def info_from_pb(m: pb.InfoResponse) -> InfoResponse:
    L = m.limits
    return InfoResponse(model=m.model, revision=m.revision, adapter=m.adapter if m.HasField("adapter") else None,
                        backend=m.backend, template_version=m.template_version,
                        modes=[_MODE_BACK[x] for x in m.modes], default_mode=_MODE_BACK[m.default_mode],
                        limits=Limits(L.max_candidates, L.max_groups, L.max_history_turns, L.max_text_chars,
                                      L.max_timeout_ms, L.max_dialogue_turns, L.max_queries),
                        sampling=_sampling_from_pb(m.sampling), version=m.version, cache=m.cache,
                        embedding_model=m.embedding_model, graded=m.graded,
                        independent_rounds=m.independent_rounds, answer_prefix=m.answer_prefix,
                        verdict_top_k=m.verdict_top_k,
                        verdict_temperature=VerdictTemperature(m.verdict_temperature.step,
                                                               m.verdict_temperature.preference,
                                                               m.verdict_temperature.source)
                        if m.HasField("verdict_temperature") else None)
