"""The OpenAIEngine against an in-process fake OpenAI-compatible HTTP server, and the FakeEngine test double itself."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from judge.engines import create_engine
from judge.engines.base import EngineConfig, EngineError, GenParams, GenResult
from judge.engines.openai_engine import OpenAIEngine
from judge.engines.settings import OpenAISettings
from tests.fake_engine import FakeEngine

SECRET = "my-secret-dialogue-text"


# --------------------------------------------------------------------------- openai


class FakeOpenAIServer:
    """A tiny OpenAI-compatible server on 127.0.0.1 (random port) that records each chat request body."""

    def __init__(self, served: tuple[str, ...] = ("judge",)) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_status: int | None = None
        self.delay = 0.0
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "test"}
                                               for m in served]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail_status is not None:
                return JSONResponse({"error": {"message": f"boom: {body['messages']}", "type": "server_error"}},
                                    status_code=self.fail_status)
            logprobs = None
            if body.get("logprobs"):  # two tokens, each with its top_logprobs alternatives
                logprobs = {"content": [
                    {"token": t, "logprob": lp, "bytes": None,
                     "top_logprobs": [{"token": a, "logprob": alp, "bytes": None} for a, alp in alts]}
                    for t, lp, alts in [("Rationale: ok\nVerdict:", 0.0, [("Rationale: ok\nVerdict:", 0.0)]),
                                        (" True", -0.1, [(" True", -0.1), (" False", -2.4)])]]}
            return JSONResponse({
                "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "length", "logprobs": logprobs,
                             "message": {"role": "assistant", "content": "Rationale: ok\nVerdict: True"}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            })

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self) -> None:
        """Serve in a background thread; return once it accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "fake OpenAI server did not start"
            time.sleep(0.01)

    def close(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()


@pytest.fixture(scope="module")
def openai_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    server.start()
    yield server
    server.close()


def _oa_config(base_url: str, model_id: str = "judge", **kw: Any) -> EngineConfig:
    """An openai EngineConfig; ``kw`` are OpenAISettings fields."""
    return EngineConfig(backend="openai", model_id=model_id,
                        openai=OpenAISettings(base_url=base_url, max_retries=0, **kw))


async def test_openai_sends_sampling_and_regex(openai_server: FakeOpenAIServer) -> None:
    openai_server.fail_status = None
    engine = create_engine(_oa_config(openai_server.base_url, regex=True))
    assert isinstance(engine, OpenAIEngine) and engine.supports_regex
    await engine.start()
    try:
        messages = [{"role": "system", "content": "judge"}, {"role": "user", "content": SECRET}]
        params = GenParams(max_tokens=9, temperature=0.5, top_p=0.8, seed=7, regex=r"Verdict: (True|False)")
        result = await engine.generate(messages, params, "req-1")
    finally:
        await engine.stop()
    sent = openai_server.requests[-1]
    assert sent["model"] == "judge" and sent["messages"] == messages
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"], sent["seed"]) == (9, 0.5, 0.8, 7)
    assert sent["structured_outputs"] == {"regex": r"Verdict: (True|False)"}
    assert result == GenResult("Rationale: ok\nVerdict: True", prompt_tokens=11, output_tokens=7,
                               finish_reason="length")
    assert not engine.healthy()


async def test_openai_without_regex_support_sends_no_structured_outputs(openai_server: FakeOpenAIServer) -> None:
    openai_server.fail_status = None
    engine = OpenAIEngine(_oa_config(openai_server.base_url, model="judge", model_id="other"))
    assert not engine.supports_regex
    await engine.start()
    await engine.generate([{"role": "user", "content": "hi"}], GenParams(regex="x+"), "req-2")
    sent_so_far = len(openai_server.requests)
    with pytest.raises(EngineError, match="max_line_chars is not supported by the openai engine"):
        await engine.generate([{"role": "user", "content": "hi"}], GenParams(regex="x+", max_line_chars=9), "req-3")
    assert len(openai_server.requests) == sent_so_far  # refused before anything was sent
    await engine.stop()
    sent = openai_server.requests[-1]
    assert sent["model"] == "judge" and "structured_outputs" not in sent and "seed" not in sent


async def test_openai_logprobs_are_asked_and_read(openai_server: FakeOpenAIServer) -> None:
    openai_server.fail_status = None
    engine = OpenAIEngine(_oa_config(openai_server.base_url))
    assert engine.supports_logprobs
    await engine.start()
    try:
        result = await engine.generate([{"role": "user", "content": "hi"}], GenParams(logprobs=5), "req-lp")
        plain = await engine.generate([{"role": "user", "content": "hi"}], GenParams(), "req-nolp")
        with pytest.raises(EngineError, match="logprobs must be in 1..20"):
            await engine.generate([{"role": "user", "content": "hi"}], GenParams(logprobs=21), "req-lp21")
    finally:
        await engine.stop()
    asked, not_asked = openai_server.requests[-2:]
    assert (asked["logprobs"], asked["top_logprobs"]) == (True, 5) and "logprobs" not in not_asked
    assert result.tokens is not None and plain.tokens is None
    assert [t.token for t in result.tokens] == ["Rationale: ok\nVerdict:", " True"]
    assert result.tokens[1].top == {" True": -0.1, " False": -2.4} and result.tokens[1].logprob == -0.1
    off = OpenAIEngine(_oa_config(openai_server.base_url, logprobs=False))
    assert not off.supports_logprobs
    await off.start()
    with pytest.raises(EngineError, match="logprobs are not supported by the openai engine"):
        await off.generate([{"role": "user", "content": "hi"}], GenParams(logprobs=5), "req-off")
    await off.stop()


async def test_openai_http_error_maps_to_engine_error(openai_server: FakeOpenAIServer,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    engine = OpenAIEngine(_oa_config(openai_server.base_url))
    await engine.start()
    openai_server.fail_status = 500
    try:
        with caplog.at_level("INFO"), pytest.raises(EngineError, match="HTTP 500") as info:
            await engine.generate([{"role": "user", "content": SECRET}], GenParams(), "req-3")
    finally:
        openai_server.fail_status = None
        await engine.stop()
    assert SECRET not in str(info.value)
    assert SECRET not in caplog.text
    assert engine.queue_depth() == 0


async def test_openai_cancellation_frees_the_request(openai_server: FakeOpenAIServer) -> None:
    engine = OpenAIEngine(_oa_config(openai_server.base_url))
    await engine.start()
    openai_server.delay = 0.5
    try:
        task = asyncio.create_task(engine.generate([{"role": "user", "content": "hi"}], GenParams(), "req-4"))
        await asyncio.sleep(0.1)
        assert engine.queue_depth() == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.queue_depth() == 0
    finally:
        openai_server.delay = 0.0
        await engine.stop()


async def test_openai_start_fails_clearly(openai_server: FakeOpenAIServer) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    down = OpenAIEngine(_oa_config(dead))
    with pytest.raises(EngineError, match="unreachable"):
        await down.start()
    assert not down.healthy()
    with pytest.raises(EngineError, match="not running"):
        await down.generate([{"role": "user", "content": "hi"}], GenParams(), "req-5")
    wrong = OpenAIEngine(_oa_config(openai_server.base_url, model="no-such-model"))
    with pytest.raises(EngineError, match="not served"):
        await wrong.start()


# --------------------------------------------------------------------------- the FakeEngine double


async def test_fake_engine_records_calls_and_answers() -> None:
    async def responder(messages: list[dict[str, str]], params: GenParams) -> str:
        return f"echo {len(messages)} {params.max_tokens}"

    engine = FakeEngine(responder, supports_regex=True)
    await engine.start()
    assert engine.supports_regex and engine.healthy()
    result = await engine.generate([{"role": "user", "content": "a b"}], GenParams(max_tokens=3), "f1")
    assert result.text == "echo 1 3" and result.output_tokens == 3
    assert [c.request_id for c in engine.calls] == ["f1"]
    sync = FakeEngine(lambda m, p: GenResult("x", finish_reason="length"))
    await sync.start()
    assert (await sync.generate([], GenParams(), "f2")).finish_reason == "length"


async def test_fake_engine_delay_and_cancellation() -> None:
    engine = FakeEngine(lambda m, p: "late", delay=5.0)
    await engine.start()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(engine.generate([], GenParams(), "slow"), 0.05)
    assert engine.cancelled == ["slow"] and engine.queue_depth() == 0
    await engine.stop()
    with pytest.raises(EngineError):
        await engine.generate([], GenParams(), "stopped")
