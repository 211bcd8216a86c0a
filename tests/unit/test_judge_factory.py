"""The judge factory (:mod:`judge.factory`): the one place that resolves a model + adapter for an engine and builds,
starts and stops engines, and the settings every offline command shares (issue 28, item 1)."""

from __future__ import annotations

import argparse
import ast
import asyncio
import sys
from pathlib import Path

import pytest

from judge.engines.base import EngineConfig
from judge.engines.settings import OpenAISettings
from judge.factory import (
    DEFAULT_BACKEND,
    JUDGE,
    PLAIN,
    EngineChoice,
    LazyEngine,
    engine_config,
    open_engine,
    resolve_engine,
)
from judge.generation import DEFAULT_MAX_RETRIES
from judge.settings import add_arguments, from_namespace
from tests.fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parents[2]
#: the product packages and the benchmarks: none but judge/ builds an engine or resolves a model for one
PRODUCT = ("cer", "judge", "reward_server", "reward_trainer", "data_builder", "policy_trainer", "evaluator",
           "compeer_loop", "compeer_cli", "bench")
#: calls only the factory (and the model store's own CLI) may make
FACTORY_ONLY = {"create_engine": ("judge/factory.py", "judge/engines/__init__.py"),
                "resolve_judge": ("judge/factory.py", "judge/model_store.py")}


def _calls(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in FACTORY_ONLY:
                out.append((node.lineno, name))
    return out


def test_engines_are_built_and_judges_resolved_only_in_the_factory() -> None:
    """``create_engine(`` and ``resolve_judge(`` outside judge/factory.py (their homes aside) fail: a package that
    runs an engine goes through :mod:`judge.factory`."""
    bad = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            bad += [f"{rel}:{line} calls {name}" for line, name in _calls(path) if rel not in FACTORY_ONLY[name]]
    assert bad == []


def test_the_check_sees_a_copy(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from judge import engines\nfrom judge.model_store import resolve_judge\n"
                   "def f(c):\n    return engines.create_engine(c), resolve_judge('default', 'none')\n")
    assert sorted(n for _, n in _calls(src)) == ["create_engine", "resolve_judge"]


def test_engine_choice_flags_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """One set of flags from the dataclass, the same defaults as the settings; env and flags as judge.settings."""
    monkeypatch.delenv("COMPEER_BACKEND", raising=False)
    monkeypatch.delenv("COMPEER_MAX_RETRIES", raising=False)
    p = argparse.ArgumentParser()
    add_arguments(p, EngineChoice)
    flags = {a for action in p._actions for a in action.option_strings}
    assert {"--backend", "--model", "--device", "--base-url", "--api-key-env", "--max-retries"} <= flags
    choice = from_namespace(EngineChoice, p.parse_args([]))
    assert choice == EngineChoice() and choice.backend == DEFAULT_BACKEND == "transformers"
    assert choice.max_retries == DEFAULT_MAX_RETRIES
    monkeypatch.setenv("COMPEER_MAX_RETRIES", "5")
    p = argparse.ArgumentParser()
    add_arguments(p, EngineChoice)
    assert from_namespace(EngineChoice, p.parse_args([])).max_retries == 5
    with pytest.raises(ValueError, match="base_url"):
        EngineChoice(backend="openai")
    with pytest.raises(ValueError, match="max-retries"):
        EngineChoice(max_retries=-1)


def test_role_prefixed_flags_and_their_own_defaults() -> None:
    """Under a prefix the model's flag is the prefix itself (``--scorer``); a role states its own defaults."""
    from evaluator.backends import ModelSpec

    p = argparse.ArgumentParser()
    add_arguments(p, ModelSpec, prefix="scorer-", defaults={"max_tokens": 96})
    a = p.parse_args(["--scorer", "m", "--scorer-backend", "openai", "--scorer-base-url", "http://x/v1"])
    spec = from_namespace(ModelSpec, a, prefix="scorer-")
    assert (spec.model, spec.backend, spec.max_tokens) == ("m", "openai", 96)
    with pytest.raises(TypeError, match="no setting"):
        add_arguments(argparse.ArgumentParser(), ModelSpec, defaults={"absent": 1})


def test_the_loop_plan_flags_come_from_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compeer-loop plan``'s flags are generated from LoopSettings (lists, optional ints, both forms of a bool)."""
    from compeer_loop.cli import make_parser
    from compeer_loop.plan import LoopSettings

    for name in ("COMPEER_STEPS", "COMPEER_ARMS", "COMPEER_STATIC_CACHE", "COMPEER_EVAL_LIMIT", "COMPEER_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    args = make_parser().parse_args(["plan", "--root", "r", "--steps", "5", "--arms", "a", "b", "--no-static-cache",
                                     "--eval-limit", "3"])
    s = from_namespace(LoopSettings, args)
    assert (s.steps, s.arms, s.static_cache, s.eval_limit, s.max_concurrent_arms) == (5, ["a", "b"], False, 3, None)
    assert from_namespace(LoopSettings, make_parser().parse_args(["plan", "--root", "r", "--static-cache"])) == \
        LoopSettings()
    monkeypatch.setenv("COMPEER_ARMS", "a,c")
    assert from_namespace(LoopSettings, make_parser().parse_args(["plan", "--root", "r"])).arms == ["a", "c"]


def test_the_server_default_backend_differs_with_a_stated_reason() -> None:
    from judge.settings import options

    server = {o.flag: o for o in options(EngineConfig)}["--backend"]
    assert server.default == "vllm" and "offline commands default to transformers" in server.help


def test_openai_resolution_needs_a_served_name_and_no_adapter() -> None:
    config = engine_config(EngineChoice(backend="openai", model="served", base_url="http://h/v1"))
    done = resolve_engine(config, "served", None)
    assert (done.model_id, done.revision, done.adapter, done.openai.model) == ("served", "openai:http://h/v1", None,
                                                                              "served")
    with pytest.raises(ValueError, match="served model"):
        resolve_engine(EngineConfig(backend="openai", openai=OpenAISettings(base_url="http://h/v1")), "default")
    with pytest.raises(ValueError, match="--adapter"):
        resolve_engine(config, "served", "/some/adapter")
    with pytest.raises(ValueError, match="role"):
        resolve_engine(config, "served", role="policy")


def test_plain_resolution_of_a_folder_and_a_policy_checkpoint(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text(f'{{"base_model_name_or_path": "{base}"}}')
    (final / "adapter_model.safetensors").write_bytes(b"w")
    cpu = EngineConfig(backend="transformers", device="cpu")
    plain = resolve_engine(cpu, str(base), None, role=PLAIN)
    assert plain.model_path == str(base) and plain.adapter is None and plain.precision == "cpu:float32"
    found = resolve_engine(cpu, str(tmp_path / "run"), None, role=PLAIN)
    assert found.model_path == str(base) and found.adapter == str(final)
    assert found.adapter_id is not None and found.adapter_id.startswith("final@sha256:")
    assert resolve_engine(cpu, str(tmp_path / "run" / "final"), "none", role=PLAIN).adapter is None


def test_judge_resolution_adapter_none_is_the_bare_folder(tmp_path: Path) -> None:
    """``--adapter none`` on a folder judge serves it bare; a PEFT folder is loaded at run time, named by its id."""
    base = tmp_path / "judge"
    base.mkdir()
    (base / "config.json").write_text("{}")
    cpu = EngineConfig(backend="transformers", device="cpu")
    bare = resolve_engine(cpu, str(base), "none", role=JUDGE)
    assert bare.model_path == str(base) and bare.adapter is None and bare.adapter_id is None
    with pytest.raises(FileNotFoundError, match="PEFT"):
        resolve_engine(cpu, str(base), str(tmp_path), role=JUDGE)


async def test_open_engine_starts_and_stops_the_built_engine() -> None:
    built: list[FakeEngine] = []

    def build(config: EngineConfig) -> FakeEngine:
        built.append(FakeEngine(lambda m, p: "ok", config=config))
        return built[-1]

    async with open_engine(EngineConfig(backend="transformers", model_id="m"), build) as engine:
        assert engine is built[0] and engine.healthy() and engine.config.model_id == "m"
    assert not built[0].healthy()


async def test_lazy_engine_starts_once_and_stops_only_its_own() -> None:
    builds = []

    def build(config: EngineConfig) -> FakeEngine:
        builds.append(FakeEngine(lambda m, p: "ok", config=config))
        return builds[-1]

    lazy = LazyEngine(EngineConfig(backend="transformers", model_id="m"), build)
    assert lazy.engine is None and lazy.config.model_id == "m"
    first, second = await asyncio.gather(lazy.get(), lazy.get())
    assert first is second and len(builds) == 1 and lazy.started
    await lazy.aclose()
    assert not first.healthy() and not lazy.started
    outside = FakeEngine(lambda m, p: "ok")
    await outside.start()
    borrowed = LazyEngine(outside)
    assert await borrowed.get() is outside
    await borrowed.aclose()
    assert outside.healthy()  # not its own: never stopped here


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
