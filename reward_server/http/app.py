"""FastAPI app over the core: ``POST /v1/score``, ``POST /v1/score:batch``, ``GET /v1/info``, ``/healthz``,
``/readyz``, ``/metrics``. Handlers only convert, await the core and convert back."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from reward_server import __version__
from reward_server.core import RewardCore
from reward_server.errors import InvalidArgument, Overloaded, ServiceError
from reward_server.http.body_limit import BodyLimit
from reward_server.http.convert import batch_from_json, group_from_json
from reward_server.types import ErrorInfo


def _error(exc: ServiceError) -> JSONResponse:
    headers = {"Retry-After": f"{exc.retry_after_s:.0f}"} if isinstance(exc, Overloaded) else None
    return JSONResponse({"error": exc.info().to_json()}, status_code=exc.http_status, headers=headers)


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}",
                              "body") from None


def create_app(core: RewardCore) -> FastAPI:
    """Build the HTTP app for ``core`` (the server process runs it under uvicorn beside the gRPC server)."""
    app = FastAPI(title="compeer reward service", version=__version__)
    app.add_middleware(BodyLimit, max_bytes=core.config.max_body_bytes)
    m = core.metrics

    async def handle(method: str, request: Request, fn: Any) -> Response:
        try:
            with m.track("http", method):
                return JSONResponse(await fn(await _body(request)))
        except ServiceError as exc:
            return _error(exc)

    @app.post("/v1/score")
    async def score(request: Request) -> Response:
        async def run(body: Any) -> dict[str, Any]:
            return (await core.score_group(group_from_json(body))).to_json()

        return await handle("ScoreGroup", request, run)

    @app.post("/v1/score:batch")
    async def score_batch(request: Request) -> Response:
        async def run(body: Any) -> dict[str, Any]:
            outcomes = await core.score_batch(batch_from_json(body))
            return {"groups": [{"error": o.to_json()} if isinstance(o, ErrorInfo) else o.to_json()
                               for o in outcomes]}

        return await handle("ScoreBatch", request, run)

    @app.get("/v1/info")
    async def info() -> Response:
        return JSONResponse(core.info().to_json())

    @app.get("/healthz")
    async def healthz() -> Response:
        if core.alive:
            return JSONResponse({"status": "alive"})
        return JSONResponse({"status": "engine_dead"}, status_code=503)

    @app.get("/readyz")
    async def readyz() -> Response:
        ready = core.ready
        return JSONResponse({"status": "ready" if ready else "not_ready"}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(m.render(), media_type=CONTENT_TYPE_LATEST)

    return app
