"""The one judge factory: which model and adapter an engine serves, resolved from a user's settings, and the engine
built, started and stopped.

Every package that runs an engine (``reward_server``, ``data_builder``, ``evaluator``, ``reward_trainer``) goes
through here: nothing else calls :func:`judge.engines.create_engine` or resolves a model for an engine
(``tests/unit/test_judge_factory.py`` fails on a copy). A new backend is added in :mod:`judge.engines` (and its
settings in :mod:`judge.engines.settings`); a new base model in :mod:`judge.bases`; neither touches a caller.

* :class:`EngineChoice`: the typed settings every offline command that runs an engine shares (``--backend``,
  ``--model``, ``--device``, ``--base-url``, ``--api-key-env``, ``--max-retries``); their flags and environment
  variables come from its fields (:mod:`judge.settings`). The reward server has the same choices as fields of its
  :class:`reward_server.config.ServerConfig` (``--model``, ``--adapter`` and the nested
  :class:`judge.engines.base.EngineConfig`), with its own default backend (see :data:`DEFAULT_BACKEND`).
* :func:`engine_config`: an :class:`EngineChoice` as an (unresolved) :class:`EngineConfig`.
* :func:`resolve_engine`: an :class:`EngineConfig` with its model, adapter, identity and precision filled in.
* :func:`open_engine` (started, stopped on exit) and :class:`LazyEngine` (started on first use, once).

What ``default`` stands for depends on what the engine serves (``role``): :data:`JUDGE` (a judge is served: the
device's default judge base, with its shipped judge adapter merged unless ``--adapter none``;
:func:`judge.model_store.resolve_judge`) or :data:`PLAIN` (a plain chat model or the base a judge adapter was trained
on: SmolLM2-135M-Instruct, :func:`judge.model_store.resolve_model`, with an adapter only when one is named; a folder
holding a policy checkpoint brings its adapter unless ``--adapter none``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from judge.engines import BACKENDS, create_engine
from judge.engines.base import Engine, EngineConfig
from judge.engines.settings import OpenAISettings, TransformersSettings
from judge.generation import check_max_retries, max_retries_setting
from judge.model_store import (
    DEFAULT_ADAPTER,
    DEFAULT_MODEL,
    DEFAULT_MODEL_NAME,
    NO_ADAPTER,
    ModelRef,
    adapter_id,
    merge_adapter,
    resolve_judge,
    resolve_model,
)
from judge.settings import setting

log = logging.getLogger(__name__)

#: What ``--model default`` stands for: a served judge (the device's default judge base + its shipped adapter) or a
#: plain model (SmolLM2-135M-Instruct: policies, the evaluator's roles, the base judge adapters are trained on).
JUDGE, PLAIN = "judge", "plain"
#: ``--backend`` of the offline commands (dataset pipeline, evaluator, judge evaluation): transformers runs on any
#: machine with no vLLM install, for a few thousand calls per run. The reward server's default is vllm
#: (:attr:`judge.engines.base.EngineConfig.backend`): a long-running service under many concurrent requests, where
#: vLLM's continuous batching serves more judgments per second (README, "Which judge").
DEFAULT_BACKEND = "transformers"


@dataclass(frozen=True)
class EngineChoice:
    """Which model answers and on what engine: the flags every offline command that runs an engine shares."""

    backend: str = setting(DEFAULT_BACKEND, choices=BACKENDS,
                           help="engine backend (transformers: runs anywhere; the reward server's default is vllm)")
    model: str = setting(DEFAULT_MODEL, bare=True,
                         help="'default' (embedded SmolLM2-135M-Instruct), a base name, a local HF folder, a policy "
                              "checkpoint (adapter folder or policy_trainer run folder), or the served model name "
                              "(backend openai)")
    device: str = setting("auto", help="engine device: auto | cpu | cuda | cuda:N")
    base_url: str | None = setting(None, help="OpenAI-compatible endpoint, e.g. http://host:8000/v1 (backend openai)")
    api_key_env: str = setting("OPENAI_API_KEY", help="env var holding the API key (backend openai)")
    max_retries: int = max_retries_setting()

    def __post_init__(self) -> None:
        check_choice(self.backend, self.base_url, self.max_retries)


def check_choice(backend: str, base_url: str | None, max_retries: int) -> None:
    """ValueError naming the flag when a backend is unknown, openai lacks an endpoint or retries are negative."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "openai" and not base_url:
        raise ValueError("backend openai needs base_url (--base-url, or --<role>-base-url in compeer-eval: an "
                         "OpenAI-compatible /v1 endpoint such as http://host:8000/v1)")
    check_max_retries(max_retries, "--max-retries")  # the one check of every command's --max-retries


def engine_config(choice: EngineChoice, *, seed: int = 0, max_batch: int | None = None,
                  openai_regex: bool = False, rationale_bound: str = "auto") -> EngineConfig:
    """The (unresolved) :class:`EngineConfig` of ``choice``: backend, device, seed and, for openai, the endpoint,
    the key read from ``choice.api_key_env`` and the served model name; ``max_batch``: the transformers engine's
    micro-batch (None: its default); ``rationale_bound``: :attr:`EngineConfig.rationale_bound` (the judging
    commands' ``--rationale-bound``)."""
    openai = OpenAISettings(base_url=choice.base_url, api_key=os.environ.get(choice.api_key_env),
                            model=choice.model if choice.backend == "openai" else None, regex=openai_regex)
    transformers = TransformersSettings() if max_batch is None else TransformersSettings(max_batch=max_batch)
    return EngineConfig(backend=choice.backend, device=choice.device, seed=seed, openai=openai,
                        transformers=transformers, rationale_bound=rationale_bound)


def checkpoint_adapter(folder: Path) -> Path | None:
    """The PEFT adapter a policy checkpoint folder holds (itself, or ``final/`` of a policy_trainer run)."""
    for candidate in (folder, folder / "final"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    return None


def _plain(model: str, adapter: str | None, dtype: str) -> tuple[str, str, str, str | None]:
    """``(path, model id, revision, runtime adapter)`` of a plain model (+ adapter); see the module's doc."""
    bare = adapter == NO_ADAPTER
    runtime = None if bare or adapter == DEFAULT_ADAPTER else adapter
    base = model
    found = checkpoint_adapter(Path(model)) if model != DEFAULT_MODEL and runtime is None and not bare else None
    if found is not None:  # a policy checkpoint: the base named by the adapter
        runtime = str(found)
        cfg = json.loads((found / "adapter_config.json").read_text(encoding="utf-8"))
        base = str(cfg.get("base_model_name_or_path") or "")
        if not Path(base).is_dir():
            if base not in (DEFAULT_MODEL_NAME, DEFAULT_MODEL, ""):
                raise FileNotFoundError(f"the adapter {found} names base model {base!r}, which is not a local folder; "
                                        "pass the base as the model and the checkpoint as its adapter")
            base = DEFAULT_MODEL
    ref = resolve_model(base, dtype)
    return ref.path, ref.model_id, ref.revision, runtime


def resolve_engine(config: EngineConfig, model: str, adapter: str | None = None, *, role: str = JUDGE) -> EngineConfig:
    """``config`` with the model it serves resolved: ``model_path``, ``model_id``, ``revision``, ``adapter`` (a folder
    loaded at run time or None), ``adapter_id`` and ``precision`` (the device kind and dtype ``auto`` stood for).

    ``model``: ``default``, a base name or an HF folder (:data:`JUDGE` / :data:`PLAIN` say what ``default`` is);
    with the openai backend, the served model's name (``config.openai.model`` wins). ``adapter``: ``default`` (for a
    judge, the shipped adapter merged into the weights; for a plain model, none), ``none`` (the bare model, never a
    checkpoint's adapter), a PEFT folder, or None (unset: as ``default``). Nothing is downloaded. Raises ValueError /
    FileNotFoundError naming the flag to fix.
    """
    if role not in (JUDGE, PLAIN):
        raise ValueError(f"role {role!r}: expected {JUDGE!r} or {PLAIN!r}")
    if config.backend == "openai":
        if adapter not in (None, DEFAULT_ADAPTER, NO_ADAPTER):
            raise ValueError("--adapter: the openai backend serves whatever the remote endpoint serves; leave it out")
        name = config.openai.model or model
        if name == DEFAULT_MODEL:
            raise ValueError("--backend openai needs --model <the served model's name> (not 'default')")
        return replace(config, model_id=name, revision=config.revision or f"openai:{config.openai.base_url or ''}",
                       adapter=None, adapter_id=None, openai=replace(config.openai, model=name))
    from judge.device import dtype_name, resolve_device_dtype

    device, torch_dtype = resolve_device_dtype(config.device, config.dtype)
    dtype = dtype_name(torch_dtype)
    if role == JUDGE:
        ref, runtime = resolve_judge(model, adapter or DEFAULT_ADAPTER, dtype, device)
    else:
        path, model_id, revision, runtime = _plain(model, adapter, dtype)
        ref = ModelRef(path, model_id, revision)
    if runtime is not None and config.backend == "vllm" and device == "cpu":
        # vLLM-CPU applies a LoRA at run time many times slower than it serves the same weights merged (docs/
        # reward_trainer.md, "Evaluating an adapter on a CPU"), so an adapter is merged once, as the shipped one is
        ref, runtime = merge_adapter(ref, Path(runtime), dtype), None
    path, model_id, revision, merged = ref.path, ref.model_id, ref.revision, ref.adapter
    return replace(config, model_path=path, model_id=model_id, revision=revision, adapter=runtime,
                   adapter_id=merged or (adapter_id(runtime) if runtime else None),
                   adapter_dir=ref.adapter_dir if merged else runtime,
                   precision=f"{device.split(':')[0]}:{dtype}")


def build_engine(config: EngineConfig) -> Engine:
    """The engine of a resolved ``config`` (not started; its heavy imports happen in ``start``)."""
    return create_engine(config)


@asynccontextmanager
async def open_engine(config: EngineConfig, build: Callable[[EngineConfig], Engine] = build_engine
                      ) -> AsyncIterator[Engine]:
    """A started engine of a resolved ``config``, stopped on exit (``build``: tests pass a fake engine's)."""
    engine = build(config)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


class LazyEngine:
    """An engine started on first use, once, and stopped by :meth:`aclose` only if this object started it.

    ``source`` is a resolved :class:`EngineConfig` (the engine is built on first use) or an engine built elsewhere
    (tests pass fakes). ``own`` (default: True for a config, False for an engine): whether this object starts the
    engine in any case and stops it on close; one it does not own is started only when it is not already healthy,
    and never stopped here.
    """

    def __init__(self, source: EngineConfig | Engine, build: Callable[[EngineConfig], Engine] = build_engine,
                 own: bool | None = None) -> None:
        self._config = source if isinstance(source, EngineConfig) else None
        self._engine = source if isinstance(source, Engine) else None
        self._own = self._engine is None if own is None else own
        self._build = build
        self._started = False
        self._lock = asyncio.Lock()

    @property
    def config(self) -> EngineConfig:
        """The config of the engine (built or to be built)."""
        if self._engine is not None:
            return self._engine.config
        assert self._config is not None
        return self._config

    @property
    def engine(self) -> Engine | None:
        """The engine once built (None before the first :meth:`get` of a config source)."""
        return self._engine

    @property
    def started(self) -> bool:
        """True once :meth:`get` returned."""
        return self._started

    async def get(self) -> Engine:
        """The started engine (built and started on the first call; concurrent callers wait for that one start)."""
        async with self._lock:
            if self._engine is None:
                assert self._config is not None
                log.info("starting the %s engine for %s", self._config.backend, self._config.model_id)
                self._engine = self._build(self._config)
            if not self._started:
                if self._own or not self._engine.healthy():
                    await self._engine.start()
                self._started = True
        return self._engine

    async def aclose(self) -> None:
        """Stop the engine if this object built and started it (idempotent)."""
        if self._engine is not None and self._own and self._started:
            await self._engine.stop()
            self._started = False


__all__ = ["DEFAULT_BACKEND", "JUDGE", "PLAIN", "EngineChoice", "LazyEngine", "build_engine", "check_choice",
           "checkpoint_adapter", "engine_config", "open_engine", "resolve_engine"]
