"""Judge SFT: TRL's SFTTrainer + a PEFT LoRA on the base judge, loss on the judge's turns only (Eq. 4).

The output folder is a standard PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``),
loadable by the reward service (``compeer-reward serve --adapter DIR``) and by
``EngineConfig(adapter=DIR)`` on any backend; ``compeer_judge.json`` beside them records what it was trained on
(variant = serving mode, template version, base model id and revision, data, steps, final loss).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_trainer.config import JudgeSFTConfig

log = logging.getLogger(__name__)

#: Metadata file written beside the adapter.
ADAPTER_STAMP = "compeer_judge.json"


@dataclass(frozen=True)
class TrainResult:
    """What a finished run produced."""

    adapter_dir: Path
    variant: str
    steps: int
    train_rows: int
    train_loss: float | None
    seconds: float


def lora_config(config: JudgeSFTConfig) -> Any:
    """The PEFT LoRA configuration of the run."""
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), bias="none", task_type="CAUSAL_LM")


def read_adapter_stamp(adapter_dir: str | Path) -> dict[str, Any]:
    """The ``compeer_judge.json`` of an adapter folder ({} when absent: a foreign adapter)."""
    path = Path(adapter_dir) / ADAPTER_STAMP
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The ``checkpoint-<step>`` folder with the highest step under ``output_dir`` (``save_strategy: steps``), or None.

    Training resumes from it (weights, optimiser, scheduler, data order), so a run cut by the end of a call or of a
    machine goes on where it stopped once the folder is back in place."""
    steps = [(int(p.name.split("-")[1]), p) for p in output_dir.glob("checkpoint-*")
             if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()]
    return max(steps)[1] if steps else None


def train(config: JudgeSFTConfig) -> TrainResult:
    """Train the judge adapter described by ``config`` and save it to ``config.output_dir``."""
    import torch
    from datasets import concatenate_datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from judge.device import dtype_name, resolve_device_dtype
    from judge.guards import SkipNonFiniteGradients
    from judge.model_store import resolve_model
    from judge.protocol import load_template
    from reward_trainer.data import TRAIN_SPLIT, build_train_dataset, check_template, load_judge_set

    started = time.monotonic()
    use_cuda = torch.cuda.is_available() and not config.use_cpu
    _, dtype = resolve_device_dtype("cuda" if use_cuda else "cpu", config.model_dtype)
    ref = resolve_model(config.model, dtype_name(dtype))
    template = load_template(config.template)

    splits = []
    for mode in (config.variant, *config.extra_modes):
        sets = load_judge_set(config.data_dir, mode)
        if TRAIN_SPLIT not in sets:
            raise ValueError(f"{config.data_dir}: the {mode} set has no {TRAIN_SPLIT!r} split to train on")
        check_template(sets[TRAIN_SPLIT], template.system, template.version)
        splits.append(sets[TRAIN_SPLIT])
    rows = concatenate_datasets(splits) if len(splits) > 1 else splits[0]

    tokenizer = AutoTokenizer.from_pretrained(ref.path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # oversampling False steps only matters to judges that decide steps (the ORM judge sees none)
    false_factor = config.false_oversample if config.variant != "orm" else 1.0
    train_ds = build_train_dataset(rows, tokenizer, max_rows=config.max_train_rows,
                                   false_factor=false_factor, seed=config.seed)
    load_kwargs = {"attn_implementation": config.attn_implementation} if config.attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype, local_files_only=True, **load_kwargs)

    guard = SkipNonFiniteGradients(config.max_nonfinite_grad_steps)
    trainer = SFTTrainer(model=model, args=config, train_dataset=train_ds, processing_class=tokenizer,
                         peft_config=lora_config(config), callbacks=[guard])
    log.info("training %s judge: %d rows, base %s, LoRA r=%d", config.variant, len(train_ds), ref.model_id,
             config.lora_r)
    resume = latest_checkpoint(Path(config.output_dir)) if config.output_dir else None
    if resume is not None:  # an earlier run of the same config stopped (a call or a machine ended): go on from it
        log.info("resuming from %s", resume)
    output = trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    out_dir = config.adapter_dir
    trainer.save_model(str(out_dir))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    result = TrainResult(adapter_dir=out_dir, variant=config.variant, steps=int(trainer.state.global_step),
                         train_rows=len(train_ds), train_loss=float(output.training_loss) if output else None,
                         seconds=time.monotonic() - started)
    stamp = {
        "variant": config.variant,
        "serving_mode": config.variant,
        "extra_modes": list(config.extra_modes),
        "template_version": template.version,
        "base_model_id": ref.model_id,
        "base_model_revision": ref.revision,
        "data_dir": str(config.data_dir),
        "train_rows": result.train_rows,
        "steps": result.steps,
        "train_loss": result.train_loss,
        "first_logged_loss": losses[0] if losses else None,
        "last_logged_loss": losses[-1] if losses else None,
        "lora": {"r": config.lora_r, "alpha": config.lora_alpha, "dropout": config.lora_dropout,
                 "target_modules": list(config.lora_target_modules)},
        "false_oversample": false_factor,
        "nonfinite_grad_steps_skipped": guard.skipped,
        "seconds": round(result.seconds, 1),
    }
    (out_dir / ADAPTER_STAMP).write_text(json.dumps(stamp, indent=2), encoding="utf-8")
    log.info("adapter saved to %s (%d steps, loss %s, %.0f s)", out_dir, result.steps, result.train_loss,
             result.seconds)
    return result


__all__ = ["ADAPTER_STAMP", "TrainResult", "lora_config", "read_adapter_stamp", "train"]
