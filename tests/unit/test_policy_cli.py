"""compeer-train grpo: parser, dispatch, configuration errors, and the log redaction of TRL's None-reward warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from compeer_cli import train
from policy_trainer import cli
from policy_trainer.runner import install_log_redaction


def test_dispatch_help_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert train.main(["grpo", "--help-fields"]) == 0
    out = capsys.readouterr().out
    assert "redundancy_mode:" in out and "reward_server:" in out and "sft_warmup_steps:" in out


def test_configuration_error_exits_2_with_the_remedy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["grpo", "--config", "cpu-smoke", "--out", str(tmp_path), "--set", "redundancy_mode=halve"])
    assert rc == 2
    assert "off | paper | sign_aware" in capsys.readouterr().err
    rc = cli.main(["grpo", "--config", "gpu-paper", "--out", str(tmp_path)])
    assert rc == 2
    assert "--policy-model" in capsys.readouterr().err


def test_parser_flags() -> None:
    args = cli.make_parser().parse_args(["--config", "cpu-smoke", "--out", "o", "--max-steps", "3",
                                         "--reward-server", "a:1", "b:2", "--resume", "--set", "seed=1"])
    assert args.max_steps == 3 and args.reward_server == ["a:1", "b:2"] and args.resume
    values = cli._overrides(args)
    assert values["max_steps"] == 3 and values["reward_server"] == ["a:1", "b:2"] and values["seed"] == 1


def test_trl_none_reward_warning_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    install_log_redaction()  # idempotent
    logger = logging.getLogger("trl.trainer.grpo_trainer")
    assert sum(type(f).__name__ == "_RedactRewardKwargs" for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        logger.warning("All reward functions returned None for the following kwargs:\n{'prompt': 'SECRET TEXT'}")
        # as TRL's accelerate logger emits it
        logger.warning("[RANK 0] All reward functions returned None for the following kwargs:\n{'p': 'SECRET 2'}")
    assert "SECRET" not in caplog.text and "not logged" in caplog.text


def test_report_warns_once_when_most_completions_are_unscored(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from policy_trainer.report import MetricsReport, read_metrics

    report = MetricsReport(tmp_path, zero_std_warn_fraction=0.8)
    state = TrainerState()
    state.global_step, state.max_steps = 1, 2
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with caplog.at_level(logging.WARNING, logger="policy_trainer.report"):
        for step in (1, 2):
            state.global_step = step
            report.on_log(args, state, TrainerControl(), logs={"compeer/unscored_rate": 1.0, "reward": float("nan"),
                                                              "frac_reward_zero_std": 0.0})
    assert caplog.text.count("got no reward") == 1
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["reward"] is None
