"""Server configuration: one dataclass, validated once, built by the CLI from flags and environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from cer.modes import JudgeMode
from judge.engines import BACKENDS
from judge.engines.base import EngineConfig
from judge.protocol import DEFAULT_TEMPLATE, JudgeSettings
from reward_server.types import Limits

CACHE_KINDS = ("auto", "redis", "memory", "off")


@dataclass
class ServerConfig:
    """Everything ``compeer-reward serve`` can be told. ``validate`` raises ValueError naming the remedy."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    model: str = "default"  # "default" (embedded SmolLM2) or an HF folder
    host: str = "0.0.0.0"
    grpc_port: int = 50051
    http_port: int = 8000
    redis_url: str | None = None
    cache: str = "auto"  # auto: redis when redis_url is set, else memory
    cache_ttl_s: float = 86_400.0
    cache_max_entries: int = 100_000
    template: str = DEFAULT_TEMPLATE
    taxonomy: str | None = None
    default_mode: JudgeMode = JudgeMode.UNIFIED
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    limits: Limits = field(default_factory=Limits)
    judge_timeout_s: float = 120.0  # per candidate; past it the candidate's status is "timeout"
    default_timeout_s: float = 300.0  # per request when neither the caller nor the transport sets a deadline
    embedding_model: str = "default"  # "default" (all-MiniLM-L6-v2 wheel), an HF folder, or "off"
    max_in_flight_groups: int = 64  # groups judged at once; more wait (counted in queue_ms)
    shutdown_grace_s: float = 30.0  # on SIGTERM, in-flight gRPC calls get this long to finish

    def validate(self) -> ServerConfig:
        e = self.engine
        if e.backend not in BACKENDS:
            raise ValueError(f"backend {e.backend!r}: expected one of {', '.join(BACKENDS)}")
        if e.backend == "openai" and not e.base_url:
            raise ValueError("backend 'openai' needs --openai-base-url (an OpenAI-compatible /v1 endpoint)")
        for name, port in (("grpc_port", self.grpc_port), ("http_port", self.http_port)):
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} {port}: expected 0-65535 (0 picks a free port)")
        if self.grpc_port and self.grpc_port == self.http_port:
            raise ValueError(f"grpc_port and http_port are both {self.grpc_port}: give them different ports")
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"cache {self.cache!r}: expected one of {', '.join(CACHE_KINDS)}")
        if self.cache == "redis" and not self.redis_url:
            raise ValueError("cache 'redis' needs REDIS_URL / --redis-url (e.g. redis://127.0.0.1:6379/0)")
        j = self.judge
        if j.max_retries < 0 or j.max_retries > 10:
            raise ValueError(f"judge max_retries {j.max_retries}: expected 0-10")
        if j.temperature < 0 or j.retry_temperature < 0:
            raise ValueError("judge temperatures must be >= 0")
        if j.max_tokens_per_component < 8:
            raise ValueError(f"max_tokens_per_component {j.max_tokens_per_component}: expected >= 8")
        if self.limits.max_candidates < 1 or self.limits.max_groups < 1:
            raise ValueError("limits max_candidates and max_groups must be >= 1")
        if self.judge_timeout_s <= 0 or self.default_timeout_s <= 0:
            raise ValueError("judge_timeout_s and default_timeout_s must be > 0 seconds")
        return self

    @property
    def cache_kind(self) -> str:
        if self.cache == "auto":
            return "redis" if self.redis_url else "memory"
        return self.cache
