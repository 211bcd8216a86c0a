"""The body-size limit on a real socket (uvicorn, FAKE engine): a client that keeps sending a body over
``max_body_bytes`` reads the 413 and its error body instead of a connection reset; a client that asks first
(``Expect: 100-continue``) is answered 413 without sending the body."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from reward_server.http.app import create_app
from tests.conftest import free_port
from tests.unit.test_reward_service import GOOD, Service, body, make_service

LIMIT = 64 * 1024
#: large enough that the server's unread rest would not fit the kernel's socket buffers (the reset case)
BIG = 8 * 1024 * 1024


async def _served() -> AsyncIterator[tuple[Service, int]]:
    async for s in make_service(server={"max_body_bytes": LIMIT}):
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(s.core), host="127.0.0.1", port=port, log_level="warning",
                                               lifespan="off", access_log=False))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.02)
            yield s, port
        finally:
            server.should_exit = True
            await task


def _post(port: int, path: str, payload: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """A plain blocking client that sends the whole body before it reads the answer (as most clients do)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=payload, headers={"content-type": "application/json", **headers})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _chunks(payload: bytes, size: int = 64 * 1024) -> Any:
    for i in range(0, len(payload), size):
        yield payload[i:i + size]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_client_sending_a_body_over_the_limit_reads_the_413(framing: str) -> None:
    payload = json.dumps({"groups": [body([GOOD + " " * 1000])] * (BIG // 1400)}).encode()
    assert len(payload) > BIG
    async for s, port in _served():
        for _ in range(3):  # a reset is a race: repeat
            if framing == "chunked":  # no Content-Length: counted as it streams, refused past the limit
                # (http.client sends an iterable body chunked, with no Content-Length)
                status, answer = await asyncio.to_thread(_post, port, "/v1/score:batch", _chunks(payload), {})
            else:
                status, answer = await asyncio.to_thread(_post, port, "/v1/score:batch", payload, {})
            assert status == 413, answer
            assert answer["error"]["field"] == "body" and str(LIMIT) in answer["error"]["message"]
        assert s.engine.calls == []
        status, answer = await asyncio.to_thread(_post, port, "/v1/score", json.dumps(body([GOOD])).encode(), {})
        assert status == 200 and answer["results"][0]["status"] == "ok"


async def test_expect_100_continue_is_answered_413_before_the_body_is_sent() -> None:
    async for _s, port in _served():

        def ask(port: int) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(f"POST /v1/score:batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {BIG}\r\nExpect: 100-continue\r\n\r\n".encode())
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
                return answer

        answer = await asyncio.to_thread(ask, port)
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head  # no "100 Continue": the body is never asked for
        assert json.loads(rest)["error"]["field"] == "body"
