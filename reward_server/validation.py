"""Request validation: one place, used by both fronts through the core.

Group-level problems raise :class:`InvalidArgument` (the whole group is rejected); a bad candidate only gets
its own ``invalid_input`` result, so nothing else in the group or the batch is lost.
"""

from __future__ import annotations

from collections.abc import Sequence

from cer.modes import JudgeMode
from reward_server.errors import InvalidArgument
from reward_server.types import SCORE_MODES, ErrorInfo, GroupRequest, Limits


def _too_long(text: str, limits: Limits, field: str) -> InvalidArgument | None:
    if len(text) > limits.max_text_chars:
        return InvalidArgument(f"{len(text)} characters exceed the limit of {limits.max_text_chars}", field)
    return None


def check_mode(mode: JudgeMode, modes: Sequence[JudgeMode], field: str) -> None:
    """Raise InvalidArgument unless ``mode`` is one of the ``modes`` this server serves."""
    if mode not in modes:
        raise InvalidArgument(f"mode {mode.value!r} is not served by this server (its judge template has no round "
                              f"for it); use one of {', '.join(m.value for m in modes)}", field)


def validate_group(req: GroupRequest, mode: JudgeMode, limits: Limits, prefix: str = "",
                   modes: Sequence[JudgeMode] = SCORE_MODES) -> None:
    """Raise InvalidArgument (field path + limit) for problems that make the whole group unscorable."""
    check_mode(mode, modes, f"{prefix}options.mode")
    n = len(req.candidates)
    if n == 0:
        raise InvalidArgument("at least 1 candidate is required", f"{prefix}candidates")
    if n > limits.max_candidates:
        raise InvalidArgument(f"{n} candidates exceed the limit of {limits.max_candidates} per group; "
                              "split the group or raise --max-candidates", f"{prefix}candidates")
    if len(req.history) > limits.max_history_turns:
        raise InvalidArgument(f"{len(req.history)} turns exceed the limit of {limits.max_history_turns}; "
                              "truncate the oldest turns", f"{prefix}history")
    for i, t in enumerate(req.history):
        if not t.text.strip():
            raise InvalidArgument("turn text must not be empty", f"{prefix}history[{i}].text")
        if err := _too_long(t.text, limits, f"{prefix}history[{i}].text"):
            raise err
    if req.reference is None:
        if mode.judges_preference:
            raise InvalidArgument(f"a reference reply is required in mode {mode.value!r} (the preference round "
                                  "compares the candidate with it); use mode 'prm' to score without one",
                                  f"{prefix}reference")
    elif not req.reference.strip():
        raise InvalidArgument("reference must not be empty (omit it or send null)", f"{prefix}reference")
    elif err := _too_long(req.reference, limits, f"{prefix}reference"):
        raise err
    if req.options.timeout_ms < 0 or req.options.timeout_ms > limits.max_timeout_ms:
        raise InvalidArgument(f"timeout_ms {req.options.timeout_ms} outside 0..{limits.max_timeout_ms}",
                              f"{prefix}options.timeout_ms")


def candidate_error(candidate: str, index: int, limits: Limits, prefix: str = "") -> ErrorInfo | None:
    """The problem with one candidate, or None when it can be judged."""
    field = f"{prefix}candidates[{index}]"
    if not candidate.strip():
        return InvalidArgument("candidate must not be empty", field).info()
    err = _too_long(candidate, limits, field)
    return None if err is None else err.info()
