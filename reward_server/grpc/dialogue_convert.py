"""Protobuf <-> neutral types of ``ScoreDialogue``, both directions (server and client each use one half)."""

from __future__ import annotations

from cer.modes import JudgeMode
from reward_server.errors import InvalidArgument
from reward_server.grpc.convert import (
    _MODE,
    _MODE_BACK,
    _ROLE,
    _ROLE_BACK,
    candidate_from_pb,
    candidate_to_pb,
    meta_from_pb,
    meta_to_pb,
    options_from_pb,
    options_to_pb,
)
from reward_server.proto import pb
from reward_server.types import (
    DialogueAggregate,
    DialogueRequest,
    DialogueResponse,
    DialogueTurn,
    ModeAggregate,
    TurnResult,
)


def dialogue_request_to_pb(req: DialogueRequest) -> pb.ScoreDialogueRequest:
    turns = []
    for t in req.turns:
        msg = pb.DialogueTurn(role=_ROLE[t.role], text=t.text)
        if t.reference is not None:
            msg.reference = t.reference
        turns.append(msg)
    return pb.ScoreDialogueRequest(turns=turns, options=options_to_pb(req.options))


def dialogue_request_from_pb(msg: pb.ScoreDialogueRequest) -> DialogueRequest:
    """Raises :class:`InvalidArgument` naming the field for an unset role or an unknown mode."""
    turns = []
    for i, t in enumerate(msg.turns):
        if t.role not in _ROLE_BACK:
            raise InvalidArgument(f"role must be ROLE_SEEKER or ROLE_SUPPORTER (got {t.role})", f"turns[{i}].role")
        turns.append(DialogueTurn(_ROLE_BACK[t.role], t.text, t.reference if t.HasField("reference") else None))
    return DialogueRequest(turns=turns, options=options_from_pb(msg.options, "options"))


def _opt_set(msg: object, name: str, value: float | None) -> None:
    if value is not None:
        setattr(msg, name, value)


def dialogue_response_to_pb(r: DialogueResponse) -> pb.ScoreDialogueResponse:
    a = r.aggregate
    agg = pb.DialogueAggregate(turns=a.turns, scorable=a.scorable, scored=a.scored, components=a.components)
    _opt_set(agg, "mean_total", a.mean_total)
    _opt_set(agg, "min_total", a.min_total)
    for mode, m in a.by_mode.items():
        ma = pb.ModeAggregate(mode=_MODE[JudgeMode(mode)], scored=m.scored)
        _opt_set(ma, "mean_total", m.mean_total)
        _opt_set(ma, "min_total", m.min_total)
        agg.by_mode.append(ma)
    return pb.ScoreDialogueResponse(
        turns=[pb.TurnResult(index=t.index, mode=_MODE[t.mode], result=candidate_to_pb(t.result)) for t in r.turns],
        aggregate=agg, meta=meta_to_pb(r.meta))


def dialogue_response_from_pb(m: pb.ScoreDialogueResponse) -> DialogueResponse:
    a = m.aggregate

    def opt(msg: object, name: str) -> float | None:
        return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]

    agg = DialogueAggregate(
        turns=a.turns, scorable=a.scorable, scored=a.scored, mean_total=opt(a, "mean_total"),
        min_total=opt(a, "min_total"), components=dict(a.components),
        by_mode={_MODE_BACK[x.mode].value: ModeAggregate(x.scored, opt(x, "mean_total"), opt(x, "min_total"))
                 for x in a.by_mode})
    return DialogueResponse(turns=[TurnResult(t.index, _MODE_BACK[t.mode], candidate_from_pb(t.result))
                                   for t in m.turns], aggregate=agg, meta=meta_from_pb(m.meta))
