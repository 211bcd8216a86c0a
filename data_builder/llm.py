"""LLM calls for the stages: any judge engine, through the one generate -> validate -> retry -> cache loop
(:func:`judge.generation.generate_validated`) with a disk cache.

Every call names a validator: the raw text is accepted only when the validator returns a value; otherwise the
call is re-generated (a new seed, a higher temperature) up to ``max_retries`` times and then recorded as
failed. Nothing is ever made up for a failed call. Each attempt is cached on disk under the hash of
everything that changes its answer (backend, model id + revision, messages, sampling, attempt number), so a
re-run of a stage costs no generation at all; the engine is only started on the first cache miss.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from data_builder.stage import progress
from judge.engines import BACKENDS, create_engine
from judge.engines.base import Engine, EngineConfig, GenParams, Message
from judge.engines.settings import OpenAISettings
from judge.generation import DiskCache, RetryPolicy, Validated, generate_validated

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


def default_cache_dir() -> Path:
    """``$COMPEER_CACHE/data_builder/llm`` (``~/.cache/compeer/data_builder/llm`` by default)."""
    from judge.model_store import cache_dir

    return cache_dir() / "data_builder" / "llm"


@dataclass(frozen=True)
class LLMSettings:
    """Which model answers, and how."""

    backend: str = "transformers"
    model: str = "default"
    max_retries: int = 2
    retry_temperature: float = 0.8
    concurrency: int = 4
    cache_dir: Path | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    seed: int = 0


@dataclass
class CallStats:
    """Counts over a stage's calls (reported in its manifest)."""

    calls: int = 0
    generations: int = 0
    cache_hits: int = 0
    retries: int = 0
    failed: int = 0
    engine_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class LLM:
    """A cached, validating front for a reward-service engine (``judge.engines.create_engine``).

    Pass ``engine`` to use an already-built engine (tests use a fake engine this way); otherwise the engine
    is built from ``settings`` on the first cache miss and stopped by :meth:`close`.
    """

    def __init__(self, settings: LLMSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self._engine = engine
        self._own_engine = engine is None
        self._started = False
        self._lock = asyncio.Lock()
        self.stats = CallStats()
        self.cache_dir = settings.cache_dir or default_cache_dir()
        self.model_id, self.revision = self._identity()
        self.cache = DiskCache(self.cache_dir, {"model": self.model_id, "revision": self.revision})
        self.policy = RetryPolicy(max_retries=settings.max_retries, retry_temperature=settings.retry_temperature)

    def _identity(self) -> tuple[str, str]:
        if self._engine is not None:
            cfg = self._engine.config
            return (cfg.model_id or cfg.model_path or self._engine.name, cfg.revision or "")
        if self.settings.backend == "openai":
            if self.settings.model == "default":
                raise ValueError("--backend openai needs --model <the served model name> (and --base-url)")
            return (self.settings.model, f"openai:{self.settings.base_url or ''}")
        from judge.model_store import resolve_model

        ref = resolve_model(self.settings.model)
        self._model_path = ref.path
        return (ref.model_id, ref.revision)

    def engine_config(self) -> EngineConfig:
        """The EngineConfig this LLM builds its engine from."""
        s = self.settings
        if s.backend == "openai":
            return EngineConfig(backend="openai", model_id=s.model, revision=self.revision, seed=s.seed,
                                openai=OpenAISettings(base_url=s.base_url, api_key=os.environ.get(s.api_key_env),
                                                      model=s.model))
        return EngineConfig(backend=s.backend, model_path=self._model_path, model_id=self.model_id,
                            revision=self.revision, seed=s.seed)

    async def _get_engine(self) -> Engine:
        async with self._lock:
            if self._engine is None:
                log.info("starting %s engine for %s", self.settings.backend, self.model_id)
                self._engine = create_engine(self.engine_config())
            if not self._started:
                if self._own_engine or not self._engine.healthy():
                    await self._engine.start()
                self._started = True
        return self._engine

    async def aclose(self) -> None:
        """Stop the engine if this LLM started it."""
        if self._engine is not None and self._own_engine and self._started:
            await self._engine.stop()
            self._started = False

    def identity(self) -> dict[str, str]:
        """Which model answers (part of every cache key): backend, model id and revision."""
        backend = self.settings.backend if self._own_engine else self._engine.name if self._engine else ""
        return {"backend": backend, "model": self.model_id, "revision": self.revision}

    async def complete(self, messages: Sequence[Message], params: GenParams, validate: Callable[[str], T | None],
                       request_id: str) -> Validated[T]:
        """Generate until ``validate`` accepts the text (at most ``1 + max_retries`` attempts, each cached)."""
        self.stats.calls += 1
        seeded = params if params.seed is not None else dataclasses.replace(params, seed=self.settings.seed)
        result = await generate_validated(self._get_engine, messages, seeded, validate, self.policy, request_id,
                                          cache=self.cache, identity=self.identity())
        answered = result.attempts - (1 if result.engine_error is not None else 0)  # attempts that got a text
        self.stats.generations += result.generations
        self.stats.cache_hits += result.cache_hits
        self.stats.retries += max(0, answered - 1)
        if result.engine_error is not None:
            self.stats.engine_errors += 1
        if not result.ok:
            self.stats.failed += 1
        return result


async def map_bounded(items: Sequence[T], fn: Callable[[T], Awaitable[R]], concurrency: int, desc: str) -> list[R]:
    """Run ``fn`` over items with at most ``concurrency`` in flight; results in input order; progress bar."""
    sem = asyncio.Semaphore(max(1, concurrency))
    results: list[Any] = [None] * len(items)

    async def one(i: int, item: T) -> int:
        async with sem:
            results[i] = await fn(item)
        return i

    tasks = [asyncio.create_task(one(i, it)) for i, it in enumerate(items)]
    try:
        for fut in progress(asyncio.as_completed(tasks), desc=desc, total=len(tasks)):
            await fut
    finally:
        for t in tasks:
            t.cancel()
    return results


def add_llm_options(parser: argparse.ArgumentParser) -> None:
    """--backend, --model, --base-url, --api-key-env, --max-retries, --concurrency, --cache-dir."""
    parser.add_argument("--backend", choices=BACKENDS, default="transformers",
                        help="engine of the reward service that answers (default: transformers)")
    parser.add_argument("--model", default="default",
                        help="'default' (embedded SmolLM2-135M), a local HF folder, or the remote model name (openai)")
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (backend openai)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="env var holding the API key (backend openai)")
    parser.add_argument("--max-retries", type=int, default=2, help="re-generations of an invalid output")
    parser.add_argument("--concurrency", type=int, default=4, help="LLM calls in flight")
    parser.add_argument("--cache-dir", type=Path, default=None, help="LLM cache (default $COMPEER_CACHE/data_builder/llm)")


def settings_from_args(args: argparse.Namespace) -> LLMSettings:
    """LLMSettings from the parsed --backend/--model/... options."""
    if args.max_retries < 0:
        raise ValueError("--max-retries must be >= 0")
    return LLMSettings(backend=args.backend, model=args.model, max_retries=args.max_retries,
                       concurrency=args.concurrency, cache_dir=args.cache_dir, base_url=args.base_url,
                       api_key_env=args.api_key_env, seed=args.seed)


EngineFactory = Callable[[LLMSettings], LLM]


def default_llm_factory(settings: LLMSettings) -> LLM:
    """Build an :class:`LLM` whose engine comes from ``create_engine`` (stages accept another factory in tests)."""
    return LLM(settings)


__all__ = ["LLM", "CallStats", "LLMSettings", "add_llm_options", "default_llm_factory",
           "map_bounded", "settings_from_args"]
