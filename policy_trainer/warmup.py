"""Optional SFT warm-up on CER-format outputs, so a small policy writes the four tags before GRPO starts.

Without it a 135M policy never emits ``<analysis>...<response>`` and every candidate of a group gets the same
format penalty, so GRPO sees little or no reward spread (TRL's ``frac_reward_zero_std`` near 1). The warm-up
trains the same LoRA adapter GRPO then continues (TRL's SFTTrainer, prompt-completion form, loss on the
completion only) and saves it to ``OUT/warmup/adapter`` so a resumed run skips it.
"""

from __future__ import annotations

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


def run_warmup(cfg: CompeerGRPOConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
               out_dir: Path, peft_config: Any | None) -> PreTrainedModel:
    """Train ``cfg.sft_warmup_steps`` SFT steps and return the trained model (a PeftModel when ``peft_config`` is set)."""
    dataset = load_warmup_set(cfg.sft_warmup_dataset)
    args = SFTConfig(
        output_dir=str(out_dir / "warmup"),
        max_steps=cfg.sft_warmup_steps,
        learning_rate=cfg.sft_warmup_learning_rate,
        per_device_train_batch_size=min(4, len(dataset)),
        gradient_accumulation_steps=1,
        bf16=cfg.bf16,
        gradient_checkpointing=cfg.gradient_checkpointing,
        use_cpu=cfg.use_cpu,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        max_length=1024,
        completion_only_loss=True,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    log.info("SFT warm-up: %d steps on %d CER examples", cfg.sft_warmup_steps, len(dataset))
    result = trainer.train()
    log.info("SFT warm-up done: loss %.4f", result.training_loss)
    target = warmup_adapter_path(out_dir)
    trainer.save_model(str(target))
    return cast(PreTrainedModel, trainer.model)  # the PeftModel SFTTrainer built around ``model``
