"""The judge SFT configuration: TRL's ``SFTConfig`` plus the judge variant, the data, the base model and LoRA.

Profiles (``reward_trainer/profiles/<name>.yaml``) hold the values; :func:`load_config` reads a profile name or a
YAML path, applies command-line overrides and rejects unknown keys. Every check in ``__post_init__`` says the
remedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import SFTConfig

from judge.profiles import ConfigError, ProfileLoader
from judge.protocol import DEFAULT_TEMPLATE
from reward_trainer import VARIANTS

DEFAULT_TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class JudgeSFTConfig(SFTConfig):
    """Configuration of one judge SFT run (``compeer-train judge --config FILE``).

    Everything of :class:`trl.SFTConfig` applies (learning rate, steps, batch size, ``max_length``, ...), except
    that the dataset is tokenised by :mod:`reward_trainer.data` (loss on the judge's turns only, the paper's
    Eq. 4), so ``assistant_only_loss``, ``completion_only_loss`` and ``packing`` must stay off.
    """

    variant: str = field(
        default="unified",
        metadata={"help": "Which judge to train: 'unified' (4-round UnifiReward), 'prm' (steps only), 'orm' "
                          "(reply preference only) or 'reply' (plain replies, point-wise). Selects the "
                          "judge_sft/<variant> folder and the serving mode."},
    )
    extra_modes: list[str] = field(
        default_factory=list,
        metadata={"help": "Other judge_sft modes whose train rows are mixed into the training set (one adapter that "
                          "also serves them), e.g. [reply]."},
    )
    data_dir: str = field(
        default="out/judge_sft",
        metadata={"help": "data_builder's judge SFT folder (the parent of unified/ prm/ orm/, or one of them); "
                          "splits 'train' and 'heldout'."},
    )
    model: str = field(
        default="default",
        metadata={"help": "Base judge: 'default' (the embedded SmolLM2-135M-Instruct) or a local HF folder. "
                          "Nothing is downloaded."},
    )
    model_dtype: str = field(
        default="auto",
        metadata={"help": "dtype the base model is loaded in: 'auto' (judge.device: bfloat16 on CUDA, float16 on a GPU "
                          "without bfloat16, float32 on CPU), 'float32', 'bfloat16' or 'float16'."},
    )
    template: str = field(
        default=DEFAULT_TEMPLATE,
        metadata={"help": "Judge template version (judge/templates) the SFT set must have been rendered "
                          "with; the serving judge uses the same one."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (scaling = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout, in [0, 1)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(DEFAULT_TARGET_MODULES),
        metadata={"help": "Module names that get LoRA weights (the attention and MLP projections by default)."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Attention kernel the base is loaded with ('sdpa', 'eager', 'flash_attention_2'); None: "
                          "transformers' default for the model."},
    )
    false_oversample: float = field(
        default=1.0,
        metadata={"help": "Repeat training conversations that hold at least one False step verdict this many "
                          "times (fractions add a seeded random extra copy); 1.0 = no oversampling. Counters the "
                          "~23%% False share so the judge learns to say False. Not applied to the orm variant."},
    )
    max_train_rows: int | None = field(
        default=None,
        metadata={"help": "Use at most this many training conversations (before oversampling); None = all."},
    )
    max_nonfinite_grad_steps: int = field(
        default=3,
        metadata={"help": "A step with NaN/inf gradients is skipped (no update; judge/guards.py); this many in a row "
                          "stop the run. 0: no check (the Trainer then writes NaN into the LoRA weights)."},
    )
    # TRL / transformers defaults that do not suit a small LoRA judge on CPU or one GPU.
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "Trade compute for memory; off by default (a 135M-7B LoRA judge fits without it)."},
    )
    report_to: Any = field(default="none", metadata={"help": "Integrations to report to ('none', 'tensorboard')."})
    save_strategy: Any = field(default="no", metadata={"help": "Checkpointing; the final adapter is always saved."})

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant {self.variant!r}: expected one of {', '.join(VARIANTS)}; set `variant:` in "
                             "the profile or pass --variant")
        bad = [m for m in self.extra_modes if m not in VARIANTS or m == self.variant]
        if bad:
            raise ValueError(f"extra_modes {bad}: each must be one of {', '.join(VARIANTS)} and differ from the "
                             f"variant {self.variant!r}")
        if not str(self.data_dir).strip():
            raise ValueError("data_dir is empty: set `data_dir:` to data_builder's judge_sft folder "
                             "(`compeer-data emit --out OUT` writes OUT/judge_sft) or pass --data")
        if self.lora_r < 1:
            raise ValueError(f"lora_r={self.lora_r}: the LoRA rank must be >= 1 (8-64 is usual)")
        if self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha={self.lora_alpha}: must be > 0 (2 * lora_r is usual)")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout}: must be in [0, 1)")
        if not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty: list the projections to adapt, e.g. [q_proj, v_proj]")
        if self.false_oversample < 1.0:
            raise ValueError(f"false_oversample={self.false_oversample}: must be >= 1.0 (1.0 turns it off)")
        if self.max_nonfinite_grad_steps < 0:
            raise ValueError(f"max_nonfinite_grad_steps={self.max_nonfinite_grad_steps}: must be >= 0 (0 turns the "
                             "check off)")
        if self.max_train_rows is not None and self.max_train_rows < 1:
            raise ValueError(f"max_train_rows={self.max_train_rows}: must be >= 1, or null for all rows")
        if self.model_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"model_dtype {self.model_dtype!r}: expected auto, float32, bfloat16 or float16")
        if self.assistant_only_loss or self.completion_only_loss:
            raise ValueError("assistant_only_loss / completion_only_loss: remove them; reward_trainer builds the "
                             "labels itself (loss on the judge's turns only), which also works for chat templates "
                             "without generation markers such as SmolLM2's")
        if self.packing:
            raise ValueError("packing: set `packing: false`; each judge conversation is trained as one row")
        if self.max_length is not None and self.max_length < 256:
            raise ValueError(f"max_length={self.max_length}: one judge conversation needs several hundred tokens; "
                             "use >= 1024 (or null for no truncation)")
        cuda = _cuda_available()
        if not cuda and (self.bf16 or self.fp16):
            raise ValueError("bf16/fp16 mixed precision needs a GPU and none is visible: set `bf16: false` and "
                             "`fp16: false` (the cpu-smoke profile does) or run with the gpu profile on CUDA")
        if self.bf16 is None:
            self.bf16 = cuda and not self.fp16
        if not cuda and self.gradient_checkpointing:
            raise ValueError("gradient_checkpointing on CPU only slows a small LoRA run down: set "
                             "`gradient_checkpointing: false`")
        super().__post_init__()

    @property
    def adapter_dir(self) -> Path:
        """Where the trained PEFT adapter is written (the run's ``output_dir`` itself)."""
        return Path(self.output_dir or "trainer_output")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


#: the one profile loader (judge.profiles), shared with the GRPO trainer: flags, checks and error type
PROFILES = ProfileLoader(JudgeSFTConfig, Path(__file__).parent / "profiles", "compeer-train judge", base=SFTConfig)


def profile_names() -> list[str]:
    """The packaged profiles (``reward_trainer/profiles/*.yaml``) by name."""
    return PROFILES.names()


def read_profile(name_or_path: str) -> dict[str, Any]:
    """The checked mapping of a packaged profile name (``cpu-smoke``, ``gpu``) or of a YAML file path."""
    return PROFILES.read(name_or_path)


def config_from_mapping(data: dict[str, Any], source: str = "config") -> JudgeSFTConfig:
    """Build the config from a mapping; an unknown key is a :class:`ConfigError` naming the closest field."""
    cfg: JudgeSFTConfig = PROFILES.build(data, source)
    return cfg


def load_config(name_or_path: str, overrides: dict[str, Any] | None = None) -> JudgeSFTConfig:
    """Profile or YAML file, then ``overrides`` (later wins), validated; :class:`ConfigError` on a mistake."""
    cfg: JudgeSFTConfig = PROFILES.load(name_or_path, overrides)
    return cfg


def config_help() -> str:
    """One line per reward_trainer field (the TRL fields are documented by TRL)."""
    return PROFILES.describe()


__all__ = ["DEFAULT_TARGET_MODULES", "PROFILES", "ConfigError", "JudgeSFTConfig", "config_from_mapping", "config_help",
           "load_config", "profile_names", "read_profile"]
