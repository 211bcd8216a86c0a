"""The engine interface: a chat-completion generator with a lifecycle (start, healthy, stop).

The judge protocol talks to an engine only through :meth:`Engine.generate`; everything engine-specific
(chat templates, batching, structured outputs, LoRA) stays behind it.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from judge.engines.settings import (
    RATIONALE_BOUNDS,
    OpenAISettings,
    TransformersSettings,
    VllmSettings,
    rationale_bound_of,
)
from judge.settings import nested, setting

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": "..."}
#: The engine backends :func:`judge.engines.create_engine` builds.
BACKENDS = ("vllm", "transformers", "openai")


@dataclass(frozen=True)
class GenParams:
    """Sampling for one generation.

    ``regex``: constrain the whole output (engines without ``supports_regex`` ignore it). ``max_line_chars``: with
    ``regex``, also keep every line of the output within this many characters; only engines with
    ``supports_line_bound`` take it (the others raise :class:`EngineError`: put the bound in the regex instead).
    ``logprobs``: also return, for every output token, the ``logprobs`` most likely tokens of the model's own
    distribution at that position (:attr:`GenResult.tokens`); only engines with ``supports_logprobs`` take it (the
    others raise :class:`EngineError`, see :meth:`Engine.check_logprobs`). None: not asked (no cost).
    ``prefix``: the answer starts with this text; the engine appends it to the rendered chat prompt (after the
    generation prompt), conditions on it and decodes only the continuation, returning the prefix as the start of
    :attr:`GenResult.text`; ``regex`` then constrains the continuation only, and ``max_line_chars`` counts the
    prefix as part of the first line. Only engines with ``supports_prefix`` take it (the others raise
    :class:`EngineError`, see :meth:`Engine.check_prefix`). None: no prefix.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    regex: str | None = None
    max_line_chars: int | None = None
    logprobs: int | None = None
    prefix: str | None = None


@dataclass(frozen=True)
class TokenLogprobs:
    """One output token: its text and the most likely tokens at its position (text -> natural-log probability).

    ``top`` holds the model's own distribution as the engine reports it (see each engine for which logits: none of
    them applies the sampling temperature). Texts are each token decoded alone (a leading space kept), so they may
    not concatenate to :attr:`GenResult.text` where a character spans several tokens; two tokens that decode to the
    same text share one entry (their probabilities summed). ``logprob`` is the chosen token's own, None when the
    engine did not report it.
    """

    token: str
    top: dict[str, float]
    logprob: float | None = None


def top_logprobs(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    """``(token text, logprob)`` pairs as :attr:`TokenLogprobs.top`: tokens with the same text summed in probability."""
    out: dict[str, float] = {}
    for text, lp in pairs:
        if text in out:
            hi, lo = max(out[text], lp), min(out[text], lp)
            lp = hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))
        out[text] = float(lp)
    return out


@dataclass(frozen=True)
class GenResult:
    """One finished generation; ``tokens``: one entry per output token when ``GenParams.logprobs`` asked, else None.

    With a ``GenParams.prefix``, ``text`` starts with the prefix while ``tokens`` and ``output_tokens`` cover the
    decoded continuation only (``text[len(prefix):]``; :func:`judge.verdict_probs.label_distributions` takes that
    offset)."""

    text: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "stop"
    tokens: list[TokenLogprobs] | None = None


@dataclass(frozen=True)
class EngineConfig:
    """What every backend needs, and one typed settings object per backend (each backend reads only its own).

    model_path: an HF folder (engines never download). adapter: a PEFT LoRA folder or None. ``model_path``,
    ``model_id``, ``revision``, ``adapter_id`` and ``precision`` are filled in by
    :func:`judge.factory.resolve_engine`, never set by a user.
    """

    #: vllm, unlike the offline commands' transformers (:data:`judge.factory.DEFAULT_BACKEND`, which says why): the
    #: server is a long-running service under many concurrent requests, where vLLM's continuous batching pays
    backend: str = setting("vllm", choices=BACKENDS, help="engine backend (vllm: the server's default, for throughput "
                                                          "under concurrent requests; the offline commands default to "
                                                          "transformers)")
    model_path: str = setting("", cli=False, help="the HF folder the engine loads")
    model_id: str = setting("", cli=False, help="the model's reported id")
    revision: str = setting("", cli=False, help="the model's reported revision")
    adapter: str | None = setting(None, cli=False, help="a PEFT LoRA folder the engine loads on top of the model "
                                  "(resolved from the user's --adapter by the model store; None: none)")
    adapter_id: str | None = setting(None, cli=False, help="the adapter's identity (name@sha), reported and cached")
    adapter_dir: str | None = setting(None, cli=False, help="the folder of the adapter whose weights are served "
                                      "(merged or loaded at run time), for its metadata (judge.calibration)")
    precision: str = setting("", cli=False, help="the device kind and dtype that device and dtype 'auto' resolved to "
                                                 "(e.g. cuda:bfloat16), for the cache key; empty: not resolved")
    seed: int = setting(0, help="engine seed")
    max_model_len: int = setting(4096, help="the longest prompt + output in tokens")
    dtype: str = setting("auto", help="weights dtype: auto (bfloat16 or float16 on GPU, float32 on CPU) or a torch "
                                      "dtype name")
    device: str = setting("auto", help="auto | cpu | cuda | cuda:N (vllm picks its own platform)")
    #: one setting for every backend (the transformers engine's ``--no-line-bound``: a deprecated alias of counted)
    rationale_bound: str = setting(
        "auto", choices=("auto", *RATIONALE_BOUNDS), aliases={"--no-line-bound": "counted", "--line-bound": "line"},
        env_aliases={"COMPEER_LINE_BOUND": {"false": "counted", "true": "line"}},
        help="how the judge's one-line rationale is bounded: counted (a counted repetition in the regex), max_tokens "
             "(vllm: an unbounded pattern, max_tokens ends it, an over-long line is re-generated) or line (vllm, "
             "transformers: in the engine); auto: the backend's fastest (transformers: line; vllm, openai: counted; "
             "judge/engines/settings.py)")
    vllm: VllmSettings = nested(VllmSettings, help="vllm backend")
    transformers: TransformersSettings = nested(TransformersSettings, help="transformers backend")
    openai: OpenAISettings = nested(OpenAISettings, prefix="openai-", help="openai backend (an OpenAI-compatible "
                                                                          "endpoint)")


    def __post_init__(self) -> None:
        rationale_bound_of(self.backend, self.rationale_bound)  # raises for a bound the backend cannot apply

    @property
    def bound(self) -> str:
        """The rationale bound this config's backend applies (``auto`` resolved)."""
        return rationale_bound_of(self.backend, self.rationale_bound)


class EngineError(RuntimeError):
    """A generation failed inside the engine (reported per candidate as ``engine_error``)."""


#: The most alternatives per output token an engine returns: OpenAI's ``top_logprobs`` limit and vLLM's default
#: ``max_logprobs``, 20 (``JudgeSettings.verdict_top_k``'s bound).
MAX_LOGPROBS = 20
#: The alternatives a token the judge asks for by default from an engine with ``masked_logprobs`` on a constrained
#: round: after the verdict grammar's mask a verdict position holds only the labels' spellings, and 5 kept every
#: verdict and the label probabilities to 1e-5 against 20 (docs/reward_server.md, "Fewer logprobs a token").
MASKED_TOP_K = 5


class Engine(abc.ABC):
    """A started engine generates chat completions concurrently; ``generate`` is safe to call from many tasks.

    Cancelling the task awaiting ``generate`` must abort the request in the engine (deadlines rely on it).
    """

    name: str = "engine"
    supports_regex: bool = False
    supports_line_bound: bool = False  # takes GenParams.max_line_chars
    #: takes GenParams.logprobs and returns GenResult.tokens; an engine that cannot says so here (never made up)
    supports_logprobs: bool = False
    #: the most alternatives per position it returns (:data:`MAX_LOGPROBS`)
    max_logprobs: int = MAX_LOGPROBS
    #: its logprobs are computed after ``GenParams.regex``'s mask (vLLM), not from the model's unmasked distribution
    masked_logprobs: bool = False
    #: takes GenParams.prefix (it renders the chat template itself, so it can append the answer's start)
    supports_prefix: bool = False
    #: what an engine says it can do: a :class:`DelegatingEngine` takes each of these from the engine it wraps
    CAPABILITIES: ClassVar[tuple[str, ...]] = ("name", "supports_regex", "supports_line_bound", "supports_logprobs",
                                                "max_logprobs", "masked_logprobs", "supports_prefix")

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

    def check_logprobs(self, params: GenParams) -> None:
        """Raise :class:`EngineError` for a ``logprobs`` request this engine cannot honour (never made-up numbers)."""
        if params.logprobs is None:
            return
        if not self.supports_logprobs:
            raise EngineError(f"logprobs are not supported by the {self.name} engine (supports_logprobs is false)")
        if not 1 <= params.logprobs <= self.max_logprobs:
            raise EngineError(f"logprobs must be in 1..{self.max_logprobs} for the {self.name} engine, got "
                              f"{params.logprobs}")

    def check_prefix(self, params: GenParams) -> None:
        """Raise :class:`EngineError` for a ``prefix`` this engine cannot honour (never silently dropped)."""
        if params.prefix is None:
            return
        if not self.supports_prefix:
            raise EngineError(f"an answer prefix is not supported by the {self.name} engine (supports_prefix is false)")
        if not params.prefix:
            raise EngineError("an answer prefix must not be empty (None: no prefix)")

    def identity(self) -> dict[str, Any]:
        """What of this engine, beyond the messages and :class:`GenParams` of a request, decides what it answers: the
        backend, the model and its weights (id; revision, a digest of the weights for a local folder or a pinned
        base; the adapter's ``name@sha256``), the engine seed (the sampling of a request without one), the dtype and
        the device as configured and, where the model was resolved, what they resolved to (``precision``: ``auto``
        is bfloat16 on a GPU, float32 on a CPU). Part of every judgment's cache key
        (:meth:`judge.conversation.Judge.judgment_key`); a backend with more such settings adds them."""
        c = self.config
        return {"backend": c.backend, "model": c.model_id, "revision": c.revision, "adapter": c.adapter_id or c.adapter,
                "seed": c.seed, "dtype": c.dtype, "device": c.device, "precision": c.precision}

    def healthy(self) -> bool:
        """True while the engine can serve (started, not stopped, not dead)."""
        return True

    def queue_depth(self) -> int:
        """Requests waiting or running inside the engine (for the queue-depth gauge)."""
        return 0


class DelegatingEngine(Engine):
    """An engine that hands every request to ``inner`` and is, to its callers, that engine: the same capabilities
    (:attr:`Engine.CAPABILITIES`, so a wrapper never silently turns off logprobs or a prefix), identity, health and
    queue. Wrappers that count, record or share an engine subclass it and override only what they add."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.config)
        self.inner = inner
        for attr in self.CAPABILITIES:
            setattr(self, attr, getattr(inner, attr))

    async def start(self) -> None:
        await self.inner.start()

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        return await self.inner.generate(messages, params, request_id)

    async def stop(self) -> None:
        await self.inner.stop()

    def identity(self) -> dict[str, Any]:
        return self.inner.identity()

    def healthy(self) -> bool:
        return self.inner.healthy()

    def queue_depth(self) -> int:
        return self.inner.queue_depth()
