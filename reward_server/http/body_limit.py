"""The HTTP request-size limit, as ASGI middleware: a body over ``max_body_bytes`` is answered 413 before it is
parsed. A declared ``Content-Length`` over the limit is refused before a byte of the body is read; a chunked (or
lying) body is counted as it streams in and refused as soon as the count passes the limit, so the server never
holds more than the limit of one request in memory."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reward_server.errors import BodyTooLarge


def too_large(size: str, limit: int) -> BodyTooLarge:
    """The error for a body of ``size`` (a number, or 'more than N') bytes over ``limit``."""
    return BodyTooLarge(f"the request body is {size} bytes; the limit is {limit} bytes (--max-body-bytes): split "
                        "the batch", "body")


class BodyLimit:
    """Refuse HTTP bodies larger than ``max_bytes`` with 413 and the usual error shape (field ``body``)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await _reply(too_large(str(declared), self.max_bytes), scope, receive, send)
                    return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # raised into the handler's body read: the handler answers it like any other service error
                    raise too_large(f"more than {self.max_bytes}", self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as exc:  # raised where no handler caught it (a route that reads the body itself)
            if started:
                raise
            await _reply(exc, scope, receive, send)


async def _reply(exc: BodyTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    body: dict[str, Any] = {"error": exc.info().to_json()}
    # Connection: close — the unread rest of the body must not be taken for the next request
    await JSONResponse(body, status_code=exc.http_status, headers={"Connection": "close"})(scope, receive, send)
