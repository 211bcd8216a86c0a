"""The evaluator's models: the model under test, the seeker simulator and the scorer, each on any engine backend.

This is the ONE module of ``evaluator`` that imports the judge engines, the model store (``judge.engines``,
``judge.model_store``) and the cached generate -> validate -> retry wrapper the dataset pipeline also uses
(``data_builder.llm``, on :mod:`judge.generation`).

A role is configured by a :class:`ModelSpec` (``--model*``, ``--simulator*``, ``--scorer*`` flags, generated from the
dataclass's fields by :func:`add_role_options`). ``model`` is ``default`` (the embedded SmolLM2-135M-Instruct), a
local HF folder, a policy checkpoint (a PEFT adapter folder such as ``policy_trainer``'s ``OUT/final``, or the run
folder ``OUT`` itself: the base comes from its ``adapter_config.json``), or, with ``backend openai``, the model name
an OpenAI-compatible server serves at ``base_url``. Roles whose specs name the same weights share one engine, so
their requests are batched together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from data_builder.llm import LLM, LLMSettings
from judge.engines import BACKENDS, create_engine
from judge.engines.base import Engine, EngineConfig, EngineError, GenParams, GenResult, Message
from judge.engines.settings import OpenAISettings
from judge.generation import Validated
from judge.model_store import DEFAULT_MODEL, DEFAULT_MODEL_NAME, NO_ADAPTER, adapter_id, resolve_model

log = logging.getLogger(__name__)

ROLES = ("model", "simulator", "scorer")


@dataclass(frozen=True)
class ModelSpec:
    """Which model plays a role and how it samples (one set of ``--<role>-*`` flags)."""

    model: str = field(default=DEFAULT_MODEL, metadata={
        "help": "'default' (embedded SmolLM2-135M), a local HF folder, a policy checkpoint (adapter folder or "
                "policy_trainer run folder), or the served model name (backend openai)"})
    backend: str = field(default="transformers", metadata={"help": f"engine: {', '.join(BACKENDS)}"})
    adapter: str | None = field(default=None, metadata={"help": "a PEFT LoRA folder applied on top of the model; "
                                                                 "'none': the model alone (no checkpoint look-up)"})
    base_url: str | None = field(default=None, metadata={"help": "OpenAI-compatible endpoint, e.g. "
                                                                   "http://host:8000/v1 (backend openai)"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "env var holding the API key (openai)"})
    openai_regex: bool = field(default=False, metadata={
        "help": "the endpoint is a vLLM server that takes structured-output regexes (backend openai)"})
    max_tokens: int = field(default=256, metadata={"help": "new tokens per generation"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature (0 = greedy)"})
    device: str = field(default="auto", metadata={"help": "transformers/vllm device: auto, cpu, cuda"})
    max_retries: int = field(default=2, metadata={"help": "re-generations of an output in the wrong format"})

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.backend == "openai" and not self.base_url:
            raise ValueError("backend openai needs base_url (--<role>-base-url http://host:8000/v1)")
        if self.max_tokens < 1 or self.max_retries < 0 or self.temperature < 0:
            raise ValueError("max_tokens must be >= 1, max_retries >= 0 and temperature >= 0")


def add_role_options(parser: argparse.ArgumentParser, role: str, **defaults: Any) -> None:
    """Add ``--<role>`` (the model) and ``--<role>-<field>`` for every other :class:`ModelSpec` field."""
    group = parser.add_argument_group(f"{role} (the {'model under test' if role == 'model' else role})")
    for f in fields(ModelSpec):
        flag = f"--{role}" if f.name == "model" else f"--{role}-{f.name.replace('_', '-')}"
        default = defaults.get(f.name, f.default)
        if f.type in ("bool", bool):
            group.add_argument(flag, dest=f"{role}__{f.name}", action=argparse.BooleanOptionalAction,
                               default=default, help=f.metadata["help"])
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        group.add_argument(flag, dest=f"{role}__{f.name}", type=kind, default=default,
                           help=f"{f.metadata['help']} (default: {default})")


def spec_from_args(args: argparse.Namespace, role: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``role`` from flags added by :func:`add_role_options`."""
    return ModelSpec(**{f.name: getattr(args, f"{role}__{f.name}") for f in fields(ModelSpec)})


@dataclass(frozen=True)
class ResolvedModel:
    """What an engine loads: the base folder (or served name), the adapter, and the identity used in cache keys."""

    backend: str
    path: str
    model_id: str
    revision: str
    adapter: str | None = None
    adapter_id: str | None = None

    @property
    def identity(self) -> str:
        """``model_id`` plus the adapter's id: what results name and what separates cache entries."""
        return f"{self.model_id}+{self.adapter_id}" if self.adapter_id else self.model_id


def _checkpoint_adapter(folder: Path) -> Path | None:
    for candidate in (folder, folder / "final"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    return None


def resolve_spec(spec: ModelSpec) -> ResolvedModel:
    """Find the weights of a spec (nothing is downloaded). Raises ``FileNotFoundError`` / ``ValueError``."""
    if spec.backend == "openai":
        if spec.model == DEFAULT_MODEL:
            raise ValueError("backend openai needs the served model's name (--<role> NAME), not 'default'")
        return ResolvedModel("openai", "", spec.model, f"openai:{spec.base_url}")
    bare = spec.adapter == NO_ADAPTER  # 'none': the model alone, even where a folder holds a policy checkpoint
    adapter = None if bare else spec.adapter
    base = spec.model
    found = _checkpoint_adapter(Path(spec.model)) if spec.model != DEFAULT_MODEL and adapter is None and not bare \
        else None
    if found is not None:  # a policy checkpoint: the base named by the adapter
        adapter = str(found)
        cfg = json.loads((found / "adapter_config.json").read_text(encoding="utf-8"))
        base = str(cfg.get("base_model_name_or_path") or "")
        if not Path(base).is_dir():
            if base not in (DEFAULT_MODEL_NAME, DEFAULT_MODEL, ""):
                raise FileNotFoundError(f"the adapter {found} names base model {base!r}, which is not a local folder; "
                                        "pass the base with --<role> BASE --<role>-adapter ADAPTER")
            base = DEFAULT_MODEL
    ref = resolve_model(base)
    aid = adapter_id(adapter) if adapter else None
    return ResolvedModel(spec.backend, ref.path, ref.model_id, ref.revision, adapter, aid)


def _engine_key(spec: ModelSpec, resolved: ResolvedModel) -> tuple[str, ...]:
    return (spec.backend, resolved.path, resolved.identity, spec.base_url or "", spec.device, str(spec.openai_regex))


class _SharedEngine(Engine):
    """A role's view of a pooled engine: starting it starts the real one once; stopping is the pool's job."""

    def __init__(self, pool: EnginePool, real: Engine) -> None:
        super().__init__(real.config)
        self._pool = pool
        self.real = real
        self.name = real.name
        self.supports_regex = real.supports_regex
        self.supports_line_bound = real.supports_line_bound

    async def start(self) -> None:
        await self._pool.ensure_started(self.real)

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        return await self.real.generate(messages, params, request_id)

    async def stop(self) -> None:
        """The pool stops the real engine (:meth:`EnginePool.aclose`)."""

    def healthy(self) -> bool:
        return self._pool.started(self.real) and self.real.healthy()


class EnginePool:
    """Engines shared by roles with the same weights, started lazily (on a role's first cache miss) and once."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, ...], Engine] = {}
        self._started: set[int] = set()
        self._locks: dict[int, asyncio.Lock] = {}

    def engine_for(self, spec: ModelSpec, resolved: ResolvedModel) -> _SharedEngine:
        """The pooled engine of these weights (built, not started, on first request)."""
        key = _engine_key(spec, resolved)
        if key not in self._engines:
            openai = OpenAISettings(base_url=spec.base_url, api_key=os.environ.get(spec.api_key_env),
                                    model=spec.model if spec.backend == "openai" else None, regex=spec.openai_regex)
            self._engines[key] = create_engine(EngineConfig(
                backend=spec.backend, model_path=resolved.path, model_id=resolved.identity, revision=resolved.revision,
                adapter=resolved.adapter, adapter_id=resolved.adapter_id, device=spec.device, openai=openai))
        return _SharedEngine(self, self._engines[key])

    def add(self, engine: Engine) -> _SharedEngine:
        """Pool an engine built elsewhere (tests pass fakes this way)."""
        self._engines[("external", str(id(engine)))] = engine
        return _SharedEngine(self, engine)

    def started(self, engine: Engine) -> bool:
        return id(engine) in self._started

    async def ensure_started(self, engine: Engine) -> None:
        lock = self._locks.setdefault(id(engine), asyncio.Lock())
        async with lock:
            if id(engine) not in self._started:
                log.info("starting the %s engine for %s", engine.name, engine.config.model_id)
                await engine.start()
                self._started.add(id(engine))

    async def aclose(self) -> None:
        """Stop every engine this pool started."""
        for engine in self._engines.values():
            if id(engine) in self._started:
                await engine.stop()
                self._started.discard(id(engine))


class ChatRole:
    """One role's model behind the cached, validating generate loop.

    ``ask`` never makes up an answer: a reply the validator rejects after the retries comes back with
    ``value is None`` (and ``error``); an engine failure raises :class:`EngineError`. Identical asks in flight at
    once (same messages, sampling and validator: two dialogues that coincide) share one generation, as a later
    identical ask shares the cached one.
    """

    def __init__(self, role: str, spec: ModelSpec, engine: Engine, identity: str, cache_dir: Path | None,
                 seed: int = 0) -> None:
        self.role = role
        self.spec = spec
        self.identity = identity
        self.engine = engine
        self.llm = LLM(LLMSettings(backend=spec.backend, model=identity, max_retries=spec.max_retries,
                                   cache_dir=cache_dir, seed=seed), engine=engine)
        self._inflight: dict[str, asyncio.Future[Validated[Any]]] = {}

    @property
    def supports_regex(self) -> bool:
        return self.engine.supports_regex

    async def ask(self, messages: list[Message], validate: Any, request_id: str, *,
                  regex: str | None = None) -> Validated[Any]:
        """Generate, validate, retry, cache; raise :class:`EngineError` when the engine fails."""
        params = GenParams(max_tokens=self.spec.max_tokens, temperature=self.spec.temperature,
                           regex=regex if self.supports_regex else None)
        key = json.dumps([messages, asdict(params), getattr(validate, "__qualname__", repr(validate))],
                         sort_keys=True, ensure_ascii=False)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self.llm.complete(messages, params, validate, request_id))
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        done = await asyncio.shield(task)
        if done.error and done.error.startswith("engine_error"):
            raise EngineError(done.error)
        return done


@dataclass
class Roles:
    """The three roles of a run and the pool their engines live in."""

    model: ChatRole
    simulator: ChatRole
    scorer: ChatRole
    pool: EnginePool

    async def aclose(self) -> None:
        await self.pool.aclose()


def build_roles(specs: dict[str, ModelSpec], cache_dir: Path | None, seed: int = 0) -> Roles:
    """Resolve the three specs, pool their engines (same weights -> one engine) and wrap each in a :class:`ChatRole`."""
    pool = EnginePool()
    built = {}
    for role in ROLES:
        resolved = resolve_spec(specs[role])
        built[role] = ChatRole(role, specs[role], pool.engine_for(specs[role], resolved), resolved.identity,
                               cache_dir, seed)
    return Roles(built["model"], built["simulator"], built["scorer"], pool)


def roles_from_engines(engines: dict[str, Engine], specs: dict[str, ModelSpec] | None = None,
                       cache_dir: Path | None = None, seed: int = 0) -> Roles:
    """Roles on already-built engines (tests use fake engines; one engine object may play several roles)."""
    pool = EnginePool()
    shared: dict[int, _SharedEngine] = {}
    built = {}
    for role in ROLES:
        eng = engines[role]
        if id(eng) not in shared:
            shared[id(eng)] = pool.add(eng)
        spec = (specs or {}).get(role, ModelSpec())
        built[role] = ChatRole(role, spec, shared[id(eng)], eng.config.model_id or eng.name, cache_dir, seed)
    return Roles(built["model"], built["simulator"], built["scorer"], pool)


__all__ = ["ROLES", "ChatRole", "Engine", "EngineConfig", "EngineError", "EnginePool", "GenParams",
           "GenResult", "Message", "ModelSpec", "ResolvedModel", "Roles", "add_role_options", "build_roles",
           "resolve_spec", "roles_from_engines", "spec_from_args"]
