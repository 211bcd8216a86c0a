"""policy_trainer.config: profiles, validation messages that name the remedy, no clash with TRL's fields."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from unittest import mock

import pytest
from trl import GRPOConfig

from policy_trainer import config as C


def _cfg(tmp_path: Path, **overrides: object) -> C.CompeerGRPOConfig:
    return C.load_config("cpu-smoke", {"output_dir": str(tmp_path), **overrides})


def test_cpu_smoke_profile_loads_with_cpu_settings(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert cfg.bf16 is False and cfg.gradient_checkpointing is False
    assert cfg.judge_mode == "unified" and cfg.redundancy_mode == "paper" and cfg.length_unit == "tokens"
    assert cfg.reward_kind == "graded"
    assert cfg.redundancy_alpha == 0.5 and cfg.redundancy_beta == 5.0
    assert cfg.beta == 0.0, "TRL's KL beta stays separate from the redundancy beta"
    assert cfg.generation_batch_size % cfg.num_generations == 0


def test_gpu_paper_profile_has_paper_values_and_requires_a_policy() -> None:
    values = C.read_profile("gpu-paper")
    assert values["learning_rate"] == 1e-6 and values["num_generations"] == 4
    assert values["per_device_train_batch_size"] == 32
    assert values["redundancy_alpha"] == 0.5 and values["redundancy_beta"] == 5.0
    assert values["policy_model"] is None
    with pytest.raises(ValueError, match="--policy-model"):
        C.load_config("gpu-paper", {"output_dir": "/tmp/unused"})


@pytest.mark.parametrize(("override", "message"), [
    ({"reward_server": []}, "--reward-server"),
    ({"reward_server": ["no-port"]}, "host:port"),
    ({"judge_mode": "prm"}, "unified | single_pass | prm_orm"),
    ({"redundancy_mode": "halve"}, "off | paper | sign_aware"),
    ({"reward_kind": "argmax"}, "reward_kind must be one of graded | discrete"),
    ({"length_unit": "chars"}, "tokens | words"),
    ({"reward_timeout_s": 0}, "never wait"),
    ({"redundancy_alpha": -1.0}, "paper uses 0.5"),
    ({"sft_warmup_steps": -1}, "0 turns the SFT warm-up off"),
    ({"sft_warmup_epochs": -1.0}, "sft_warmup_epochs must be >= 0"),
    ({"sft_warmup_batch_size": 0}, "sft_warmup_batch_size 0: expected >= 1"),
    ({"sft_warmup_steps": 5, "sft_warmup_epochs": 1.0}, "set one of them"),
    ({"log_completions": True}, "sensitive"),
    ({"bf16": True}, "bf16: false"),
])
def test_invalid_values_say_the_remedy(tmp_path: Path, override: dict, message: str) -> None:
    if "bf16" in override and C._cuda_available():
        pytest.skip("bf16 is valid where a GPU is visible: the bf16-refused case runs on CPU-only machines (CI)")
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        _cfg(tmp_path, **override)


def test_groups_split_across_processes_are_refused(tmp_path: Path) -> None:
    with mock.patch.object(C.CompeerGRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=2):
        with pytest.raises(ValueError, match="multiple of num_generations"):
            _cfg(tmp_path, per_device_train_batch_size=3, num_generations=2)
        cfg = _cfg(tmp_path, per_device_train_batch_size=4, num_generations=2)
        assert cfg.per_device_train_batch_size == 4


def test_unknown_profile_keys_and_overrides_are_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward_server: [localhost:1]\nredundancy_gamma: 3\n")
    with pytest.raises(ValueError, match="redundancy_gamma"):
        C.read_profile(str(bad))
    with pytest.raises(ValueError, match="not a config field"):
        C.parse_override("nope=1")
    assert C.parse_override("redundancy_mode=sign_aware") == ("redundancy_mode", "sign_aware")
    assert C.parse_override("reward_server=[a:1, b:2]") == ("reward_server", ["a:1", "b:2"])
    with pytest.raises(ValueError, match="shipped profile"):
        C.resolve_profile("no-such-profile")


def test_a_text_field_set_to_off_stays_the_text(tmp_path: Path) -> None:
    """YAML 1.1 reads off/on/yes/no as booleans: ``--set reward_overlap=off`` failed with "got False" on the GPU."""
    assert C.parse_override("reward_overlap=off") == ("reward_overlap", "off")
    assert C.parse_override("reward_overlap='off'") == ("reward_overlap", "off")
    assert C.parse_override("gradient_checkpointing=off") == ("gradient_checkpointing", False)  # a boolean field
    assert _cfg(tmp_path, **dict([C.parse_override("reward_overlap=off")])).reward_overlap == "off"
    profile = tmp_path / "p.yaml"
    profile.write_text("reward_overlap: off\n")
    with pytest.raises(ValueError, match="reward_overlap: expected text, got the boolean False: quote the value"):
        C.read_profile(str(profile))


def test_compeer_fields_do_not_shadow_trl_fields() -> None:
    """A name clash silently changes TRL's behaviour (e.g. TrainingArguments.warmup_steps is the LR warm-up)."""
    tree = ast.parse(inspect.getsource(C.CompeerGRPOConfig))
    own = [n.target.id for n in tree.body[0].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert own and not set(own) & base
    assert all(f.metadata.get("help") for f in dataclasses.fields(C.CompeerGRPOConfig) if f.name in own)


@pytest.mark.parametrize("addr", ["localhost:50051", "[::1]:50051", "dns:///compeer-reward-headless:50051",
                                  "dns://127.0.0.1/compeer-reward-headless.compeer.svc:50051"])
def test_reward_server_accepts_host_port_and_dns_targets(tmp_path: Path, addr: str) -> None:
    assert _cfg(tmp_path, reward_server=[addr]).reward_server == [addr]
