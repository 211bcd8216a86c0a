"""JSON -> neutral request types, with errors that name the field (responses use the types' ``to_json``)."""

from __future__ import annotations

from typing import Any

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from reward_server.errors import InvalidArgument
from reward_server.types import ErrorInfo, GroupRequest, ScoreOptions

_ROLES = ", ".join(r.value for r in Role)
_MODES = ", ".join(m.value for m in JudgeMode)


def _expect(value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(f"expected {what}", field)
    return value


def group_from_json(data: Any, prefix: str = "") -> GroupRequest:
    """Parse one group (the body of ``POST /v1/score`` or an entry of ``groups``)."""
    _expect(data, dict, prefix.rstrip(".") or "body", "a JSON object")
    unknown = set(data) - {"history", "reference", "candidates", "options"}
    if unknown:
        raise InvalidArgument(f"unknown field(s) {sorted(unknown)}", f"{prefix}{min(unknown)}")
    history = []
    for i, t in enumerate(_expect(data.get("history", []), list, f"{prefix}history", "a list of turns")):
        f = f"{prefix}history[{i}]"
        _expect(t, dict, f, 'an object {"role": ..., "text": ...}')
        role = t.get("role")
        if role not in {r.value for r in Role}:
            raise InvalidArgument(f"role must be one of {_ROLES} (got {role!r})", f"{f}.role")
        history.append(Turn(Role(role), _expect(t.get("text"), str, f"{f}.text", "a string")))
    reference = data.get("reference")
    if reference is not None:
        _expect(reference, str, f"{prefix}reference", "a string or null")
    if "candidates" not in data:
        raise InvalidArgument("candidates is required (a list of CER output strings)", f"{prefix}candidates")
    candidates = _expect(data["candidates"], list, f"{prefix}candidates", "a list of strings")
    for i, c in enumerate(candidates):
        _expect(c, str, f"{prefix}candidates[{i}]", "a string")
    return GroupRequest(history=history, reference=reference, candidates=list(candidates),
                        options=options_from_json(data.get("options"), f"{prefix}options"))


def options_from_json(data: Any, field: str) -> ScoreOptions:
    if data is None:
        return ScoreOptions()
    _expect(data, dict, field, "an object")
    unknown = set(data) - {"mode", "include_judgment", "include_similarity", "timeout_ms"}
    if unknown:
        raise InvalidArgument(f"unknown option(s) {sorted(unknown)}", f"{field}.{min(unknown)}")
    mode = data.get("mode")
    if mode is not None and mode not in {m.value for m in JudgeMode}:
        raise InvalidArgument(f"mode must be one of {_MODES} (got {mode!r})", f"{field}.mode")
    return ScoreOptions(
        mode=JudgeMode(mode) if mode is not None else None,
        include_judgment=_expect(data.get("include_judgment", False), bool, f"{field}.include_judgment", "a boolean"),
        include_similarity=_expect(data.get("include_similarity", True), bool, f"{field}.include_similarity",
                                   "a boolean"),
        timeout_ms=_expect(data.get("timeout_ms", 0), int, f"{field}.timeout_ms", "an integer (milliseconds)"),
    )


def batch_from_json(data: Any) -> list[GroupRequest | ErrorInfo]:
    """Parse the body of ``POST /v1/score:batch``: ``{"groups": [group, ...]}``.

    A malformed group becomes its own error entry; the other groups are still scored.
    """
    _expect(data, dict, "body", 'a JSON object {"groups": [...]}')
    groups = _expect(data.get("groups"), list, "groups", "a list of groups")
    out: list[GroupRequest | ErrorInfo] = []
    for i, g in enumerate(groups):
        try:
            out.append(group_from_json(g, f"groups[{i}]."))
        except InvalidArgument as exc:
            out.append(exc.info())
    return out
