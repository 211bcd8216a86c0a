"""Transport-neutral request and response types of the reward service.

Both fronts convert to and from these (``http/convert.py`` for JSON, ``grpc/convert.py`` for protobuf); the
core only ever sees these. ``to_json`` gives the HTTP wire form documented in DESIGN.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.verdicts import Preference
from judge.calibration import VerdictTemperature
from judge.settings import setting
from reward_server.error_codes import ErrorCode

#: The modes the service serves. In mode ``reply`` a candidate is a plain reply (its ``<response>`` part when it has
#: one, else its text without tags), judged point-wise with no reference: the result's ``reply`` verdict and
#: ``rewards.reply`` carry it, and there are no steps, no preference and no format reward.
SCORE_MODES: tuple[JudgeMode, ...] = tuple(JudgeMode)


class Status(str, enum.Enum):
    """Per-candidate outcome."""

    OK = "ok"
    PARSE_FAILED = "parse_failed"
    TIMEOUT = "timeout"
    INVALID_INPUT = "invalid_input"
    ENGINE_ERROR = "engine_error"


@dataclass(frozen=True)
class ErrorInfo:
    """A domain error as data: the code of the error table, the offending field path and the message."""

    code: ErrorCode
    field: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code.value, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class ScoreOptions:
    """Per-request options. ``timeout_ms`` 0 means the transport deadline or the server default."""

    mode: JudgeMode | None = None
    include_judgment: bool = False
    include_similarity: bool = True
    timeout_ms: int = 0


@dataclass(frozen=True)
class GroupRequest:
    """One conversation and a group of candidate CER outputs (one GRPO rollout group)."""

    history: list[Turn]
    reference: str | None
    candidates: list[str]
    options: ScoreOptions = field(default_factory=ScoreOptions)


@dataclass
class StepResult:
    """A True/False verdict (a step, or the plain reply of mode reply); ``p_true``: the judge's probability of True
    (graded rewards), None where not served or not obtained."""

    verdict: bool | None = None
    valid: bool = False
    judged: bool = False
    p_true: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "valid": self.valid, "judged": self.judged, "p_true": self.p_true}


@dataclass
class PreferenceResult:
    """The reply preference; ``probs``: the judge's probability of each label (first, second, both_good, neither),
    None where not served or not obtained."""

    verdict: Preference | None = None
    valid: bool = False
    judged: bool = False
    probs: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": None if self.verdict is None else self.verdict.value, "valid": self.valid,
                "judged": self.judged, "probs": None if self.probs is None else dict(self.probs)}


@dataclass
class FormatResult:
    ok: bool
    missing: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "missing": list(self.missing)}


@dataclass
class Rewards:
    """Reward components and their total (:mod:`cer.rewards`): the discrete ones (``CandidateResult.rewards``) or the
    graded ones (``CandidateResult.graded_rewards``), same fields."""

    steps: list[float | None]
    preference: float | None
    format: float | None  # None in mode reply (no format rule there)
    total: float | None
    reply: float | None = None  # mode reply only

    def to_json(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "preference": self.preference, "format": self.format,
                "reply": self.reply, "total": self.total}


@dataclass
class Similarity:
    s_in: float
    s_hi: float

    def to_json(self) -> dict[str, float]:
        return {"s_in": self.s_in, "s_hi": self.s_hi}


@dataclass
class CandidateResult:
    """The judgment of one candidate."""

    status: Status
    steps: list[StepResult]
    preference: PreferenceResult | None
    format: FormatResult
    rewards: Rewards
    similarity: Similarity | None = None
    judgment: list[str] | None = None
    cache_hit: bool = False
    error: ErrorInfo | None = None
    reply: StepResult | None = None  # mode reply only: the point-wise verdict of the plain reply
    #: the graded rewards (expected rewards under the judge's label probabilities); None when the server serves none
    #: (meta.graded false) or the candidate was not judged (invalid_input)
    graded_rewards: Rewards | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status.value,
            "steps": [s.to_json() for s in self.steps],
            "preference": None if self.preference is None else self.preference.to_json(),
            "reply": None if self.reply is None else self.reply.to_json(),
            "format": self.format.to_json(),
            "rewards": self.rewards.to_json(),
            "graded_rewards": None if self.graded_rewards is None else self.graded_rewards.to_json(),
            "similarity": None if self.similarity is None else self.similarity.to_json(),
            "judgment": self.judgment,
            "cache_hit": self.cache_hit,
        }
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out


@dataclass(frozen=True)
class SamplingInfo:
    """The judge's sampling, reported in every response and part of every cache key."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None
    max_retries: int
    constrained: bool

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                "seed": self.seed, "max_retries": self.max_retries, "constrained": self.constrained}


@dataclass
class GroupMeta:
    model: str
    revision: str
    adapter: str | None
    template_version: str
    sampling: SamplingInfo
    mode: JudgeMode
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    cache_hits: int = 0
    judge_rounds: int = 0
    graded: bool = False  # graded rewards are served (results carry graded_rewards)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "revision": self.revision, "adapter": self.adapter,
                "template_version": self.template_version, "sampling": self.sampling.to_json(),
                "mode": self.mode.value, "queue_ms": round(self.queue_ms, 3),
                "inference_ms": round(self.inference_ms, 3), "cache_hits": self.cache_hits,
                "judge_rounds": self.judge_rounds, "graded": self.graded}


@dataclass
class GroupResponse:
    results: list[CandidateResult]
    meta: GroupMeta

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results], "meta": self.meta.to_json()}


@dataclass(frozen=True)
class Limits:
    """Request limits, enforced by the core for both fronts and reported by Info."""

    max_candidates: int = setting(64, help="candidates per group")
    max_groups: int = setting(256, help="groups per batch request")
    max_history_turns: int = setting(64, help="history turns per group")
    max_text_chars: int = setting(8000, help="characters per history turn, reference or candidate")
    max_timeout_ms: int = setting(600_000, help="the longest options.timeout_ms a request may ask for")
    max_dialogue_turns: int = setting(65, help="turns per dialogue (POST /v1/dialogues:score, ScoreDialogue); at "
                                               "most max_history_turns + 1, since a turn's history is every "
                                               "earlier turn")
    max_queries: int = setting(256, help="queries per POST /get_reward call")

    def to_json(self) -> dict[str, int]:
        return {"max_candidates": self.max_candidates, "max_groups": self.max_groups,
                "max_history_turns": self.max_history_turns, "max_text_chars": self.max_text_chars,
                "max_timeout_ms": self.max_timeout_ms, "max_dialogue_turns": self.max_dialogue_turns,
                "max_queries": self.max_queries}


@dataclass
class InfoResponse:
    model: str
    revision: str
    adapter: str | None
    backend: str
    template_version: str
    modes: list[JudgeMode]
    default_mode: JudgeMode
    limits: Limits
    sampling: SamplingInfo
    version: str
    cache: str
    embedding_model: str
    graded: bool = False  # graded rewards are served
    independent_rounds: bool = False  # each round judged from the conversation alone (JudgeSettings.independent_rounds)
    answer_prefix: bool = False  # each round's answer started for the engine (JudgeSettings.answer_prefix, if it can)
    verdict_top_k: int = 0  # logprobs a token asked for graded rewards (judge.conversation.verdict_top_k); 0: not graded
    #: the verdict temperature of graded rewards (judge.calibration; step, preference, source); None: not graded
    verdict_temperature: VerdictTemperature | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "revision": self.revision, "adapter": self.adapter, "backend": self.backend,
                "template_version": self.template_version, "modes": [m.value for m in self.modes],
                "default_mode": self.default_mode.value, "limits": self.limits.to_json(),
                "sampling": self.sampling.to_json(), "version": self.version, "cache": self.cache,
                "embedding_model": self.embedding_model, "graded": self.graded,
                "independent_rounds": self.independent_rounds, "answer_prefix": self.answer_prefix,
                "verdict_top_k": self.verdict_top_k,
                "verdict_temperature": None if self.verdict_temperature is None else self.verdict_temperature.to_json()}


# ---- dialogue scoring (POST /v1/dialogues:score, ScoreDialogue; the logic is reward_server/dialogue.py) ----
@dataclass(frozen=True)
class DialogueTurn:
    """One turn; a supporter turn may carry a ``reference`` reply (used where its mode has a preference round)."""

    role: Role
    text: str
    reference: str | None = None


@dataclass(frozen=True)
class DialogueRequest:
    turns: list[DialogueTurn]
    options: ScoreOptions = field(default_factory=ScoreOptions)


@dataclass
class TurnResult:
    """The result of supporter turn ``index`` (its position in ``turns``), judged in ``mode``."""

    index: int
    mode: JudgeMode
    result: CandidateResult

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "mode": self.mode.value, **self.result.to_json()}


@dataclass
class ModeAggregate:
    """Totals of the scored turns of one mode (totals of different modes have different ranges)."""

    scored: int
    mean_total: float | None
    min_total: float | None

    def to_json(self) -> dict[str, Any]:
        return {"scored": self.scored, "mean_total": self.mean_total, "min_total": self.min_total}


@dataclass
class DialogueAggregate:
    """``turns``: supporter turns; ``scorable``: those that passed validation (not ``invalid_input``); ``scored``:
    those with status ``ok``. Means and minima are over scored turns only (null when none); ``components``: the mean
    reward of each component over the scored turns that have it."""

    turns: int
    scorable: int
    scored: int
    mean_total: float | None
    min_total: float | None
    components: dict[str, float]
    by_mode: dict[str, ModeAggregate]

    def to_json(self) -> dict[str, Any]:
        return {"turns": self.turns, "scorable": self.scorable, "scored": self.scored, "mean_total": self.mean_total,
                "min_total": self.min_total, "components": dict(self.components),
                "by_mode": {m: a.to_json() for m, a in self.by_mode.items()}}


@dataclass
class DialogueResponse:
    turns: list[TurnResult]
    aggregate: DialogueAggregate
    meta: GroupMeta

    def to_json(self) -> dict[str, Any]:
        return {"turns": [t.to_json() for t in self.turns], "aggregate": self.aggregate.to_json(),
                "meta": self.meta.to_json()}
