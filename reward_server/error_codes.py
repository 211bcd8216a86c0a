"""The service's error codes: one enum for both fronts and every client that reads them.

A code travels as its string value, unchanged: the ``code`` of an HTTP error body ``{"error": {"code", "field",
"message"}}``, the ``code`` of a ``ScoreBatch`` group's ``Error`` message and the gRPC trailing metadata
``compeer-error-code``. What each code maps to (an HTTP status and a gRPC status code) is the ONE table in
``reward_server/errors.py``.

This module imports nothing but the standard library, so that the trainer-side HTTP client
(``reward_server/trainer_http.py``, loaded by path in a trainer's workers without compeer installed) reads the codes
with the same enum: it loads this file from beside it the same way.
"""

from __future__ import annotations

import enum

__all__ = ["ERROR_CODE_KEY", "ERROR_FIELD_KEY", "ErrorCode", "parse_code"]

#: gRPC trailing-metadata keys of a failed call's code and field (the HTTP body carries both in ``error``)
ERROR_CODE_KEY = "compeer-error-code"
ERROR_FIELD_KEY = "compeer-error-field"


class ErrorCode(enum.StrEnum):
    """A domain error's code; the value is the wire string (``str(code)``, f-strings and JSON give it as is)."""

    #: bad input: ``field`` names the path, the message the limit
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    #: the engine is not loaded (yet) or has died; a group a batch could not run for it
    UNAVAILABLE = "UNAVAILABLE"
    #: the request's deadline (or the per-candidate limit) passed; its engine work was cancelled
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    #: load shedding: the admission queue is full (with a retry hint)
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    #: a bug or an unexpected engine failure
    INTERNAL = "INTERNAL"
    #: ``/get_reward``: an item was not scored and the protocol cannot say so per item
    UNSCORED = "UNSCORED"
    #: authentication is on and the call has no accepted bearer token
    UNAUTHENTICATED = "UNAUTHENTICATED"


def parse_code(value: object) -> ErrorCode | None:
    """The member whose wire string is ``value``; None for anything else (absent, or a code this client does not
    know, e.g. from a newer server: the caller keeps the raw text in its message)."""
    if not isinstance(value, str):
        return None
    try:
        return ErrorCode(value)
    except ValueError:
        return None
