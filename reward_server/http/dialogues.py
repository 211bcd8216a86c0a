"""HTTP routes of dialogue scoring (``POST /v1/dialogues:score``) and OpenRLHF's ``POST /get_reward``: typed request
and response models (pydantic), converted to the neutral types and handed to the transport-neutral functions
(:func:`reward_server.dialogue.score_dialogue`, :func:`reward_server.get_reward.get_reward`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, StrictStr

from reward_server.core import RewardCore
from reward_server.dialogue import DialogueRequest, DialogueTurn, score_dialogue
from reward_server.get_reward import get_reward
from reward_server.http import models
from reward_server.http.convert import options_to_neutral, parse_json
from reward_server.metrics import Metrics

log = logging.getLogger(__name__)
#: how often a /get_reward call checks whether its client is still connected (seconds)
DISCONNECT_POLL_S = 1.0

Handler = Callable[[str, Request, Callable[[Any], Awaitable[dict[str, Any]]]], Awaitable[Response]]


class GetRewardIn(BaseModel):
    """OpenRLHF's body; keys it may add later are ignored."""

    query: list[StrictStr]
    prompts: list[StrictStr | None] | None = None
    labels: list[Any] | None = None


class GetRewardOut(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[float]]
    statuses: list[str]
    errors: dict[str, str]


def dialogue_request(body: Any) -> DialogueRequest:
    """The neutral request of a ``/v1/dialogues:score`` body."""
    d = parse_json(models.ScoreDialogueRequest, body)
    return DialogueRequest(turns=[DialogueTurn(t.role, t.text, t.reference) for t in d.turns],
                           options=options_to_neutral(d.options))


def add_dialogue_routes(app: FastAPI, core: RewardCore, handle: Handler) -> None:
    """Register ``POST /v1/dialogues:score`` and ``POST /get_reward`` on ``app``."""

    @app.post("/v1/dialogues:score", response_model=models.ScoreDialogueResponse, responses=models.ERROR_RESPONSES,
              openapi_extra=models.body_schema(models.ScoreDialogueRequest))
    async def dialogues_score(request: Request) -> Response:
        async def run(body: Any) -> dict[str, Any]:
            return (await score_dialogue(core, dialogue_request(body))).to_json()

        return await handle("ScoreDialogue", request, run)

    @app.post("/get_reward", response_model=GetRewardOut, responses=models.ERROR_RESPONSES,
              openapi_extra=models.body_schema(GetRewardIn))
    async def openrlhf_get_reward(request: Request) -> Response:
        """OpenRLHF's remote reward model protocol (docs/reward_server.md, "OpenRLHF"); a call whose client hangs
        up (OpenRLHF's 180 s timeout, a killed trainer) has its judging cancelled."""
        async def run(body: Any) -> dict[str, Any]:
            parsed = parse_json(GetRewardIn, body)
            return await get_reward(core, parsed.model_dump())

        return await until_disconnected(request, handle("GetReward", request, run), core.metrics)


async def until_disconnected(request: Request, work: Awaitable[Response], metrics: Metrics,
                             poll_s: float | None = None) -> Response:
    """Await ``work``, checking every ``poll_s`` seconds (default :data:`DISCONNECT_POLL_S`) whether the client is still there; once it has hung up,
    ``work`` is cancelled (its engine requests with it), counted as failure reason ``client_disconnected``, and the
    answer nobody reads is a bare 499."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s or DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                metrics.failures.labels("client_disconnected").inc()
                log.info("a /get_reward client hung up; its judging was cancelled")
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
