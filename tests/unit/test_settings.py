"""Settings defined once (``judge.settings``): every server setting is reachable from a flag and an environment
variable generated from its dataclass field, defaults live only in the dataclasses, and values are checked."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from cer.modes import JudgeMode
from judge.engines.base import EngineConfig
from judge.engines.settings import OpenAISettings, TransformersSettings, VllmSettings
from judge.settings import options
from reward_server.cli import config_from_args, make_parser
from reward_server.config import ServerConfig

ENV_NAMES = [o.env for o in options(ServerConfig)] + ["COMPEER_LINE_BOUND"]  # and the deprecated name


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _leaf_fields(cls: type, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            out += _leaf_fields(hints[f.name], (*path, f.name))
        elif f.metadata.get("cli", True):
            out.append((*path, f.name))
    return out


def test_every_setting_has_one_flag_and_one_env_name() -> None:
    opts = options(ServerConfig)
    assert [o.path for o in opts] == _leaf_fields(ServerConfig)
    for attr in ("flag", "env", "dest"):
        values = [getattr(o, attr) for o in opts]
        assert len(values) == len(set(values)), f"duplicate {attr}: {sorted(v for v in values if values.count(v) > 1)}"
    flags = {o.path: o.flag for o in opts}
    # the settings the old hand-written CLI could not reach, and the flags documented in docs/reward_server.md
    assert flags[("max_in_flight_groups",)] == "--max-in-flight-groups"
    assert flags[("cache_max_entries",)] == "--cache-max-entries"
    assert flags[("judge", "top_p")] == "--top-p" and flags[("judge", "retry_temperature")] == "--retry-temperature"
    assert flags[("engine", "rationale_bound")] == "--rationale-bound"
    assert flags[("engine", "openai", "base_url")] == "--openai-base-url"
    envs = {o.path: o.env for o in opts}
    assert envs[("redis_url",)] == "REDIS_URL" and envs[("cache",)] == "COMPEER_CACHE_KIND"
    assert "COMPEER_CACHE" not in envs.values()  # the model cache folder (judge.model_store) keeps its name


def test_defaults_come_from_the_dataclasses(clean_env: pytest.MonkeyPatch) -> None:
    config = config_from_args(make_parser().parse_args(["serve"]))
    assert config == ServerConfig()
    assert config.engine.transformers == TransformersSettings() and config.engine.vllm == VllmSettings()


def test_flags_and_env_reach_nested_settings(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COMPEER_MAX_IN_FLIGHT_GROUPS", "7")
    clean_env.setenv("COMPEER_LINE_BOUND", "false")
    clean_env.setenv("COMPEER_TOP_P", "0.5")  # the flag below wins
    a = make_parser().parse_args([
        "serve", "--backend", "transformers", "--cache-max-entries", "12", "--top-p", "0.9",
        "--retry-temperature", "1.1", "--judge-seed", "3", "--static-cache", "--grammar-threads", "2",
        "--default-mode", "prm", "--no-prefix-caching", "--openai-timeout-s", "9", "--max-timeout-ms", "1000"])
    c = config_from_args(a)
    assert c.max_in_flight_groups == 7 and c.cache_max_entries == 12
    assert (c.judge.top_p, c.judge.retry_temperature, c.judge.seed) == (0.9, 1.1, 3)
    assert c.engine.backend == "transformers" and c.engine.seed == 0
    assert c.engine.transformers == TransformersSettings(static_cache=True, grammar_threads=2)
    assert c.engine.rationale_bound == "counted"  # COMPEER_LINE_BOUND=false: the deprecated name of counted
    assert c.engine.vllm.enable_prefix_caching is False and c.engine.openai == OpenAISettings(timeout_s=9.0)
    assert c.default_mode is JudgeMode.PRM and c.limits.max_timeout_ms == 1000


def test_bad_values_are_refused_naming_the_setting(clean_env: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("COMPEER_GRPC_PORT", "fifty")
    with pytest.raises(ValueError, match="COMPEER_GRPC_PORT='fifty': expected int"):
        make_parser()
    clean_env.delenv("COMPEER_GRPC_PORT")
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "--grammar-kernel", "warp"])
    assert "expected one of auto, cpu" in capsys.readouterr().err
    with pytest.raises(ValueError, match="grammar_threads 0: expected an integer >= 1"):
        config_from_args(make_parser().parse_args(["serve", "--grammar-threads", "0"]))
    with pytest.raises(ValueError, match="max_in_flight_groups -1"):
        config_from_args(make_parser().parse_args(["serve", "--max-in-flight-groups", "-1"]))
    assert config_from_args(make_parser().parse_args(["serve", "--log-level", "debug"])).log_level == "debug"
    with pytest.raises(ValueError, match="log_level 'loud'"):
        config_from_args(make_parser().parse_args(["serve", "--log-level", "loud"]))
    with pytest.raises(ValueError, match="gpu_memory_utilization 1.5"):
        EngineConfig(vllm=VllmSettings(gpu_memory_utilization=1.5))
    assert config_from_args(make_parser().parse_args(["serve"])).engine.vllm.max_num_batched_tokens is None
    parsed = config_from_args(make_parser().parse_args(["serve", "--max-num-batched-tokens", "16384"]))
    assert parsed.engine.vllm.max_num_batched_tokens == 16384
    with pytest.raises(ValueError, match="max_num_batched_tokens 0: expected >= 1"):
        config_from_args(make_parser().parse_args(["serve", "--max-num-batched-tokens", "0"]))


def test_one_rationale_bound_for_every_backend_and_its_deprecated_alias(clean_env: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """``--rationale-bound`` is the one setting (the transformers engine's ``--no-line-bound`` was the same concept
    under another name): the old flag and env keep working, each warning once, naming the new spelling."""
    import judge.settings as js

    clean_env.setattr(js, "_warned", set())
    serve = ["serve", "--backend", "transformers"]
    assert config_from_args(make_parser().parse_args(serve)).engine.bound == "line"  # auto: the backend's fastest
    assert config_from_args(make_parser().parse_args(["serve"])).engine.bound == "counted"
    with caplog.at_level("WARNING", logger="judge.settings"):
        for _ in range(2):
            c = config_from_args(make_parser().parse_args([*serve, "--no-line-bound"]))
            assert c.engine.rationale_bound == "counted" and c.engine.bound == "counted"
        assert config_from_args(make_parser().parse_args([*serve, "--line-bound"])).engine.rationale_bound == "line"
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["--no-line-bound is deprecated and will be removed: use --rationale-bound counted",
                      "--line-bound is deprecated and will be removed: use --rationale-bound line"]
    clean_env.setenv("COMPEER_LINE_BOUND", "true")
    assert config_from_args(make_parser().parse_args(serve)).engine.rationale_bound == "line"
    clean_env.setenv("COMPEER_RATIONALE_BOUND", "counted")  # the new name wins over the old one
    assert config_from_args(make_parser().parse_args(serve)).engine.rationale_bound == "counted"
    clean_env.setenv("COMPEER_LINE_BOUND", "maybe")
    clean_env.delenv("COMPEER_RATIONALE_BOUND")
    with pytest.raises(ValueError, match="COMPEER_LINE_BOUND='maybe': expected one of false, true"):
        make_parser()


def test_judge_settings_are_validated_where_they_are_defined() -> None:
    """JudgeSettings checks itself (not only the server's config), so every command that builds them gets the same
    checks; ``--max-retries`` has one range everywhere (judge.generation.check_max_retries)."""
    from judge.factory import EngineChoice
    from judge.generation import RetryPolicy
    from judge.protocol import JudgeSettings

    for bad, match in (({"max_retries": 11}, "judge max_retries 11: expected 0-10"),
                       ({"top_p": 0.0}, "judge top_p 0.0"), ({"temperature": -1.0}, "temperatures"),
                       ({"max_tokens_per_component": 4}, "max_tokens_per_component 4"),
                       ({"rationale_max_chars": 0}, "rationale_max_chars 0")):
        with pytest.raises(ValueError, match=match):
            JudgeSettings(**bad)
    with pytest.raises(ValueError, match="judge max_retries 11: expected 0-10"):
        config_from_args(make_parser().parse_args(["serve", "--max-retries", "11"]))
    for make in (lambda: EngineChoice(max_retries=11), lambda: RetryPolicy(max_retries=11)):
        with pytest.raises(ValueError, match="11: expected 0-10"):
            make()


@pytest.mark.parametrize("module", ["compeer_loop.cli", "data_builder.cli", "evaluator.cli", "policy_trainer.cli",
                                    "reward_server.cli", "reward_trainer.cli"])
def test_every_subcommand_prints_its_help(module: str) -> None:
    """argparse %-formats help strings: a setting whose help says "99.5%" once broke `compeer-loop plan --help`."""
    import argparse
    import importlib

    todo = [importlib.import_module(module).make_parser()]
    seen = 0
    while todo:
        p = todo.pop()
        assert p.format_help(), p.prog  # raises TypeError/ValueError on a stray "%"
        seen += 1
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    assert seen >= 1
