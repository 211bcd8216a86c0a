"""JSON -> neutral request types through the pydantic contract (``http/models.py``), with errors that name the
field path; responses use the neutral types' ``to_json``.

A pydantic validation error becomes the service's one error shape: :class:`InvalidArgument` with the first
error's field path (``groups[2].history[0].role``) and a message saying what was expected and what came.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from cer.dialogue import Turn
from cer.modes import JudgeMode
from reward_server.errors import InvalidArgument
from reward_server.http import models
from reward_server.types import ErrorInfo, GroupRequest, ScoreOptions

M = TypeVar("M", bound=BaseModel)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def field_path(loc: Sequence[int | str], prefix: str = "") -> str:
    """``("history", 0, "role")`` -> ``history[0].role`` (after ``prefix``, e.g. ``groups[2].``)."""
    out = prefix.rstrip(".")
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "body"


def invalid_argument(exc: ValidationError | Sequence[Any], prefix: str = "") -> InvalidArgument:
    """The first error of a pydantic (or FastAPI request) validation as the service's InvalidArgument."""
    errors = exc.errors() if isinstance(exc, ValidationError) else exc
    err = errors[0]
    field = field_path(err["loc"], prefix)
    kind = err["type"]
    if kind == "missing":
        message = f"{field} is required"
    elif kind == "extra_forbidden":
        message = "unknown field (see /openapi.json for the request schema)"
    elif kind == "value_error":  # the contract's own checks (http/models.py) word their message
        message = str(err.get("ctx", {}).get("error", err["msg"]))
    elif kind == "json_invalid":
        message = f"the body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}"
    else:
        got = err.get("input")
        shown = repr(got) if kind in ("enum", "literal_error") and isinstance(got, str) and len(got) <= 40 else None
        message = f"{err['msg']} (got {shown or _json_type(got)})"
    return InvalidArgument(message, field)


def parse_json(model: type[M], data: Any, prefix: str = "") -> M:
    """Validate a JSON object into ``model``; the first problem becomes an InvalidArgument naming its field path."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"expected a JSON object (got {_json_type(data)})", prefix.rstrip(".") or "body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_argument(exc, prefix) from None


def options_to_neutral(o: models.ScoreOptions | None) -> ScoreOptions:
    """Validated request options (absent: the defaults) as the core's :class:`ScoreOptions`."""
    o = o or models.ScoreOptions()
    return ScoreOptions(mode=None if o.mode is None else JudgeMode(o.mode), include_judgment=o.include_judgment,
                        include_similarity=o.include_similarity, timeout_ms=o.timeout_ms)


def group_to_neutral(g: models.ScoreGroupRequest) -> GroupRequest:
    """A validated request model as the core's :class:`GroupRequest`."""
    return GroupRequest(history=[Turn(t.role, t.text) for t in g.history], reference=g.reference,
                        candidates=list(g.candidates), options=options_to_neutral(g.options))


def group_from_json(data: Any, prefix: str = "") -> GroupRequest:
    """Parse one group (the body of ``POST /v1/score`` or an entry of ``groups``)."""
    return group_to_neutral(parse_json(models.ScoreGroupRequest, data, prefix))


def batch_from_json(data: Any) -> list[GroupRequest | ErrorInfo]:
    """Parse the body of ``POST /v1/score:batch``: ``{"groups": [group, ...]}``.

    Each group is validated on its own: a malformed group becomes its own error entry; the others are scored.
    """
    if not isinstance(data, dict):
        raise InvalidArgument(f'expected a JSON object {{"groups": [...]}} (got {_json_type(data)})', "body")
    unknown = sorted(set(data) - set(models.ScoreBatchRequest.model_fields))
    if unknown:
        raise InvalidArgument("unknown field (see /openapi.json for the request schema)", unknown[0])
    groups = data.get("groups")
    if not isinstance(groups, list):
        raise InvalidArgument(f"expected a list of groups (got {_json_type(groups)})", "groups")
    out: list[GroupRequest | ErrorInfo] = []
    for i, g in enumerate(groups):
        try:
            out.append(group_from_json(g, f"groups[{i}]."))
        except InvalidArgument as exc:
            out.append(exc.info())
    return out
