"""The reward service on real sockets (gRPC and HTTP under uvicorn) around a FAKE engine and a FAKE embedder, its
event loop in a background thread, so synchronous property tests (hypothesis, schemathesis) can call it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import grpc
import uvicorn

from judge.engines.base import EngineConfig
from judge.protocol import JudgeSettings
from reward_server.cache import MemoryCache
from reward_server.config import ServerConfig
from reward_server.core import RewardCore
from reward_server.grpc.servicer import RewardServicer, add_to_server
from reward_server.http.app import create_app
from reward_server.metrics import Metrics
from tests.conftest import free_port
from tests.fake_engine import FakeEngine
from tests.unit.fakes import FakeHashEmbedder, scripted_judge

T = TypeVar("T")


class LiveService:
    """Both fronts of one :class:`RewardCore` (FAKE engine, memory cache) on 127.0.0.1."""

    def __init__(self, engine_config: EngineConfig | None = None, respond: Any = None) -> None:
        """``engine_config``: what the FAKE engine says it serves (model id, revision, adapter id); ``respond``: its
        scripted judge (:func:`tests.unit.fakes.scripted_judge` by default)."""
        self.engine_config = engine_config or EngineConfig(backend="fake", model_id="fake-judge", revision="r1")
        self.respond = respond or scripted_judge()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-service", daemon=True)
        self.grpc_address = ""
        self.http_url = ""

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the service's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.engine = FakeEngine(self.respond, config=self.engine_config)
        config = ServerConfig(engine=self.engine.config, judge=JudgeSettings())
        self.core = RewardCore(config, self.engine, FakeHashEmbedder(), MemoryCache(), Metrics())
        await self.core.start()
        self.grpc_server = grpc.aio.server()
        add_to_server(RewardServicer(self.core), self.grpc_server)
        self.grpc_address = f"127.0.0.1:{self.grpc_server.add_insecure_port('127.0.0.1:0')}"
        await self.grpc_server.start()
        port = free_port()
        self.http = uvicorn.Server(uvicorn.Config(create_app(self.core), host="127.0.0.1", port=port,
                                                  log_level="warning", lifespan="off", access_log=False))
        self.http_task = asyncio.create_task(self.http.serve())
        while not self.http.started:
            if self.http_task.done():
                self.http_task.result()
            await asyncio.sleep(0.01)
        self.http_url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        self.http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.http_task
        await self.grpc_server.stop(None)
        await self.core.stop()

    def start(self) -> LiveService:
        self.thread.start()
        self.call(self._start())
        return self

    def stop(self) -> None:
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@contextlib.contextmanager
def live_service(engine_config: EngineConfig | None = None, respond: Any = None) -> Iterator[LiveService]:
    svc = LiveService(engine_config, respond).start()
    try:
        yield svc
    finally:
        svc.stop()
