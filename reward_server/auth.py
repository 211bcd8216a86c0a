"""Bearer-token authentication: ONE check (:class:`Guard`) used by both fronts, through an ASGI middleware
(:class:`HttpAuth`, HTTP ``Authorization: Bearer <token>``) and a gRPC server interceptor (:class:`GrpcAuth`,
metadata ``authorization: Bearer <token>``).

Both refuse before anything of the request is read or parsed (no partial answer): HTTP 401 with the error shape
of every other error and ``WWW-Authenticate: Bearer``; gRPC ``UNAUTHENTICATED``. Open without a token: the probes
(``/healthz``, ``/readyz``, the gRPC health service), the API description (``/openapi.json``, ``/docs``: the
contract is public), and ``/metrics`` unless ``--auth-metrics``. Everything else, present and future, is
protected: the check sits in front of the routing, not on each handler.

Tokens are compared in constant time (SHA-256 digests, ``hmac.compare_digest`` against every accepted token) and
never logged or echoed. Several tokens may be valid at once (rotation: add the new one, move the clients, drop the
old one); the tokens file is re-read when it changes, so a rotated Kubernetes Secret takes effect without a
restart. A file that becomes unreadable or holds no valid token refuses every call (fails closed).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from reward_server.errors import Unauthenticated, grpc_trailers

if TYPE_CHECKING:
    from reward_server.config import SecuritySettings
    from reward_server.metrics import Metrics

log = logging.getLogger(__name__)
MIN_TOKEN_CHARS = 16
#: HTTP paths open without a token (the probes and the public API description).
OPEN_HTTP_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
METRICS_PATH = "/metrics"
#: gRPC services open without a token (the probes).
OPEN_GRPC_SERVICES = frozenset({"grpc.health.v1.Health"})
_SPLIT = re.compile(r"[\s,]+")


def parse_tokens(text: str, source: str) -> list[str]:
    """Tokens from a file's text or an env value: separated by whitespace or commas; ``#`` starts a comment line.

    Raises ValueError naming ``source`` (never the token) for a token shorter than :data:`MIN_TOKEN_CHARS`.
    """
    tokens: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for token in (t for t in _SPLIT.split(line) if t):
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"{source}: token {len(tokens) + 1} has {len(token)} characters; expected at least "
                                 f"{MIN_TOKEN_CHARS} (make one with `openssl rand -hex 32`)")
            tokens.append(token)
    return tokens


def load_tokens(path: str | None, inline: str | None) -> list[str]:
    """Every accepted token from the tokens file and the env value; ValueError if a source is set but none is."""
    tokens: list[str] = []
    if path:
        with open(path, encoding="utf-8") as fh:
            tokens += parse_tokens(fh.read(), f"--auth-tokens-file {path}")
    if inline:
        tokens += parse_tokens(inline, "COMPEER_AUTH_TOKENS")
    if not tokens:
        raise ValueError("authentication is on but no token was found: put at least one in --auth-tokens-file / "
                         "COMPEER_AUTH_TOKENS")
    return tokens


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class TokenSet:
    """The accepted tokens, kept as digests; the file is re-read when its modification time or size changes
    (looked at no more than every ``recheck_s``)."""

    def __init__(self, path: str | None, inline: str | None, recheck_s: float = 1.0) -> None:
        self.path = path
        self.inline = inline
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._digests: tuple[bytes, ...] = tuple(_digest(t) for t in load_tokens(path, inline))
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        """What changes when the file does: a Kubernetes Secret update swaps a symlink (a new inode)."""
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return (-1, -1, -1)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> None:
        now = time.monotonic()
        if not self.path or now < self._next_check:
            return
        with self._lock:
            self._next_check = now + self.recheck_s
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._digests = tuple(_digest(t) for t in load_tokens(self.path, self.inline))
                log.info("auth: tokens file %s re-read: %d token(s) accepted", self.path, len(self._digests))
            except (OSError, ValueError) as exc:
                self._digests = ()
                log.error("auth: tokens file %s unusable, refusing every call until it is fixed: %s", self.path,
                          exc.__class__.__name__ if isinstance(exc, OSError) else exc)

    def __len__(self) -> int:
        self._refresh()
        return len(self._digests)

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is one of the accepted tokens, in time independent of which one and of its length."""
        self._refresh()
        probe = _digest(token)
        found = False
        for digest in self._digests:  # no early exit: the time does not depend on the position
            found |= hmac.compare_digest(probe, digest)
        return found


class Guard:
    """The one authentication decision of the service, shared by both fronts.

    ``tokens`` None means authentication is off (every call passes). :meth:`check` raises :class:`Unauthenticated`
    and counts the refusal in ``compeer_auth_failures_total{transport, reason}``.
    """

    def __init__(self, tokens: TokenSet | None, *, metrics: Metrics | None = None, protect_metrics: bool = False):
        self.tokens = tokens
        self.metrics = metrics
        self.open_http_paths = OPEN_HTTP_PATHS | (frozenset() if protect_metrics else {METRICS_PATH})

    @classmethod
    def from_settings(cls, settings: SecuritySettings, metrics: Metrics | None = None) -> Guard:
        tokens = TokenSet(settings.auth_tokens_file, settings.auth_tokens) if settings.auth_enabled else None
        return cls(tokens, metrics=metrics, protect_metrics=settings.auth_metrics)

    @property
    def enabled(self) -> bool:
        return self.tokens is not None

    def check(self, transport: str, authorization: str | None) -> None:
        """Pass, or raise :class:`Unauthenticated`; ``authorization`` is the header / metadata value."""
        if self.tokens is None:
            return
        if not authorization:
            reason, message = "missing", "a bearer token is required: send `authorization: Bearer <token>`"
        else:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                reason, message = "malformed", "the authorization value is not `Bearer <token>`"
            elif self.tokens.accepts(token.strip()):
                return
            else:
                reason, message = "invalid", "the bearer token is not accepted"
        if self.metrics is not None:
            self.metrics.auth_failures.labels(transport, reason).inc()
        log.debug("auth: refused a %s call (%s token)", transport, reason)
        raise Unauthenticated(message, "authorization")


class HttpAuth:
    """ASGI middleware: every HTTP request except the open paths needs a token (before routing and body reads)."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.guard.enabled and scope["path"] not in self.guard.open_http_paths:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            try:
                self.guard.check("http", header.decode("latin-1") if header is not None else None)
            except Unauthenticated as exc:
                response = JSONResponse({"error": exc.info().to_json()}, status_code=exc.http_status,
                                        headers={"WWW-Authenticate": 'Bearer realm="compeer"'})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def protect_app(app: FastAPI, guard: Guard) -> None:
    """Put :class:`HttpAuth` in front of ``app``; with auth on, ``/openapi.json`` declares the bearer scheme (so
    ``/docs`` can send a token) on every operation but the open ones."""
    app.add_middleware(HttpAuth, guard=guard)
    if not guard.enabled:
        return
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer", "description": "a token of --auth-tokens-file / "
                                                                   "COMPEER_AUTH_TOKENS"}
            for path, operations in schema.get("paths", {}).items():
                for operation in operations.values():
                    operation["security"] = [] if path in guard.open_http_paths else [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _refusal(handler: grpc.RpcMethodHandler, exc: Unauthenticated) -> grpc.RpcMethodHandler:
    """A handler of the same shape that aborts at once; the request is never deserialized."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(exc.grpc_code, f"{exc.field}: {exc.message}", trailing_metadata=grpc_trailers(exc))

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny)
    return grpc.stream_stream_rpc_method_handler(deny)


class GrpcAuth(grpc.aio.ServerInterceptor):
    """gRPC server interceptor: every method except the open services needs a token in ``authorization``."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        service = details.method.lstrip("/").split("/", 1)[0]
        if not self.guard.enabled or service in OPEN_GRPC_SERVICES:
            return await continuation(details)
        metadata: Iterable[tuple[str, Any]] = details.invocation_metadata or ()
        value = next((v for k, v in metadata if k == "authorization"), None)
        try:
            self.guard.check("grpc", value if isinstance(value, str) else None)
        except Unauthenticated as exc:
            handler = await continuation(details)
            return _refusal(handler, exc) if handler is not None else handler
        return await continuation(details)
