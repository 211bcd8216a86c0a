"""The two trainers load their profiles with one loader (judge.profiles): the same flags, the same error type and
the same message for the same mistake (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from judge.profiles import ConfigError
from policy_trainer import cli as grpo_cli
from policy_trainer.config import PROFILES as GRPO
from reward_trainer import cli as judge_cli
from reward_trainer.config import PROFILES as JUDGE

MISTAKES = {
    "unknown key": ["--config", "cpu-smoke", "--set", "lerning_rate=0.1"],
    "bad value": ["--config", "cpu-smoke", "--set", "max_steps=abc"],
    "bad float": ["--config", "cpu-smoke", "--set", "learning_rate=fast"],
    "not KEY=VALUE": ["--config", "cpu-smoke", "--set", "max_steps"],
    "unknown profile": ["--config", "no-such-profile"],
}


def _errors(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    out = {}
    for name, run in (("grpo", grpo_cli.main), ("judge", judge_cli.main)):
        assert run([name, *argv, "--out", str(tmp_path / name)]) == 2
        loader = GRPO if name == "grpo" else JUDGE
        err = capsys.readouterr().err.replace(f"compeer-train {name}", "CMD")
        out[name] = err.replace(", ".join(loader.names()), "NAMES")
    return out


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_both_trainers_give_the_same_error_for_the_same_mistake(mistake: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    errors = _errors(MISTAKES[mistake], tmp_path, capsys)
    assert errors["grpo"] == errors["judge"]
    assert errors["grpo"].startswith("CMD: configuration error: ")


def test_the_messages_name_the_remedy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    errors = _errors(MISTAKES["unknown key"], tmp_path, capsys)
    assert "'lerning_rate' is not a config field (did you mean 'learning_rate'?); see `CMD --help-fields`" in errors["grpo"]
    assert "max_steps: expected an integer, got 'abc'" in _errors(MISTAKES["bad value"], tmp_path, capsys)["judge"]
    assert "no shipped profile of that name (shipped: NAMES)" in _errors(MISTAKES["unknown profile"], tmp_path,
                                                                          capsys)["grpo"]


@pytest.mark.parametrize("loader", [GRPO, JUDGE], ids=["grpo", "judge"])
def test_one_error_type_from_the_loader(loader: object, tmp_path: Path) -> None:
    assert isinstance(loader, type(GRPO))
    bad = tmp_path / "bad.yaml"
    bad.write_text("lora_alfa: 8\n")
    for call in (lambda: loader.load("no-such-profile"), lambda: loader.read(str(bad)),
                 lambda: loader.override("max_steps=1.5"), lambda: loader.override("nope")):
        with pytest.raises(ConfigError):
            call()
    assert loader.override("learning_rate=2e-5") == ("learning_rate", 2e-5)  # YAML 1.1 reads it as a string


def test_both_trainers_have_the_same_profile_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for name, run in (("grpo", grpo_cli.main), ("judge", judge_cli.main)):
        assert run([name, "--help-fields"]) == 0
        assert "max_nonfinite_grad_steps:" in capsys.readouterr().out
    assert judge_cli.main(["judge", "--help-config"]) == 0  # the judge trainer's old flag name still works
