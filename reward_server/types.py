"""Transport-neutral request and response types of the reward service.

Both fronts convert to and from these (``http/convert.py`` for JSON, ``grpc/convert.py`` for protobuf); the
core only ever sees these. ``to_json`` gives the HTTP wire form documented in DESIGN.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from cer.dialogue import Turn
from cer.verdicts import Preference


class JudgeMode(str, enum.Enum):
    """How a candidate is judged (see DESIGN.md, UnifiReward)."""

    UNIFIED = "unified"  # 4 rounds: steps 1-3, then reference vs candidate reply
    SINGLE_PASS = "single_pass"  # one generation judges every component
    PRM = "prm"  # steps only
    ORM = "orm"  # reply preference only
    REPLY = "reply"  # a plain reply judged point-wise (True | False), no reasoning parts, no reference

    @property
    def judges_steps(self) -> bool:
        return self in (JudgeMode.UNIFIED, JudgeMode.SINGLE_PASS, JudgeMode.PRM)

    @property
    def judges_preference(self) -> bool:
        return self in (JudgeMode.UNIFIED, JudgeMode.SINGLE_PASS, JudgeMode.ORM)

    @property
    def judges_reply(self) -> bool:
        return self is JudgeMode.REPLY


#: The modes ScoreGroup / ScoreBatch serve (``reply`` results have no wire shape there yet).
SCORE_MODES: tuple[JudgeMode, ...] = tuple(m for m in JudgeMode if not m.judges_reply)


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

    code: str
    field: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "field": self.field, "message": self.message}


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
    verdict: bool | None = None
    valid: bool = False
    judged: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "valid": self.valid, "judged": self.judged}


@dataclass
class PreferenceResult:
    verdict: Preference | None = None
    valid: bool = False
    judged: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"verdict": None if self.verdict is None else self.verdict.value, "valid": self.valid,
                "judged": self.judged}


@dataclass
class FormatResult:
    ok: bool
    missing: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "missing": list(self.missing)}


@dataclass
class Rewards:
    steps: list[float | None]
    preference: float | None
    format: float
    total: float | None

    def to_json(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "preference": self.preference, "format": self.format, "total": self.total}


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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status.value,
            "steps": [s.to_json() for s in self.steps],
            "preference": None if self.preference is None else self.preference.to_json(),
            "format": self.format.to_json(),
            "rewards": self.rewards.to_json(),
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

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "revision": self.revision, "adapter": self.adapter,
                "template_version": self.template_version, "sampling": self.sampling.to_json(),
                "mode": self.mode.value, "queue_ms": round(self.queue_ms, 3),
                "inference_ms": round(self.inference_ms, 3), "cache_hits": self.cache_hits,
                "judge_rounds": self.judge_rounds}


@dataclass
class GroupResponse:
    results: list[CandidateResult]
    meta: GroupMeta

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results], "meta": self.meta.to_json()}


@dataclass(frozen=True)
class Limits:
    """Request limits, enforced by the core for both fronts and reported by Info."""

    max_candidates: int = 64
    max_groups: int = 256
    max_history_turns: int = 64
    max_text_chars: int = 8000
    max_timeout_ms: int = 600_000

    def to_json(self) -> dict[str, int]:
        return {"max_candidates": self.max_candidates, "max_groups": self.max_groups,
                "max_history_turns": self.max_history_turns, "max_text_chars": self.max_text_chars,
                "max_timeout_ms": self.max_timeout_ms}


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

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "revision": self.revision, "adapter": self.adapter, "backend": self.backend,
                "template_version": self.template_version, "modes": [m.value for m in self.modes],
                "default_mode": self.default_mode.value, "limits": self.limits.to_json(),
                "sampling": self.sampling.to_json(), "version": self.version, "cache": self.cache,
                "embedding_model": self.embedding_model}
