"""HTTP routes of dialogue scoring (``POST /v1/dialogues:score``) and OpenRLHF's ``POST /get_reward``: typed request
and response models (pydantic), converted to the neutral types and handed to the transport-neutral functions
(:func:`reward_server.dialogue.score_dialogue`, :func:`reward_server.get_reward.get_reward`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from cer.dialogue import Role
from cer.modes import JudgeMode
from reward_server.core import RewardCore
from reward_server.dialogue import DialogueRequest, DialogueTurn, score_dialogue
from reward_server.errors import InvalidArgument
from reward_server.get_reward import get_reward
from reward_server.types import ScoreOptions

Handler = Callable[[str, Request, Callable[[Any], Awaitable[dict[str, Any]]]], Awaitable[Response]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnIn(_Strict):
    role: Role
    text: StrictStr
    reference: StrictStr | None = Field(None, description="a reference reply (supporter turns only)")


class OptionsIn(_Strict):
    mode: JudgeMode | None = Field(None, description="mode of the CER turns (default: the server's); plain-reply "
                                                     "turns are judged in mode reply")
    include_judgment: StrictBool = False
    include_similarity: StrictBool = True
    timeout_ms: StrictInt = 0


class DialogueIn(_Strict):
    turns: list[TurnIn]
    options: OptionsIn | None = None


class ModeAggregateOut(BaseModel):
    scored: int
    mean_total: float | None
    min_total: float | None


class AggregateOut(BaseModel):
    turns: int
    scorable: int
    scored: int
    mean_total: float | None
    min_total: float | None
    components: dict[str, float]
    by_mode: dict[str, ModeAggregateOut]


class DialogueOut(BaseModel):
    turns: list[dict[str, Any]] = Field(description="one /v1/score result per supporter turn, plus index and mode")
    aggregate: AggregateOut
    meta: dict[str, Any]


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


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def parse_model(model: type[BaseModel], body: Any) -> Any:
    """Validate ``body`` into ``model``; the first problem becomes an InvalidArgument naming its field path."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InvalidArgument(str(e["msg"]), _field(tuple(e["loc"]))) from None


def dialogue_request(body: Any) -> DialogueRequest:
    """The neutral request of a ``/v1/dialogues:score`` body."""
    d: DialogueIn = parse_model(DialogueIn, body)
    o = d.options or OptionsIn.model_validate({})
    return DialogueRequest(turns=[DialogueTurn(t.role, t.text, t.reference) for t in d.turns],
                           options=ScoreOptions(mode=o.mode, include_judgment=o.include_judgment,
                                                include_similarity=o.include_similarity, timeout_ms=o.timeout_ms))


def add_dialogue_routes(app: FastAPI, core: RewardCore, handle: Handler) -> None:
    """Register ``POST /v1/dialogues:score`` and ``POST /get_reward`` on ``app``."""

    @app.post("/v1/dialogues:score", response_model=DialogueOut)
    async def dialogues_score(request: Request) -> Response:
        async def run(body: Any) -> dict[str, Any]:
            return (await score_dialogue(core, dialogue_request(body))).to_json()

        return await handle("ScoreDialogue", request, run)

    @app.post("/get_reward", response_model=GetRewardOut)
    async def openrlhf_get_reward(request: Request) -> Response:
        async def run(body: Any) -> dict[str, Any]:
            parsed: GetRewardIn = parse_model(GetRewardIn, body)
            return await get_reward(core, parsed.model_dump())

        return await handle("GetReward", request, run)
