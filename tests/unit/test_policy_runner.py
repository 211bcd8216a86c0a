"""The whole GRPO run (policy_trainer.runner) on a tiny random Llama with FakeRewardClient: wiring, warm-up,
checkpoints, resume, report, and a dead reward server. Real TRL, real LoRA; no reward server."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from safetensors.torch import load_file

from judge.model_store import resolve_model
from policy_trainer.config import load_config
from policy_trainer.runner import run
from tests.unit.test_policy_fakes import FakeRewardClient, FakeScore


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1-layer random Llama with the default model's tokenizer (fast on CPU)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(resolve_model("default").path)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-policy")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _varied(text: str) -> FakeScore:
    """Rewards that differ between completions, so groups carry a learning signal."""
    h = zlib.crc32(text.encode())
    return FakeScore(steps=[1.0 if h & 1 else -1.0, 1.0, -1.0], preference=1.0 if h & 2 else -1.0,
                     format=-1.0, s_in=0.1, s_hi=0.2)


def _config(policy: str, out: Path, **extra: Any):
    overrides = {"policy_model": policy, "output_dir": str(out), "max_completion_length": 8, "max_steps": 1,
                 "lora_target_modules": ["q_proj", "v_proj"], "max_prompts": 4, "reward_server": ["fake:1"],
                 **extra}
    return load_config("cpu-smoke", overrides)


def _lora(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(path / "adapter_model.safetensors")).items() if "lora_" in k}


def test_warmup_then_grpo_then_resume(tiny_policy: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    fakes: list[FakeRewardClient] = []

    def factory() -> FakeRewardClient:
        fakes.append(FakeRewardClient(default=_varied))
        return fakes[-1]

    first = run(_config(tiny_policy, out, sft_warmup_steps=1), out, client_factory=factory)
    warm = _lora(out / "warmup" / "adapter")
    stats = json.loads((out / "warmup" / "stats.json").read_text())
    assert stats["steps"] == 1 and stats["steps_trained"] == 1 and stats["epochs"] is None
    assert stats["max_completion_length"] == 8
    assert stats["over_completion_limit_share"] == 1.0  # every CER target is longer than 8 tokens
    after_grpo = _lora(first.final_dir)
    assert warm.keys() == after_grpo.keys() and warm
    assert any(not torch.equal(warm[k], after_grpo[k]) for k in warm), "GRPO must move the LoRA weights"
    assert (out / "checkpoint-1").is_dir()
    assert fakes and fakes[0].calls and fakes[0].closed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    for key in ("compeer/reward_raw_mean", "compeer/reward_reweighted_mean", "compeer/step_reward_mean",
                "compeer/tau_mean", "compeer/reward_call_latency_s", "frac_reward_zero_std", "step_time"):
        assert key in rows[0], key
    assert (out / "plots" / "reward_components.png").stat().st_size > 0
    assert "reward_wait_share" in json.loads((out / "summary.json").read_text())

    resumed = run(_config(tiny_policy, out, sft_warmup_steps=1, max_steps=2), out, resume=True, client_factory=factory)
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-1")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_warmup_by_epochs_runs_the_whole_set_and_measures_the_targets(tiny_policy: str, tmp_path: Path) -> None:
    from policy_trainer.runner import load_policy, lora_config
    from policy_trainer.warmup import run_warmup, warmup_adapter_path

    out = tmp_path / "epochs"
    cfg = _config(tiny_policy, out, sft_warmup_epochs=1.0, sft_warmup_batch_size=3, max_completion_length=96)
    model, tokenizer, _ = load_policy(cfg)
    run_warmup(cfg, model, tokenizer, out, lora_config(cfg))
    stats = json.loads((out / "warmup" / "stats.json").read_text())
    assert stats["steps"] is None and stats["epochs"] == 1.0 and stats["rows"] == stats["targets"] > 0
    assert stats["tokens_p50"] <= stats["tokens_p95"] <= stats["tokens_max"]
    assert 0.0 <= stats["over_completion_limit_share"] <= 1.0
    assert stats["steps_trained"] == -(-stats["rows"] // 3)  # one pass over the set in batches of sft_warmup_batch_size
    assert stats["rows_prompt_over_max_length"] == stats["rows_cut_at_max_length"] == 0
    assert 0 < stats["rows_longest"] <= stats["max_length"] == cfg.sft_warmup_max_length
    assert (warmup_adapter_path(out) / "adapter_config.json").is_file()


def test_warmup_rows_over_the_max_length_are_counted_as_dropped_or_cut(tiny_policy: str) -> None:
    """A prompt that reaches the limit leaves no target token (TRL drops the row: 66 of the loop's 2,730 rows at
    1024 tokens made an epoch 666 steps, not 683); a row only longer than it loses its target's end."""
    from transformers import AutoTokenizer

    from policy_trainer.warmup import row_lengths

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    target = [{"role": "assistant", "content": "<analysis>a</analysis><emotion>b</emotion><strategy>c</strategy>"
                                               "<response>d</response>"}]
    rows = [{"prompt": [{"role": "user", "content": "word " * n}], "completion": target} for n in (5, 60, 400)]
    got = row_lengths(rows, tok, max_length=110)
    assert got["max_length"] == 110 and got["rows_longest"] > 400
    assert got["rows_prompt_over_max_length"] == 1  # the 400-word prompt
    assert got["rows_cut_at_max_length"] == 1  # the 60-word prompt fits, its target does not
    assert row_lengths(rows, tok, max_length=4096)["rows_cut_at_max_length"] == 0


def test_dead_reward_server_gives_none_rewards_and_training_goes_on(tiny_policy: str, tmp_path: Path) -> None:
    out = tmp_path / "dead"
    result = run(_config(tiny_policy, out), out,
                 client_factory=lambda: FakeRewardClient(fail_with=grpc.StatusCode.UNAVAILABLE))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["compeer/reward_call_failures"] == 1.0
    assert rows[0]["compeer/unscored_rate"] == 1.0
    assert rows[0]["reward"] is None, "no made-up reward when the server is gone"
    assert result.summary["reward_call_failures_total"] == 1
