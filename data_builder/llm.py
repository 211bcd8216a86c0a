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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from data_builder.stage import progress
from judge.engines.base import Engine, GenParams, Message
from judge.factory import PLAIN, EngineChoice, LazyEngine, engine_config, resolve_engine
from judge.generation import DiskCache, RetryPolicy, Validated, generate_validated
from judge.settings import add_arguments, from_namespace, setting

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


def default_cache_dir() -> Path:
    """``$COMPEER_CACHE/data_builder/llm`` (``~/.cache/compeer/data_builder/llm`` by default)."""
    from judge.model_store import cache_dir

    return cache_dir() / "data_builder" / "llm"


@dataclass(frozen=True)
class LLMSettings(EngineChoice):
    """Which model answers, and how: the shared engine choice (:class:`judge.factory.EngineChoice`: ``--backend``,
    ``--model``, ``--device``, ``--base-url``, ``--api-key-env``, ``--max-retries``) plus the pipeline's own flags."""

    retry_temperature: float = setting(0.8, cli=False, help="temperature of a re-generation")
    concurrency: int = setting(4, help="LLM calls in flight")
    cache_dir: Path | None = setting(None, help="LLM cache (none: $COMPEER_CACHE/data_builder/llm)")
    seed: int = setting(0, cli=False, help="engine seed (the stage's --seed)")


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
    """A cached, validating front for an engine made by the judge factory (:mod:`judge.factory`).

    Pass ``engine`` to use an already-built engine (tests use a fake engine this way); otherwise the model is
    resolved from ``settings`` now and the engine built and started on the first cache miss, stopped by
    :meth:`aclose`.
    """

    def __init__(self, settings: LLMSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self._own_engine = engine is None
        self.engine = LazyEngine(engine if engine is not None else
                                 resolve_engine(engine_config(settings, seed=settings.seed), settings.model, role=PLAIN))
        self.stats = CallStats()
        self.cache_dir = settings.cache_dir or default_cache_dir()
        cfg = self.engine.config
        self.model_id = cfg.model_id or cfg.model_path or (engine.name if engine is not None else "")
        self.revision = cfg.revision or ""
        self.cache = DiskCache(self.cache_dir, {"model": self.model_id, "revision": self.revision})
        self.policy = RetryPolicy(max_retries=settings.max_retries, retry_temperature=settings.retry_temperature)

    async def aclose(self) -> None:
        """Stop the engine if this LLM started it."""
        await self.engine.aclose()

    def identity(self) -> dict[str, str]:
        """Which model answers (part of every cache key): backend, model id and revision."""
        engine = self.engine.engine
        backend = self.settings.backend if self._own_engine else engine.name if engine else ""
        return {"backend": backend, "model": self.model_id, "revision": self.revision}

    async def complete(self, messages: Sequence[Message], params: GenParams, validate: Callable[[str], T | None],
                       request_id: str) -> Validated[T]:
        """Generate until ``validate`` accepts the text (at most ``1 + max_retries`` attempts, each cached)."""
        self.stats.calls += 1
        seeded = params if params.seed is not None else dataclasses.replace(params, seed=self.settings.seed)
        result = await generate_validated(self.engine.get, messages, seeded, validate, self.policy, request_id,
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
    """The flags of :class:`LLMSettings` (``--backend``, ``--model``, ``--device``, ``--base-url``, ``--api-key-env``,
    ``--max-retries``, ``--concurrency``, ``--cache-dir``), generated by :mod:`judge.settings`."""
    add_arguments(parser, LLMSettings, title="the LLM that answers")


def settings_from_args(args: argparse.Namespace) -> LLMSettings:
    """LLMSettings from the parsed flags (and the stage's ``--seed``); ValueError naming a flag out of range."""
    settings: LLMSettings = from_namespace(LLMSettings, args)
    return dataclasses.replace(settings, seed=args.seed)


EngineFactory = Callable[[LLMSettings], LLM]


def default_llm_factory(settings: LLMSettings) -> LLM:
    """Build an :class:`LLM` whose engine comes from ``create_engine`` (stages accept another factory in tests)."""
    return LLM(settings)


__all__ = ["LLM", "CallStats", "LLMSettings", "add_llm_options", "default_llm_factory",
           "map_bounded", "settings_from_args"]
