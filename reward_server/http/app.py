"""FastAPI app over the core: ``POST /v1/score``, ``POST /v1/score:batch``, ``GET /v1/info``, ``/healthz``,
``/readyz``, ``/metrics``. Handlers only convert, await the core and convert back.

``/openapi.json`` (and ``/docs``) is the HTTP contract, built from ``http/models.py``. Request bodies are read and
validated by the handlers (a batch group by group, so one malformed group fails alone), so the route declares
its body schema through ``openapi_extra``; every error, FastAPI's own validation included, has the one shape
``{"error": {"code", "field", "message"}}``."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from reward_server import __version__
from reward_server.core import RewardCore
from reward_server.errors import ERROR_TABLE, ErrorCode, InvalidArgument, ServiceError
from reward_server.http import models
from reward_server.http.convert import batch_from_json, group_from_json, invalid_argument
from reward_server.types import ErrorInfo

_REF = "#/components/schemas/{model}"
#: Request bodies read by the handlers themselves: their schemas join the components of /openapi.json.
_REQUEST_MODELS: tuple[type[BaseModel], ...] = (models.ScoreGroupRequest, models.ScoreBatchRequest)
_ERRORS: dict[int | str, dict[str, Any]] = {
    ERROR_TABLE[code][0]: {"model": models.ErrorResponse, "description": code.value}
    for code in (ErrorCode.INVALID_ARGUMENT, ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED,
                 ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.INTERNAL)}


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def _error(exc: ServiceError) -> JSONResponse:
    return JSONResponse({"error": exc.info().to_json()}, status_code=exc.http_status)


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}",
                              "body") from None
    except RecursionError:
        raise InvalidArgument("the body nests too deeply", "body") from None


def _install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in _REQUEST_MODELS], ref_template=_REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(core: RewardCore) -> FastAPI:
    """Build the HTTP app for ``core`` (the server process runs it under uvicorn beside the gRPC server)."""
    app = FastAPI(title="compeer reward service", version=__version__,
                  description="Judges empathetic-reasoning (CER) outputs: the JSON mirror of the gRPC service "
                              "compeer.reward.v1.RewardService. Limits: GET /v1/info.")
    m = core.metrics

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own parameter validation (routes with typed parameters): the one error shape, not its 422 body
        errors = [{**e, "loc": tuple(e["loc"])[1:] if e["loc"] and e["loc"][0] == "body" else tuple(e["loc"])}
                  for e in exc.errors()]
        return _error(invalid_argument(errors))

    async def handle(method: str, request: Request, fn: Any) -> Response:
        try:
            with m.track("http", method):
                return JSONResponse(await fn(await _body(request)))
        except ServiceError as exc:
            return _error(exc)

    @app.post("/v1/score", response_model=models.ScoreGroupResponse, responses=_ERRORS,
              openapi_extra=_body_schema(models.ScoreGroupRequest))
    async def score(request: Request) -> Response:
        """Judge a group of candidate CER outputs for one conversation (gRPC ``ScoreGroup``). A bad candidate
        gets its own ``invalid_input`` result; the others are scored."""
        async def run(body: Any) -> dict[str, Any]:
            return (await core.score_group(group_from_json(body))).to_json()

        return await handle("ScoreGroup", request, run)

    @app.post("/v1/score:batch", response_model=models.ScoreBatchResponse, responses=_ERRORS,
              openapi_extra=_body_schema(models.ScoreBatchRequest))
    async def score_batch(request: Request) -> Response:
        """Judge many groups in one call (gRPC ``ScoreBatch``); each group succeeds or fails on its own."""
        async def run(body: Any) -> dict[str, Any]:
            outcomes = await core.score_batch(batch_from_json(body))
            return {"groups": [{"error": o.to_json()} if isinstance(o, ErrorInfo) else o.to_json()
                               for o in outcomes]}

        return await handle("ScoreBatch", request, run)

    @app.get("/v1/info", response_model=models.InfoResponse)
    async def info() -> Response:
        """Model, versions, limits and configuration of this server (gRPC ``Info``)."""
        return JSONResponse(core.info().to_json())

    @app.get("/healthz", response_model=models.HealthStatus, responses={503: {"model": models.HealthStatus}})
    async def healthz() -> Response:
        """Liveness: 503 once the engine has died."""
        if core.alive:
            return JSONResponse({"status": "alive"})
        return JSONResponse({"status": "engine_dead"}, status_code=503)

    @app.get("/readyz", response_model=models.ReadyStatus, responses={503: {"model": models.ReadyStatus}})
    async def readyz() -> Response:
        """Readiness: 200 once the engine is loaded and serving."""
        ready = core.ready
        return JSONResponse({"status": "ready" if ready else "not_ready"}, status_code=200 if ready else 503)

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition"}})
    async def metrics() -> Response:
        """Prometheus metrics (``compeer_*``)."""
        return Response(m.render(), media_type=CONTENT_TYPE_LATEST)

    _install_openapi(app)
    return app
