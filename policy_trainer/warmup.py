"""Optional SFT warm-up on CER-format outputs, so a small policy writes the four tags before GRPO starts.

Without it a 135M policy never emits ``<analysis>...<response>`` and every candidate of a group gets the same
format penalty, so GRPO sees little or no reward spread (TRL's ``frac_reward_zero_std`` near 1). The warm-up
trains the same LoRA adapter GRPO then continues (TRL's SFTTrainer, prompt-completion form, loss on the
completion only) and saves it to ``OUT/warmup/adapter`` so a resumed run skips it. ``OUT/warmup/stats.json`` records
the warm-up's length (steps or epochs) and the targets' token lengths against ``max_completion_length``: a target
longer than that limit is a format GRPO's completions cannot finish (cut before ``</response>``), and the rows left
out because their target reply is one the degenerate-reply rule marks (``sft_warmup_drop_marked``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, cast

from transformers import PreTrainedModel, PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer

from policy_trainer.config import CompeerGRPOConfig
from policy_trainer.data import load_warmup_set

log = logging.getLogger(__name__)
ADAPTER_DIR = Path("warmup") / "adapter"


def warmup_adapter_path(out_dir: Path) -> Path:
    """Where the warm-up adapter (or full model, without LoRA) of a run is saved."""
    return out_dir / ADAPTER_DIR


def target_lengths(targets: list[str], tokenizer: PreTrainedTokenizerBase, limit: int) -> dict[str, Any]:
    """Token lengths of the warm-up targets (the end-of-sequence token included, as the policy must write it) and the
    share longer than ``limit`` (GRPO's ``max_completion_length``)."""
    lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in targets)
    if not lengths:
        return {"targets": 0}

    def pct(q: float) -> int:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))]
    return {"targets": len(lengths), "tokens_p50": pct(0.5), "tokens_p95": pct(0.95), "tokens_p99": pct(0.99),
            "tokens_max": lengths[-1], "max_completion_length": limit,
            "over_completion_limit_share": sum(n > limit for n in lengths) / len(lengths)}


def row_lengths(dataset: Any, tokenizer: PreTrainedTokenizerBase, max_length: int) -> dict[str, Any]:
    """How the warm-up rows fit ``max_length`` tokens, in the chat template the trainer applies: rows whose prompt
    alone reaches it (dropped: no target token left) and rows longer than it (their target is cut)."""
    def n(messages: list[dict[str, Any]], generation_prompt: bool) -> int:
        ids: Any = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in transformers 5

    sizes = [(n(list(r["prompt"]), True), n(list(r["prompt"]) + list(r["completion"]), False)) for r in dataset]
    return {"max_length": max_length, "rows_longest": max((f for _, f in sizes), default=0),
            "rows_prompt_over_max_length": sum(p >= max_length for p, _ in sizes),
            "rows_cut_at_max_length": sum(p < max_length < f for p, f in sizes)}


def run_warmup(cfg: CompeerGRPOConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
               out_dir: Path, peft_config: Any | None) -> PreTrainedModel:
    """Train ``cfg.sft_warmup_steps`` SFT steps (or ``cfg.sft_warmup_epochs`` epochs) and return the trained model (a
    PeftModel when ``peft_config`` is set)."""
    dataset, dropped = load_warmup_set(cfg.sft_warmup_dataset, drop_marked=cfg.sft_warmup_drop_marked)
    limit = cfg.max_completion_length or 256
    stats = {"rows": len(dataset), "rows_dropped_marked": dropped, "steps": cfg.sft_warmup_steps or None,
             "epochs": None if cfg.sft_warmup_steps else cfg.sft_warmup_epochs,
             **target_lengths([str(row["completion"][0]["content"]) for row in dataset], tokenizer, limit),
             **row_lengths(dataset, tokenizer, cfg.sft_warmup_max_length)}
    if stats["rows_prompt_over_max_length"] or stats["rows_cut_at_max_length"]:
        log.warning("%d warm-up rows have a prompt of sft_warmup_max_length %d tokens or more (dropped) and %d are cut "
                    "at it (their target loses its end): raise sft_warmup_max_length",
                    stats["rows_prompt_over_max_length"], cfg.sft_warmup_max_length, stats["rows_cut_at_max_length"])
    if stats.get("over_completion_limit_share", 0.0) > 0.05:
        log.warning("%.1f%% of the warm-up targets are longer than max_completion_length %d tokens: GRPO will cut "
                    "those completions before </response>; raise max_completion_length",
                    100 * stats["over_completion_limit_share"], limit)
    if dropped:
        log.info("warm-up: %d rows left out, their target reply marked by the degenerate-reply rule (%s)",
                 sum(dropped.values()), ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())))
    (out_dir / "warmup").mkdir(parents=True, exist_ok=True)
    (out_dir / "warmup" / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    args = SFTConfig(
        output_dir=str(out_dir / "warmup"),
        max_steps=cfg.sft_warmup_steps if cfg.sft_warmup_steps > 0 else -1,
        num_train_epochs=cfg.sft_warmup_epochs if cfg.sft_warmup_steps <= 0 else 1.0,
        learning_rate=cfg.sft_warmup_learning_rate,
        per_device_train_batch_size=min(cfg.sft_warmup_batch_size, len(dataset)),
        gradient_accumulation_steps=1,
        bf16=cfg.bf16,
        gradient_checkpointing=cfg.gradient_checkpointing,
        use_cpu=cfg.use_cpu,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        max_length=cfg.sft_warmup_max_length,
        completion_only_loss=True,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    log.info("SFT warm-up: %s on %d CER examples (targets p95 %s tokens, %.1f%% over max_completion_length %d)",
             f"{cfg.sft_warmup_steps} steps" if cfg.sft_warmup_steps else f"{cfg.sft_warmup_epochs:g} epoch(s)",
             len(dataset), stats.get("tokens_p95"), 100 * stats.get("over_completion_limit_share", 0.0), limit)
    result = trainer.train()
    log.info("SFT warm-up done: loss %.4f after %d steps", result.training_loss, result.global_step)
    stats.update(steps_trained=result.global_step, train_loss=result.training_loss)
    (out_dir / "warmup" / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    target = warmup_adapter_path(out_dir)
    trainer.save_model(str(target))
    return cast(PreTrainedModel, trainer.model)  # the PeftModel SFTTrainer built around ``model``
