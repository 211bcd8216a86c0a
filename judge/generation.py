"""The one generate -> validate -> retry -> cache loop, used by the judge (the service's, the evaluator's, the
inconsistency auditor's) and by the dataset pipeline.

A call names a validator: the raw text is accepted only when the validator returns a value; otherwise the call is
re-generated, hotter, up to ``RetryPolicy.max_retries`` times and then reported as failed (``value`` None). Nothing is
ever made up for a failed call. A retry samples at ``max(temperature, retry_temperature)`` and, when the call is
seeded, with ``seed + attempt``, so that retries differ from each other and stay reproducible. An engine error ends
the call at once and is returned (``engine_error``), never retried.

With a :class:`GenerationCache`, each attempt is looked up and stored under the hash of everything that changes its
answer (the caller's model identity, the messages, the sampling and the attempt number): a re-run costs no
generation at all, and the engine is only asked for (``engine`` may be a coroutine function that starts it) on the
first miss. The reward service caches whole judgments per candidate instead (``reward_server.cache``, keyed by
:meth:`judge.conversation.Judge.judgment_key`, hashed with the same :func:`content_key`) and passes no cache here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from judge.engines.base import Engine, EngineError, GenParams, Message, TokenLogprobs
from judge.settings import setting

log = logging.getLogger(__name__)
T = TypeVar("T")
EngineSource = Engine | Callable[[], Awaitable[Engine]]


#: Re-generations of an output that does not parse or validate, in every command (``--max-retries``).
DEFAULT_MAX_RETRIES = 2


#: the most re-generations any command allows (``--max-retries``)
MAX_RETRIES_LIMIT = 10


def check_max_retries(value: int, name: str = "max_retries") -> None:
    """ValueError unless ``value`` is a re-generation count in 0..:data:`MAX_RETRIES_LIMIT` (one check for every
    command's ``--max-retries``)."""
    if isinstance(value, bool) or not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValueError(f"{name} {value}: expected 0-{MAX_RETRIES_LIMIT}")


def max_retries_setting() -> Any:
    """The ``--max-retries`` settings field, defined once for every command that generates (the reward server's
    judge, the dataset pipeline, the evaluator, the judge evaluation)."""
    return setting(DEFAULT_MAX_RETRIES, help="re-generations of an output that does not parse or validate (each "
                                             "hotter, with another seed), then it is reported as failed")


@dataclass(frozen=True)
class RetryPolicy:
    """How many times an invalid output is re-generated, and how hot."""

    max_retries: int = DEFAULT_MAX_RETRIES
    retry_temperature: float = 0.7

    def __post_init__(self) -> None:
        check_max_retries(self.max_retries)
        if self.retry_temperature < 0:
            raise ValueError(f"retry_temperature {self.retry_temperature}: expected >= 0")

    def params(self, params: GenParams, attempt: int) -> GenParams:
        """The sampling of attempt ``attempt`` (0: ``params`` itself)."""
        if attempt == 0:
            return params
        return dataclasses.replace(params, temperature=max(params.temperature, self.retry_temperature),
                                   seed=None if params.seed is None else params.seed + attempt)


class GenerationCache(Protocol):
    """Stores the text of an attempt by key (:func:`attempt_key`)."""

    def get(self, key: str) -> str | None:
        """The stored text, or None when absent or unreadable."""

    def put(self, key: str, text: str) -> None:
        """Store the text."""


def content_key(payload: Mapping[str, Any]) -> str:
    """The sha256 (hex) of a JSON-able ``payload`` in one canonical form (sorted keys, UTF-8): the one hash every cache
    key of the judge library is made with (:func:`attempt_key`, :meth:`judge.conversation.Judge.judgment_key`)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def sampling_fields(params: GenParams) -> dict[str, Any]:
    """What of ``params`` changes the text an engine writes (``logprobs`` only adds to it, so it is not here)."""
    sampling: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature,
                                "top_p": params.top_p, "seed": params.seed, "regex": params.regex}
    if params.max_line_chars is not None:
        sampling["max_line_chars"] = params.max_line_chars
    if params.prefix is not None:  # the engine is sent other tokens (absent when unset: earlier keys stay valid)
        sampling["prefix"] = params.prefix
    return sampling


def attempt_key(identity: Mapping[str, Any], messages: Sequence[Message], params: GenParams, attempt: int) -> str:
    """Stable key of one attempt: ``identity`` (which model answers: backend, id, revision) + messages + sampling."""
    return content_key({**identity, "messages": list(messages), "params": sampling_fields(params), "attempt": attempt})


class DiskCache:
    """A :class:`GenerationCache` of JSON files under ``root`` (``<key[:2]>/<key>.json``, written atomically);
    ``meta`` (e.g. the model id and revision) is stored beside each text for whoever reads the files."""

    def __init__(self, root: Path, meta: Mapping[str, Any] | None = None) -> None:
        self.root = root
        self._meta = dict(meta or {})

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        p = self._path(key)
        if not p.exists():
            return None
        try:
            return str(json.loads(p.read_text(encoding="utf-8"))["text"])
        except (json.JSONDecodeError, KeyError, OSError) as exc:
            log.warning("ignoring unreadable generation cache entry %s: %s", p.name, exc)
            return None

    def put(self, key: str, text: str) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**self._meta, "text": text}, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, p)


@dataclass
class Validated(Generic[T]):
    """The outcome of one validated call.

    ``value`` is None exactly when no attempt validated; ``text`` is the last attempt's text; ``attempts`` counts the
    attempts made (the one an engine error ended included), ``generations`` those the engine answered, ``cache_hits``
    those the cache answered. ``engine_error`` is set when the engine failed (the call was not retried).
    """

    value: T | None
    text: str
    attempts: int
    generations: int
    cache_hits: int
    engine_error: EngineError | None = None
    tokens: list[TokenLogprobs] | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None

    @property
    def error(self) -> str | None:
        """Why no value: ``engine_error: <message>`` or ``invalid_format``; None when a value was accepted."""
        if self.engine_error is not None:
            return f"engine_error: {self.engine_error}"
        return None if self.ok else "invalid_format"


async def generate_validated(engine: EngineSource, messages: Sequence[Message], params: GenParams,
                             validate: Callable[[str], T | None], policy: RetryPolicy, request_id: str,
                             cache: GenerationCache | None = None,
                             identity: Mapping[str, Any] | None = None) -> Validated[T]:
    """Generate until ``validate`` accepts the text, at most ``1 + policy.max_retries`` attempts.

    ``engine``: a started engine, or a coroutine function returning one (called on the first cache miss only).
    ``cache`` + ``identity``: look each attempt up before generating and store what was generated.
    """
    text, generations, hits = "", 0, 0
    tokens: list[TokenLogprobs] | None = None
    for attempt in range(policy.max_retries + 1):
        p = policy.params(params, attempt)
        key = attempt_key(identity or {}, messages, p, attempt) if cache is not None else ""
        cached = cache.get(key) if cache is not None else None
        if cached is not None:
            text, tokens = cached, None
            hits += 1
        else:
            started = engine if isinstance(engine, Engine) else await engine()  # a failed start is raised
            try:
                result = await started.generate(list(messages), p, request_id=f"{request_id}-a{attempt}")
            except EngineError as exc:
                return Validated(None, text, attempt + 1, generations, hits, engine_error=exc)
            text, tokens = result.text, result.tokens
            generations += 1
            if cache is not None:
                cache.put(key, text)
        value = validate(text)
        if value is not None:
            return Validated(value, text, attempt + 1, generations, hits, tokens=tokens)
    return Validated(None, text, policy.max_retries + 1, generations, hits, tokens=tokens)


__all__ = ["DEFAULT_MAX_RETRIES", "MAX_RETRIES_LIMIT", "DiskCache", "GenerationCache", "RetryPolicy", "Validated",
           "attempt_key", "check_max_retries", "content_key", "generate_validated", "max_retries_setting", "sampling_fields"]
