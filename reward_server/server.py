"""The server process: one core, handed to both the gRPC server and the HTTP server, on one event loop.

Start-up order: fronts first (health NOT_SERVING, /readyz 503), then the engine; when it is loaded, health
turns SERVING and /readyz 200. SIGTERM / SIGINT: health NOT_SERVING, drain gRPC, stop HTTP, stop the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from dataclasses import replace

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from judge.factory import JUDGE, build_engine, resolve_engine
from judge.model_store import default_embedding_path
from reward_server.auth import GrpcAuth, Guard
from reward_server.cache import MemoryCache, NoCache, RedisCache, ResultCache
from reward_server.config import ServerConfig
from reward_server.core import RewardCore
from reward_server.embeddings import Embedder, SentenceEmbedder
from reward_server.grpc.servicer import SERVICE_NAME, RewardServicer, add_to_server
from reward_server.http.app import create_app
from reward_server.metrics import Metrics
from reward_server.tls import add_grpc_port, uvicorn_tls

log = logging.getLogger(__name__)
DEFAULT_EMBEDDING_ID = "sentence-transformers/all-MiniLM-L6-v2"


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal capture: this process handles signals once, for both fronts."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def build_cache(config: ServerConfig, metrics: Metrics) -> ResultCache:
    kind = config.cache_kind
    if kind == "redis":
        assert config.redis_url is not None
        return RedisCache(config.redis_url, metrics, ttl_s=config.cache_ttl_s)
    if kind == "memory":
        return MemoryCache(config.cache_max_entries, config.cache_ttl_s)
    return NoCache()


def build_embedder(spec: str) -> Embedder | None:
    if spec == "off":
        return None
    if spec == "default":
        return SentenceEmbedder(default_embedding_path(), model_id=DEFAULT_EMBEDDING_ID)
    return SentenceEmbedder(spec)


async def build_core(config: ServerConfig) -> RewardCore:
    """Resolve the model (:func:`judge.factory.resolve_engine`), build engine, embedder, cache and metrics (the
    engine is started by ``core.start``). ``config`` is left as given: the core's config is a copy with the resolved
    engine and the in-flight bound."""
    config.validate()
    # the default judge is the base with the shipped adapter merged in; --adapter none / a folder otherwise
    engine = await asyncio.to_thread(resolve_engine, config.engine, config.model, config.adapter, role=JUDGE)
    on_cpu = engine.backend != "openai" and engine.precision.startswith("cpu")
    config = replace(config, engine=engine, max_in_flight_groups=config.in_flight_groups(on_cpu=on_cpu))
    metrics = Metrics()
    embedder = await asyncio.to_thread(build_embedder, config.embedding_model)
    return RewardCore(config, build_engine(config.engine), embedder, build_cache(config, metrics), metrics)


def grpc_server_options(config: ServerConfig) -> list[tuple[str, int]]:
    """One size limit for both fronts: a gRPC message over ``max_body_bytes`` is refused by the transport
    (RESOURCE_EXHAUSTED, with no retry hint), as an HTTP body over it is refused with 413."""
    return [("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", 256 * 1024 * 1024)]


async def _set_health(health: HealthServicer, status: int) -> None:
    """Set the overall ("") and the RewardService health status together."""
    for name in ("", SERVICE_NAME):
        await health.set(name, status)


async def _watch_engine(core: RewardCore, health: HealthServicer, every_s: float = 2.0) -> None:
    """Turn gRPC health NOT_SERVING when the engine dies (``/readyz`` and ``/healthz`` read the core directly)."""
    while core.ready:
        await asyncio.sleep(every_s)
    log.error("the engine is no longer healthy: gRPC health NOT_SERVING, /healthz 503")
    await _set_health(health, health_pb2.HealthCheckResponse.NOT_SERVING)
    await asyncio.Event().wait()  # keep serving errors until the orchestrator restarts the process


def create_grpc_server(core: RewardCore, health: HealthServicer, guard: Guard) -> tuple[grpc.aio.Server, int]:
    """The gRPC server over ``core``: RewardService, health, reflection; tokens checked by ``guard`` (health open),
    TLS / mutual TLS from ``core.config.security``. Returns the server (not started) and its bound port."""
    server = grpc.aio.server(interceptors=[GrpcAuth(guard)], options=grpc_server_options(core.config))
    add_to_server(RewardServicer(core), server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME, "grpc.health.v1.Health"), server)
    config = core.config
    return server, add_grpc_port(server, f"{config.host}:{config.grpc_port}", config.security)


def bind_http_socket(host: str, port: int) -> socket.socket:
    """The HTTP front's listening socket, bound before the engine loads. Left to uvicorn, the bind waits for the event
    loop's next turn after the engine's start: on 2026-11-29 a test server lost its free port in the meantime (the
    engine picks free ports of its own) and exited at "ready" with "address already in use". Not inherited by the
    engine's subprocesses (Python's default)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


async def serve(config: ServerConfig) -> None:
    """Run both fronts until SIGTERM / SIGINT."""
    core = await build_core(config)
    config = core.config  # the resolved copy
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    guard = Guard.from_settings(config.security, core.metrics)  # one token check for both fronts
    health = HealthServicer()
    server, grpc_port = create_grpc_server(core, health, guard)
    await _set_health(health, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()

    http = _Uvicorn(uvicorn.Config(create_app(core, guard), host=config.host, port=config.http_port,
                                   log_level="warning", lifespan="off", access_log=False,
                                   **uvicorn_tls(config.security)))
    http_socket = bind_http_socket(config.host, config.http_port)
    http_task = asyncio.create_task(http.serve(sockets=[http_socket]))
    log.info("listening: gRPC %s:%d, HTTP %s:%d (%s); loading the %s engine", config.host, grpc_port, config.host,
             http_socket.getsockname()[1], config.security.summary(), config.engine.backend)
    start_task = asyncio.create_task(core.start())
    stop_task = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({start_task, stop_task, http_task}, return_when=asyncio.FIRST_COMPLETED)
    try:
        if start_task in done:
            start_task.result()  # raises if the engine failed to start
            await _set_health(health, health_pb2.HealthCheckResponse.SERVING)
            t = core.judge.temperature
            log.info("ready: model %s (%s), adapter %s, cache %s, graded %s (verdict temperature step %g, "
                     "preference %g: %s)", config.engine.model_id, config.engine.revision, config.engine.adapter_id,
                     core.cache.kind, core.graded, t.step, t.preference, t.source)
            watch_task = asyncio.create_task(_watch_engine(core, health))
            await asyncio.wait({stop_task, http_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
            watch_task.cancel()
    finally:
        log.info("shutting down")
        await _set_health(health, health_pb2.HealthCheckResponse.NOT_SERVING)
        start_task.cancel()
        await server.stop(grace=config.shutdown_grace_s)
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await http_task
        await core.stop()
        stop_task.cancel()
        log.info("stopped")
