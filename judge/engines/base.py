"""The engine interface: a chat-completion generator with a lifecycle (start, healthy, stop).

The judge protocol talks to an engine only through :meth:`Engine.generate`; everything engine-specific
(chat templates, batching, structured outputs, LoRA) stays behind it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": "..."}


@dataclass(frozen=True)
class GenParams:
    """Sampling for one generation.

    ``regex``: constrain the whole output (engines without ``supports_regex`` ignore it). ``max_line_chars``: with
    ``regex``, also keep every line of the output within this many characters; only engines with
    ``supports_line_bound`` take it (the others raise :class:`EngineError`: put the bound in the regex instead).
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    regex: str | None = None
    max_line_chars: int | None = None


@dataclass(frozen=True)
class GenResult:
    """One finished generation."""

    text: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "stop"


@dataclass
class EngineConfig:
    """What every backend needs; backends ignore fields that do not apply to them.

    model_path: an HF folder (engines never download). adapter: a PEFT LoRA folder or None.
    """

    backend: str = "vllm"
    model_path: str = ""
    model_id: str = ""
    revision: str = ""
    adapter: str | None = None
    adapter_id: str | None = None  # reported and cached as the adapter's identity (set by the server: name@sha)
    seed: int = 0
    max_model_len: int = 4096
    dtype: str = "auto"
    device: str = "auto"
    # vllm
    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float | None = None  # vllm: KV cache size; None = 2 GiB on CPU, gpu_memory_utilization on GPU
    enable_prefix_caching: bool = True
    block_size: int | None = None  # vllm KV block (tokens); None = 32 on CPU, vLLM's default on GPU
    max_lora_rank: int = 64
    # transformers micro-batching
    max_batch: int = 32
    max_wait_ms: float = 5.0
    # openai-compatible endpoint
    base_url: str | None = None
    api_key: str | None = None
    openai_model: str | None = None
    openai_regex: bool = False
    extra: dict[str, str] = field(default_factory=dict)


class EngineError(RuntimeError):
    """A generation failed inside the engine (reported per candidate as ``engine_error``)."""


class Engine(abc.ABC):
    """A started engine generates chat completions concurrently; ``generate`` is safe to call from many tasks.

    Cancelling the task awaiting ``generate`` must abort the request in the engine (deadlines rely on it).
    """

    name: str = "engine"
    supports_regex: bool = False
    supports_line_bound: bool = False  # takes GenParams.max_line_chars

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model and warm up; return when ready to generate."""

    @abc.abstractmethod
    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        """Generate one assistant turn after ``messages``."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Release the engine (idempotent)."""

    def check_line_bound(self, params: GenParams) -> None:
        """Raise :class:`EngineError` for a ``max_line_chars`` this engine cannot honour (never silently unbounded)."""
        if params.max_line_chars is None:
            return
        if not self.supports_line_bound:
            raise EngineError(f"max_line_chars is not supported by the {self.name} engine; bound the lines in the regex")
        if params.regex is None or params.max_line_chars < 1:
            raise EngineError(f"max_line_chars must be >= 1 and come with a regex, got {params.max_line_chars} "
                              f"with regex {'set' if params.regex else 'None'}")

    def healthy(self) -> bool:
        """True while the engine can serve (started, not stopped, not dead)."""
        return True

    def queue_depth(self) -> int:
        """Requests waiting or running inside the engine (for the queue-depth gauge)."""
        return 0
