"""The HTTP contract: pydantic models of every JSON body of the HTTP front, one definition each.

Class names are the proto message names (``proto/compeer/reward/v1/reward.proto``) and the fields are the
neutral types' (``reward_server/types.py``) ``to_json`` keys; ``tests/unit/test_http_contract.py`` checks both
agreements field by field. Request models are strict (no coercion: ``"5"`` is not an integer, ``1`` is not a
boolean) and refuse unknown fields; limits that depend on the server's configuration (candidates per group,
characters per text, ...) are checked by ``reward_server/validation.py`` for both fronts and reported by
``GET /v1/info``. Responses are built by the neutral types' ``to_json``; these models describe them in
``/openapi.json``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from cer.dialogue import Role
from cer.verdicts import Preference
from reward_server.errors import ERROR_TABLE, ErrorCode
from reward_server.types import Status

#: The modes ScoreGroup / ScoreBatch serve, by their JSON names (checked against ``types.SCORE_MODES``).
ScoreMode = Literal["unified", "single_pass", "prm", "orm", "reply"]


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON may escape a lone surrogate ("\ud800"): no text, no UTF-8
        raise ValueError(f"not valid Unicode: a lone surrogate at position {exc.start}") from None
    return text


#: A JSON string that is text (protobuf strings are UTF-8 by construction; JSON escapes can break that).
Text = Annotated[StrictStr, AfterValidator(_unicode)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Response(BaseModel):
    """Answers may gain fields in later versions: clients should ignore the ones they don't know."""


# ---- requests -------------------------------------------------------------------------------------------------
class Turn(_Request):
    """One utterance of the conversation."""

    role: Role
    text: Text = Field(description="non-empty; at most limits.max_text_chars characters")


class ScoreOptions(_Request):
    """Per-request options."""

    mode: ScoreMode | None = Field(default=None, description="null: the server's default mode (GET /v1/info)")
    include_judgment: StrictBool = Field(default=False, description="return the judge's raw text per round")
    include_similarity: StrictBool = Field(default=True, description="s_in / s_hi on the reply part")
    timeout_ms: StrictInt = Field(default=0, description="0: the server default; at most limits.max_timeout_ms")


class ScoreGroupRequest(_Request):
    """One conversation and a group of candidate CER outputs (one GRPO rollout group): ``POST /v1/score``."""

    history: list[Turn] = Field(default_factory=list, description="at most limits.max_history_turns turns")
    reference: Text | None = Field(default=None, description="the reference reply; required except in mode prm")
    candidates: list[Text] = Field(description="CER outputs <analysis/><emotion/><strategy/><response/>; "
                                                    "1 to limits.max_candidates; a bad one fails alone")
    options: ScoreOptions | None = None


class ScoreBatchRequest(_Request):
    """Many groups in one call (``POST /v1/score:batch``); a malformed group fails alone."""

    groups: list[ScoreGroupRequest] = Field(description="at most limits.max_groups groups")


class DialogueTurn(_Request):
    """One turn of a dialogue to score: a supporter turn is a CER output or a plain reply."""

    role: Role
    text: Text = Field(description="non-empty; at most limits.max_text_chars characters")
    reference: Text | None = Field(default=None, description="supporter turns only: the reference reply of a "
                                                             "preference round")


class ScoreDialogueRequest(_Request):
    """A whole dialogue (``POST /v1/dialogues:score``): every supporter turn judged against the turns before it."""

    turns: list[DialogueTurn] = Field(description="1 to limits.max_dialogue_turns turns")
    options: ScoreOptions | None = Field(default=None, description="mode: of the CER turns (plain replies are "
                                                                   "judged in mode reply)")


# ---- responses ------------------------------------------------------------------------------------------------
class Error(_Response):
    """A domain error: the error table's code, the offending field path (e.g. ``groups[2].candidates[3]``) and a
    message naming the limit and the remedy."""

    # a string, as in the proto: a newer server may send a code this schema does not list
    code: str = Field(description=f"one of {', '.join(ErrorCode)} (reward_server/error_codes.py)")
    field: str
    message: str


class ErrorResponse(_Response):
    """The body of every 4xx / 5xx answer."""

    error: Error


class StepResult(_Response):
    verdict: bool | None
    valid: bool
    judged: bool
    p_true: float | None = Field(default=None, description="the judge's probability of True (graded rewards); null: "
                                                           "not served (meta.graded false) or not obtained")


class PreferenceResult(_Response):
    verdict: Preference | None
    valid: bool
    judged: bool
    probs: dict[str, float] | None = Field(default=None, description="the judge's probability of each label (first, "
                                                                     "second, both_good, neither); null: not served "
                                                                     "or not obtained")


class FormatResult(_Response):
    ok: bool
    missing: list[str]


class Rewards(_Response):
    """Discrete (``rewards``: each verdict +1 / -1) or graded (``graded_rewards``: expected rewards under the judge's
    label probabilities) reward components and their total."""

    steps: list[float | None] = Field(description="empty in modes orm and reply; null: not obtained")
    preference: float | None
    format: float | None = Field(description="null in mode reply (no format rule there)")
    reply: float | None = Field(default=None, description="mode reply only: +1 True, -1 False; null: not obtained")
    total: float | None = Field(description="null unless status is ok: never a made-up score")


class Similarity(_Response):
    s_in: float
    s_hi: float


class CandidateResult(_Response):
    """The judgment of one candidate."""

    status: Status
    steps: list[StepResult]
    preference: PreferenceResult | None
    format: FormatResult
    rewards: Rewards
    similarity: Similarity | None
    judgment: list[str] | None
    cache_hit: bool
    reply: StepResult | None = Field(default=None, description="mode reply only: the plain reply's verdict")
    error: Error | None = Field(default=None, description="present for invalid_input / engine_error")
    graded_rewards: Rewards | None = Field(
        default=None, description="graded rewards: each component's expected reward under the judge's label "
                                  "probabilities (2 P(True) - 1 per step; the expected preference reward; the format "
                                  "reward), a component null where its probabilities were not obtained, the total "
                                  "null unless status is ok and every component is known; null when the server "
                                  "serves none (meta.graded false) or for invalid_input")


class TurnResult(CandidateResult):
    """A supporter turn's result: the ``/v1/score`` result (proto ``TurnResult.result``, flattened in JSON) with the
    turn's position and the mode it was judged in."""

    index: int
    mode: ScoreMode


class SamplingParams(_Response):
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None
    max_retries: int
    constrained: bool


class Meta(_Response):
    model: str
    revision: str
    adapter: str | None
    template_version: str
    sampling: SamplingParams
    mode: ScoreMode
    queue_ms: float
    inference_ms: float
    cache_hits: int
    judge_rounds: int
    graded: bool = Field(default=False, description="graded rewards are served: results carry graded_rewards")


class ScoreGroupResponse(_Response):
    results: list[CandidateResult]
    meta: Meta


class GroupError(_Response):
    """A batch entry whose group was refused as a whole."""

    error: Error


class ScoreBatchResponse(_Response):
    groups: list[ScoreGroupResponse | GroupError] = Field(description="one entry per request group, in order")


class Limits(_Response):
    max_candidates: int
    max_groups: int
    max_history_turns: int
    max_text_chars: int
    max_timeout_ms: int
    max_dialogue_turns: int
    max_queries: int = Field(description="queries per POST /get_reward call")


class VerdictTemperature(_Response):
    """The verdict temperature of graded rewards (judge.calibration)."""

    step: float = Field(description="the temperature of the steps' and the reply verdict's label probabilities")
    preference: float = Field(description="the temperature of the preference's label probabilities")
    source: str = Field(description="setting: --verdict-temperature; adapter: the adapter's calibration; none: never "
                                    "calibrated (1)")


class InfoResponse(_Response):
    model: str
    revision: str
    adapter: str | None
    backend: str
    template_version: str
    modes: list[ScoreMode]
    default_mode: ScoreMode
    limits: Limits
    sampling: SamplingParams
    version: str
    cache: str = Field(description="redis | memory | off")
    embedding_model: str
    graded: bool = Field(default=False, description="graded rewards are served (the judge reads its verdict "
                                                    "probabilities)")
    independent_rounds: bool = Field(default=False, description="each round is judged from the conversation alone "
                                                                "(--independent-rounds), not after the earlier "
                                                                "rounds' answers")
    answer_prefix: bool = Field(default=False, description="each round's answer is started for the engine with "
                                                           "'Rationale:' (--answer-prefix, on an engine that takes "
                                                           "it), which decodes only the rest")
    verdict_top_k: int = Field(default=0, description="the logprobs a token the judge asks the engine for, for graded "
                                                      "rewards (--verdict-top-k, or 5 on vLLM's masked logprobs and "
                                                      "20 elsewhere); 0 when not graded")
    verdict_temperature: VerdictTemperature | None = Field(
        default=None, description="the temperature the verdict label probabilities are tempered by for graded "
                                  "rewards (--verdict-temperature, or the adapter's calibration); null when not graded")


class HealthStatus(_Response):
    status: Literal["alive", "engine_dead"]


class ReadyStatus(_Response):
    status: Literal["ready", "not_ready"]


class ModeAggregate(_Response):
    """Scored turns of one mode (JSON: the value of ``by_mode[mode]``; proto: a repeated entry with its ``mode``)."""

    scored: int
    mean_total: float | None
    min_total: float | None


class DialogueAggregate(_Response):
    turns: int = Field(description="supporter turns")
    scorable: int = Field(description="supporter turns not invalid_input")
    scored: int = Field(description="supporter turns ok")
    mean_total: float | None = Field(description="over scored turns; null when none")
    min_total: float | None
    components: dict[str, float] = Field(description="mean reward per component (step1..3, preference, format, "
                                                     "reply) over scored turns")
    by_mode: dict[ScoreMode, ModeAggregate] = Field(description="totals per mode (their ranges differ)")


class ScoreDialogueResponse(_Response):
    turns: list[TurnResult]
    aggregate: DialogueAggregate
    meta: Meta = Field(description="mode: of the CER turns; judge_rounds and cache_hits summed over turns")


# ---- OpenAPI helpers ------------------------------------------------------------------------------------------
SCHEMA_REF = "#/components/schemas/{model}"
#: The error answers every POST route declares (the error table's statuses with :class:`ErrorResponse`).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    ERROR_TABLE[code][0]: {"model": ErrorResponse, "description": code.value}
    for code in (ErrorCode.INVALID_ARGUMENT, ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED,
                 ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.INTERNAL)}


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads and validates its JSON body itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": SCHEMA_REF.format(model=model.__name__)}}}}}
