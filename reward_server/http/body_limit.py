"""The HTTP request-size limit, as ASGI middleware: a body over ``max_body_bytes`` is answered 413 before it is
parsed. A declared ``Content-Length`` over the limit is refused before a byte of the body is kept; a chunked (or
lying) body is counted as it streams in and refused as soon as the count passes the limit, so the server never
holds more than the limit of one request in memory.

So that the client reads the 413: a client that asked first (``Expect: 100-continue``) is answered before it sends
the body; any other is still sending it, and a server that closes the connection with the body unread makes the
kernel reset it, which discards the answer on the client's side. The rest of such a body is therefore read and
thrown away before the answer, up to :data:`DRAIN_MAX_BYTES` in all and :data:`DRAIN_MAX_S` seconds (past either,
the connection is closed at once, as before).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reward_server.errors import BodyTooLarge

#: the most bytes of a refused body read (and discarded) so the client can read the 413: the limit or 64 MiB,
#: whichever is more (loopback or a LAN reads 64 MiB in well under a second)
DRAIN_MAX_BYTES = 64 * 1024 * 1024
#: the longest a refused body is read for (a slow sender is cut off after it)
DRAIN_MAX_S = 10.0


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
        headers = dict(scope.get("headers", []))
        # the client waits for "100 Continue" before sending; the server sends it only when the body is read
        expects = headers.get(b"expect", b"").lower() == b"100-continue"
        drain_bytes = max(self.max_bytes, DRAIN_MAX_BYTES)
        try:
            declared = int(headers.get(b"content-length", b"-1"))
        except ValueError:
            declared = -1
        if declared > self.max_bytes:
            if not expects and declared <= drain_bytes:
                await drain(receive, drain_bytes)
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
                    if message.get("more_body", False):
                        await drain(receive, drain_bytes - seen)
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


async def drain(receive: Receive, budget: int) -> bool:
    """Read and discard the rest of a request body, at most ``budget`` bytes and :data:`DRAIN_MAX_S` seconds; True
    when it was read to its end (the connection is then clean for the answer)."""
    try:
        async with asyncio.timeout(DRAIN_MAX_S):
            while budget >= 0:
                message = await receive()
                if message["type"] != "http.request":
                    return False  # the client went away
                budget -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return budget >= 0
    except TimeoutError:
        pass
    return False


async def _reply(exc: BodyTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    body: dict[str, Any] = {"error": exc.info().to_json()}
    # Connection: close — the unread rest of the body must not be taken for the next request
    await JSONResponse(body, status_code=exc.http_status, headers={"Connection": "close"})(scope, receive, send)
