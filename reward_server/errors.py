"""Domain errors and the ONE table mapping each code (:class:`ErrorCode`, ``reward_server/error_codes.py``) to an
HTTP status and a gRPC status code; the gRPC trailing metadata of a failed call, built once for every front."""

from __future__ import annotations

import grpc

from reward_server.error_codes import ERROR_CODE_KEY, ERROR_FIELD_KEY, ErrorCode
from reward_server.types import ErrorInfo

__all__ = ["ERROR_TABLE", "RETRY_AFTER_KEY", "BodyTooLarge", "DeadlineExceeded", "ErrorCode", "Internal",
           "InvalidArgument", "NotReady", "Overloaded", "ServiceError", "Unauthenticated", "Unscored",
           "code_for_grpc_status", "grpc_trailers"]

#: gRPC trailing-metadata key of the retry hint sent with a RESOURCE_EXHAUSTED from load shedding (milliseconds);
#: its presence tells shedding apart from the transport's own RESOURCE_EXHAUSTED (a message over the size limit).
RETRY_AFTER_KEY = "compeer-retry-after-ms"


#: code -> (HTTP status, gRPC status). Both fronts read this table and nothing else.
ERROR_TABLE: dict[ErrorCode, tuple[int, grpc.StatusCode]] = {
    ErrorCode.INVALID_ARGUMENT: (422, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.UNAVAILABLE: (503, grpc.StatusCode.UNAVAILABLE),
    ErrorCode.DEADLINE_EXCEEDED: (504, grpc.StatusCode.DEADLINE_EXCEEDED),
    ErrorCode.RESOURCE_EXHAUSTED: (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ErrorCode.INTERNAL: (500, grpc.StatusCode.INTERNAL),
    # a batch in a protocol whose reply has no room for a missing score (POST /get_reward) held an item the judge did
    # not score (parse failure, timeout, engine error) and no failure reward is configured
    ErrorCode.UNSCORED: (502, grpc.StatusCode.UNKNOWN),
    ErrorCode.UNAUTHENTICATED: (401, grpc.StatusCode.UNAUTHENTICATED),
}
#: gRPC status -> code, for a client that has only the status (a call that failed as a whole); UNSCORED is
#: HTTP-only, and gRPC's UNKNOWN says nothing of which error it was
_BY_GRPC_STATUS: dict[grpc.StatusCode, ErrorCode] = {
    status: code for code, (_, status) in ERROR_TABLE.items() if code is not ErrorCode.UNSCORED}


def code_for_grpc_status(status: grpc.StatusCode) -> ErrorCode | None:
    """The code a gRPC status stands for in :data:`ERROR_TABLE`; None for a status no front sends for a domain
    error (e.g. CANCELLED, UNIMPLEMENTED, UNKNOWN)."""
    return _BY_GRPC_STATUS.get(status)


class ServiceError(Exception):
    """An error the service reports to its caller, with the field it concerns."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def info(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, field=self.field, message=self.message)

    @property
    def http_status(self) -> int:
        return ERROR_TABLE[self.code][0]

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return ERROR_TABLE[self.code][1]


class InvalidArgument(ServiceError):
    """Bad input: names the field and the limit it broke."""

    code = ErrorCode.INVALID_ARGUMENT


class NotReady(ServiceError):
    """The engine is not loaded (yet) or has died."""

    code = ErrorCode.UNAVAILABLE


class BodyTooLarge(InvalidArgument):
    """An HTTP body over ``max_body_bytes``: a client's mistake answered 413 before the body is parsed (over gRPC,
    the transport itself refuses a message over the same bound with RESOURCE_EXHAUSTED)."""

    @property
    def http_status(self) -> int:
        return 413


class DeadlineExceeded(ServiceError):
    """The request's deadline passed; its engine work was cancelled."""

    code = ErrorCode.DEADLINE_EXCEEDED


class Overloaded(ServiceError):
    """Too many groups in flight and waiting: refused at once, with a hint of when to retry (seconds)."""

    code = ErrorCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, field: str = "", retry_after_s: float = 1.0) -> None:
        super().__init__(message, field)
        self.retry_after_s = retry_after_s


class Unscored(ServiceError):
    """An item of a batch was not scored and the protocol cannot say so per item (``/get_reward``)."""

    code = ErrorCode.UNSCORED


class Internal(ServiceError):
    """A bug or an unexpected engine failure."""

    code = ErrorCode.INTERNAL


class Unauthenticated(ServiceError):
    """No bearer token, or one the server does not accept (``reward_server.auth``)."""

    code = ErrorCode.UNAUTHENTICATED


def grpc_trailers(exc: ServiceError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a call that failed with ``exc``: its code and field, and the retry hint of a call
    shed for load (milliseconds; its presence tells shedding apart from the transport's own RESOURCE_EXHAUSTED)."""
    retry = ((RETRY_AFTER_KEY, str(round(exc.retry_after_s * 1000))),) if isinstance(exc, Overloaded) else ()
    return ((ERROR_CODE_KEY, exc.code.value), (ERROR_FIELD_KEY, exc.field), *retry)
