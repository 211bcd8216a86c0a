"""Build and run one GRPO training run: policy (+ LoRA), prompts, optional warm-up, reward function, report."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

from cer.modes import JudgeMode
from judge.guards import SkipNonFiniteGradients
from judge.model_store import resolve_model
from policy_trainer.config import CompeerGRPOConfig, RewardOverlap
from policy_trainer.data import load_prompt_set
from policy_trainer.overlap import OverlappedGRPOTrainer
from policy_trainer.report import MetricsReport, clear_run_logs, truncate_metrics, write_report
from policy_trainer.rewards import ClientFactory, CompeerReward, RewardSettings, ScoringClient
from policy_trainer.warmup import run_warmup, warmup_adapter_path
from reward_server.client import ClientSecurity, RewardClient
from reward_server.types import ErrorInfo, GroupRequest, GroupResponse

log = logging.getLogger(__name__)
FINAL_DIR = "final"
_TRL_NONE_WARNING = "All reward functions returned None"


@dataclass(frozen=True)
class RunResult:
    """Where a finished run left its outputs, and its summary."""

    out_dir: Path
    final_dir: Path
    summary: dict[str, Any]
    resumed_from: str | None


class _RedactRewardKwargs(logging.Filter):
    """TRL logs the prompt and completion at WARNING when every reward of a row is None; keep the text out."""

    def filter(self, record: logging.LogRecord) -> bool:
        # accelerate's MultiProcessAdapter prefixes the message with "[RANK n] "
        if isinstance(record.msg, str) and _TRL_NONE_WARNING in record.msg:
            record.msg = ("All reward functions returned None for a completion (it gets no advantage); "
                          "its text is not logged (dialogue text stays out of logs)")
            record.args = ()
        return True


def install_log_redaction() -> None:
    """Idempotently attach the redaction filter to TRL's GRPO trainer logger."""
    logger = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _RedactRewardKwargs) for f in logger.filters):
        logger.addFilter(_RedactRewardKwargs())


class ModeRoutingClient:
    """Separate PRM and ORM judges (``orm_reward_server``): each ScoreBatch goes to the client of its groups' mode."""

    def __init__(self, prm: ScoringClient, orm: ScoringClient) -> None:
        self.prm, self.orm = prm, orm

    async def score_batch(self, groups: Sequence[GroupRequest],
                          timeout_s: float | None = None) -> list[GroupResponse | ErrorInfo]:
        modes = {g.options.mode for g in groups}
        if len(modes) != 1:
            raise ValueError(f"one ScoreBatch must hold one judge mode, got {sorted(str(m) for m in modes)}")
        client = self.orm if modes == {JudgeMode.ORM} else self.prm
        return await client.score_batch(groups, timeout_s=timeout_s)

    async def close(self) -> None:
        await self.prm.close()
        await self.orm.close()


def default_client_factory(cfg: CompeerGRPOConfig) -> ClientFactory:
    """The real gRPC client over ``cfg.reward_server`` (and ``cfg.orm_reward_server`` for separate ORM judges), with
    the token and TLS settings of ``cfg`` (the token is read here, once: a missing token file fails the run before
    training starts)."""
    addresses, orm = list(cfg.reward_server), list(cfg.orm_reward_server)
    security = ClientSecurity.from_files(token_file=cfg.reward_token_file, tls=cfg.reward_tls,
                                         ca_cert=cfg.reward_tls_ca, client_cert=cfg.reward_tls_cert,
                                         client_key=cfg.reward_tls_key, server_name=cfg.reward_tls_server_name)

    def client(servers: list[str]) -> RewardClient:
        return RewardClient(servers, timeout_s=cfg.reward_timeout_s, max_retries=cfg.reward_max_retries,
                            security=security)

    def make() -> ScoringClient:
        return ModeRoutingClient(client(addresses), client(orm)) if orm else client(addresses)

    return make


def lora_config(cfg: CompeerGRPOConfig) -> LoraConfig | None:
    if not cfg.use_lora:
        return None
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")


def load_policy(cfg: CompeerGRPOConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The policy model and tokenizer from ``cfg.policy_model`` (``default``, a base name or a local folder:
    :func:`judge.model_store.resolve_model`); never downloads."""
    assert cfg.policy_model is not None  # validated by the config
    ref = resolve_model(cfg.policy_model, dtype=cfg.policy_dtype)
    dtype = getattr(torch, cfg.policy_dtype)
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(ref.path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, ref.path


def _prepare_warmup(cfg: CompeerGRPOConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                    out_dir: Path, peft: LoraConfig | None) -> tuple[PreTrainedModel | PeftModel, LoraConfig | None]:
    """Run or reload the SFT warm-up; returns the model GRPO starts from and the LoRA config still to apply."""
    if not cfg.warmup_on:
        return model, peft
    saved = warmup_adapter_path(out_dir)
    if saved.exists():
        log.info("reusing the SFT warm-up saved at %s", saved)
        if peft is None:
            return AutoModelForCausalLM.from_pretrained(str(saved), dtype=model.dtype), None
        return PeftModel.from_pretrained(model, str(saved), is_trainable=True), None
    return run_warmup(cfg, model, tokenizer, out_dir, peft), None


def checkpoint_to_resume(out_dir: Path, resume: bool) -> str | None:
    """The checkpoint a run continues from, its logs trimmed to that step; None (a run from step 1) after removing an
    earlier attempt's metrics and completions, which would otherwise stand before the new run's lines."""
    last = get_last_checkpoint(str(out_dir)) if resume and out_dir.is_dir() else None
    if last is None:
        if resume:
            log.warning("--resume: no checkpoint-* folder in %s; starting from the beginning", out_dir)
        clear_run_logs(out_dir)
        return None
    state = json.loads((Path(last) / "trainer_state.json").read_text())
    truncate_metrics(out_dir, int(state.get("global_step", 0)))
    log.info("resuming from %s (step %s)", last, state.get("global_step"))
    return last


def run(cfg: CompeerGRPOConfig, out_dir: Path, *, resume: bool = False,
        client_factory: ClientFactory | None = None) -> RunResult:
    """Train, save the final adapter to ``OUT/final`` and write the report. ``cfg.output_dir`` must be ``out_dir``."""
    install_log_redaction()
    out_dir.mkdir(parents=True, exist_ok=True)
    resume_from = checkpoint_to_resume(out_dir, resume)
    model, tokenizer, policy_path = load_policy(cfg)
    dataset = load_prompt_set(cfg.prompt_set, cfg.max_prompts)
    policy, peft = _prepare_warmup(cfg, model, tokenizer, out_dir, lora_config(cfg))
    reward = CompeerReward(RewardSettings.from_config(cfg), client_factory or default_client_factory(cfg))
    # a coroutine function, which every TRL version runs as async (an instance is async only to TRL >= 1.14)
    reward_funcs: list[Any] = [reward.as_reward_func()]
    overlap = RewardOverlap(cfg.reward_overlap)
    callbacks = [SkipNonFiniteGradients(cfg.max_nonfinite_grad_steps),  # before the report
                 MetricsReport(out_dir, cfg.zero_std_warn_fraction)]
    trainer_kwargs: dict[str, Any] = {"model": policy, "reward_funcs": reward_funcs, "args": cfg,
                                      "train_dataset": dataset, "processing_class": tokenizer, "peft_config": peft,
                                      "callbacks": callbacks}
    trainer = (GRPOTrainer(**trainer_kwargs) if overlap is RewardOverlap.OFF
               else OverlappedGRPOTrainer(reward=reward, overlap=overlap, **trainer_kwargs))
    log.info("GRPO: policy %s, %d prompts, G=%d, judge %s, redundancy %s, reward servers %s, reward overlap %s",
             policy_path, len(dataset), cfg.num_generations, cfg.judge_mode, cfg.redundancy_mode,
             ",".join(cfg.reward_server), overlap.value)
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    finally:
        _close_reward(trainer, reward)
    final_dir = out_dir / FINAL_DIR
    trainer.save_model(str(final_dir))
    summary = write_report(out_dir)
    summary["reward_call_failures_total"] = reward.total_call_failures
    log.info("done: adapter in %s, report in %s", final_dir, out_dir)
    return RunResult(out_dir, final_dir, summary, resume_from)


def _close_reward(trainer: GRPOTrainer, reward: CompeerReward) -> None:
    loop = getattr(trainer, "async_loop", None)
    if loop is None or not loop.is_running():
        return
    future = asyncio.run_coroutine_threadsafe(reward.aclose(), loop)
    try:
        future.result(timeout=10)
    except FutureTimeout:
        log.warning("closing the reward client took over 10 s; left to the process exit")
