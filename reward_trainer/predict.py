"""Run held-out judge items through the serving judge: :class:`judge.conversation.Judge` on an engine made by
:mod:`judge.factory` (base model, or base + a PEFT adapter). Nothing here builds a prompt or
parses a verdict: the Judge does both, exactly as the reward service does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Preference, Verdict
from judge.conversation import Judge
from judge.engines.base import Engine, EngineConfig, EngineError
from judge.factory import PLAIN, EngineChoice, engine_config, resolve_engine
from judge.factory import open_engine as factory_open_engine
from judge.model_store import NO_ADAPTER
from judge.protocol import (
    DEFAULT_TEMPLATE,
    PREFERENCE,
    REPLY,
    STEP_COMPONENTS,
    JudgeSettings,
    load_template,
    mode_components,
)
from judge.verdict_probs import LabelDistribution

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalItem:
    """One held-out judge item with its gold verdicts."""

    key: str
    history: list[Turn]
    reference: str | None
    candidate: str
    gold: dict[str, Verdict]


@dataclass
class Prediction:
    """What the judge said about one item (None = no parsable verdict for that component), with its label
    probabilities when the judge is graded (``probs``: tempered by its verdict temperature; None where missing)."""

    key: str
    verdicts: dict[str, Verdict | None]
    texts: list[str] = field(default_factory=list)
    generations: int = 0
    error: str | None = None
    probs: dict[str, LabelDistribution | None] = field(default_factory=dict)


def components_of(variant: str) -> tuple[str, ...]:
    """The components a variant's judge decides (see :func:`judge.protocol.mode_components`)."""
    return mode_components(JudgeMode(variant))


def item_key(dialogue_id: str, candidate: str) -> str:
    """Stable id of a (dialogue, candidate) pair, shared by the variants' sets (used to join them)."""
    return f"{dialogue_id}:{hashlib.sha256(candidate.encode('utf-8')).hexdigest()[:12]}"


def gold_of(labels: dict[str, Any]) -> dict[str, Verdict]:
    """The emit schema's ``labels`` column as verdicts (components absent or null are left out)."""
    out: dict[str, Verdict] = {}
    for c in (*STEP_COMPONENTS, REPLY):
        if labels.get(c) is not None:
            out[c] = bool(labels[c])
    if labels.get(PREFERENCE) is not None:
        out[PREFERENCE] = Preference(labels[PREFERENCE])
    return out


def items_from_rows(rows: Any, max_items: int | None = None) -> list[EvalItem]:
    """EvalItems from a split of the judge SFT set (any iterable of emit-schema rows)."""
    items: list[EvalItem] = []
    for row in rows:
        if max_items is not None and len(items) >= max_items:
            break
        history = [Turn.from_dict({"role": t["role"], "text": t["text"]}) for t in row["history"]]
        items.append(EvalItem(item_key(row["dialogue_id"], row["candidate"]), history, row["reference"],
                              row["candidate"], gold_of(row["labels"])))
    return items


@dataclass(frozen=True)
class JudgeRuntime:
    """How judges are run for evaluation: the engine choice (:class:`judge.factory.EngineChoice`: backend, base
    model, device, endpoint), the micro-batch, the template and taxonomy, and the judge's sampling policy.

    The judge's retries are ``settings.max_retries`` (``compeer-train`` fills it from ``--max-retries``, which it
    parses into ``engine`` with the other engine flags); ``engine.max_retries`` is not read here.
    """

    engine: EngineChoice = field(default_factory=EngineChoice)
    max_batch: int = 32
    template: str = DEFAULT_TEMPLATE
    taxonomy: str | None = None
    settings: JudgeSettings = field(default_factory=lambda: JudgeSettings(seed=0))
    concurrency: int = 32
    #: the judge engine's rationale bound (:attr:`judge.engines.base.EngineConfig.rationale_bound`; auto: the backend's)
    rationale_bound: str = "auto"


def engine_of(runtime: JudgeRuntime, adapter: str | None, model: str | None = None,
              backend: str | None = None) -> EngineConfig:
    """The resolved engine config of the base model (``model``: another than the runtime's) + ``adapter`` (a PEFT
    folder; None: the bare base). ``default`` is the plain base judge adapters are trained on
    (:data:`judge.factory.PLAIN`)."""
    choice = replace(runtime.engine, model=model or runtime.engine.model, backend=backend or runtime.engine.backend)
    # the bound is the judge engine's: another backend (e.g. the auditor's) keeps its own default
    bound = runtime.rationale_bound if choice.backend == runtime.engine.backend else "auto"
    config = engine_config(choice, max_batch=runtime.max_batch, rationale_bound=bound)
    return resolve_engine(config, choice.model, adapter or NO_ADAPTER, role=PLAIN)


def model_ref(runtime: JudgeRuntime, model: str | None = None) -> EngineConfig:
    """The resolved base model (its ``model_id``, ``revision``, ``model_path``), without an adapter."""
    return engine_of(runtime, None, model)


@asynccontextmanager
async def open_engine(runtime: JudgeRuntime, adapter: str | None, model: str | None = None,
                      backend: str | None = None) -> AsyncIterator[Engine]:
    """A started engine on the base model (+ ``adapter``), stopped on exit (:func:`judge.factory.open_engine`)."""
    async with factory_open_engine(engine_of(runtime, adapter, model, backend)) as engine:
        yield engine


def make_judge(engine: Engine, runtime: JudgeRuntime) -> Judge:
    """The serving judge on ``engine`` with the runtime's template, taxonomy and settings."""
    return Judge(engine, load_template(runtime.template), load_taxonomy(runtime.taxonomy), runtime.settings)


async def predict(judge: Judge, items: list[EvalItem], variant: str, concurrency: int = 32) -> list[Prediction]:
    """Judge every item in the variant's mode, ``concurrency`` items at a time (the engine batches them)."""
    mode = JudgeMode(variant)
    wanted = components_of(variant)
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(item: EvalItem) -> Prediction:
        async with gate:
            parsed = parse(item.candidate)
            try:
                cj = await judge.judge(item.history, item.reference, parsed, mode)
            except EngineError as exc:
                log.warning("judge failed on item %s: %s", item.key, type(exc).__name__)
                return Prediction(item.key, {c: None for c in wanted}, error=f"engine_error: {exc}")
            return Prediction(item.key, {c: cj.verdicts.get(c) for c in wanted}, cj.texts, cj.generations,
                              probs={c: cj.probs.get(c) for c in wanted} if judge.graded else {})

    preds = await asyncio.gather(*(one(it) for it in items))
    failed = sum(1 for p in preds for v in p.verdicts.values() if v is None)
    log.info("%s judge: %d items, %d components without a verdict", variant, len(preds), failed)
    return list(preds)


__all__ = ["EvalItem", "JudgeRuntime", "Prediction", "components_of", "engine_of", "gold_of", "item_key", "items_from_rows",
           "make_judge", "model_ref", "open_engine", "predict"]
