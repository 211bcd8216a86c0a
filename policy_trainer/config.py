"""The GRPO configuration: TRL's ``GRPOConfig`` plus the COMPEER fields, and YAML profiles.

Every field has help text; :meth:`CompeerGRPOConfig.__post_init__` validates and each ``ValueError`` says what
to change. Profiles (``policy_trainer/profiles/*.yaml``) are flat mappings of field names to values; command-line
overrides are applied on top before the config is built (:func:`load_config`).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import GRPOConfig

from cer.modes import RewardJudgeMode
from cer.redundancy import RedundancyMode
from cer.rewards import RewardKind
from judge.profiles import ConfigError, ProfileLoader

PROFILE_DIR = Path(__file__).parent / "profiles"
# host:port, [v6]:port, or a gRPC dns target ("dns:///reward-headless:50051": round-robin over every pod behind it)
_ADDRESS = re.compile(r"^(dns:(//[A-Za-z0-9_.:-]*)?/)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")


class LengthUnit(str, enum.Enum):
    """The unit of L, the mean output length in Eq.7's gate."""

    TOKENS = "tokens"
    WORDS = "words"


class RewardOverlap(str, enum.Enum):
    """When a batch's reward call starts, and what training does while the judge works (``reward_overlap``)."""

    #: TRL's order: rollouts, TRL's log-prob passes, then the reward call, awaited
    OFF = "off"
    #: the reward call starts as soon as the rollouts exist and runs during TRL's log-prob passes: same rewards, same
    #: algorithm
    SAME_STEP = "same_step"
    #: the next step's rollouts are generated and judged while this step trains: samples one optimizer step old
    NEXT_STEP = "next_step"


def _choices(enum_type: type[enum.Enum]) -> str:
    return " | ".join(str(m.value) for m in enum_type)


@dataclass
class CompeerGRPOConfig(GRPOConfig):
    """TRL's GRPOConfig with the reward-service, redundancy, policy, data and warm-up settings of COMPEER."""

    # ---- reward service ----------------------------------------------------------------------------------------
    reward_server: list[str] = field(
        default_factory=list,
        metadata={"help": "gRPC addresses (host:port) of the reward service replicas, used round-robin. "
                          "Required: set `reward_server` in the profile or pass --reward-server ADDR."},
    )
    orm_reward_server: list[str] = field(
        default_factory=list,
        metadata={"help": "judge_mode prm_orm only: gRPC addresses of a separate ORM judge's service; the PRM calls "
                          "then go to reward_server and the ORM calls here (empty: both to reward_server)."},
    )
    judge_mode: str = field(
        default=RewardJudgeMode.UNIFIED.value,
        metadata={"help": f"How rewards are judged: {_choices(RewardJudgeMode)}. prm_orm is the paper's POR "
                          "ablation (modes prm and orm on the same server, summed with the format reward)."},
    )
    reward_kind: str = field(
        default=RewardKind.GRADED.value,
        metadata={"help": f"Which total is the reward: {_choices(RewardKind)}. graded: each component's expected "
                          "reward under the judge's verdict-label probabilities (2 P(True) - 1 per step, the expected "
                          "preference reward, the format reward), so candidates the judge is equally sure about still "
                          "differ; needs a reward server that serves them (Info/meta `graded`), else the run stops "
                          "naming this setting. discrete: the paper's +1/-1 per verdict. Redundancy reweighting "
                          "applies to either; both are logged (compeer/graded_*, compeer/step_reward_mean, ...)."},
    )
    log_completions_file: bool = field(
        default=False,
        metadata={"help": "Write every completion of every reward call to OUTPUT_DIR/completions.jsonl: its text, the "
                          "dialogue id, the degenerate-reply rule's mark, the reward it trained on and the judged "
                          "totals (the data for an adversarial round of judge training). Holds dialogue text, so "
                          "opt-in; never written to the logs."},
    )
    reward_timeout_s: float = field(
        default=120.0,
        metadata={"help": "Deadline of one reward call (one ScoreBatch per generation batch), client retries "
                          "included. Past it, that batch's rewards are None (NaN in TRL) and counted."},
    )
    reward_overlap: str = field(
        default=RewardOverlap.SAME_STEP.value,
        metadata={"help": f"When a batch's reward call starts: {_choices(RewardOverlap)}. same_step (default): as soon "
                          "as the rollouts exist, so the judge works while TRL computes the old-policy and reference "
                          "log-probs; the rewards and the algorithm are TRL's. next_step: the next step's rollouts are "
                          "generated right away and judged while this step trains, so the trainer rarely waits on the "
                          "judge, but every batch is trained one optimizer step after it was sampled (vLLM "
                          "generation's importance-sampling correction covers the gap; transformers generation does "
                          "not) and the first step's prompts are sampled twice (docs/policy_trainer.md)."},
    )
    reward_max_retries: int = field(
        default=3,
        metadata={"help": "Extra attempts after an UNAVAILABLE answer, within reward_timeout_s."},
    )
    reward_token_file: str | None = field(
        default=None,
        metadata={"help": "File holding the bearer token of a reward service with authentication on; without it "
                          "the token is read from env COMPEER_REWARD_TOKEN when set. The token itself is never a "
                          "config field (configs are saved with every checkpoint)."},
    )
    reward_tls: bool = field(
        default=False,
        metadata={"help": "Reach the reward service over TLS (implied by reward_tls_ca / reward_tls_cert); without "
                          "reward_tls_ca the system's roots verify it."},
    )
    reward_tls_ca: str | None = field(default=None, metadata={"help": "PEM CA bundle that signed the reward "
                                                                      "service's certificate."})
    reward_tls_cert: str | None = field(default=None, metadata={"help": "PEM client certificate, for a service "
                                                                        "that requires mutual TLS."})
    reward_tls_key: str | None = field(default=None, metadata={"help": "PEM private key of reward_tls_cert."})
    reward_tls_server_name: str | None = field(
        default=None,
        metadata={"help": "Name the service's certificate must carry when it differs from the address's host."},
    )
    # ---- redundancy (Eq.5-7) -------------------------------------------------------------------------------------
    redundancy_mode: str = field(
        default=RedundancyMode.PAPER.value,
        metadata={"help": f"Redundancy-aware reweighting: {_choices(RedundancyMode)}. paper divides every reward "
                          "by (1 + tau s_in)(1 + tau s_hi) (so redundant negative rewards get less negative); "
                          "sign_aware multiplies negative rewards instead, so redundancy always costs reward."},
    )
    redundancy_alpha: float = field(default=0.5, metadata={"help": "alpha of Eq.7's length gate (paper: 0.5)."})
    redundancy_beta: float = field(default=5.0, metadata={"help": "beta of Eq.7's length gate (paper: 5)."})
    length_unit: str = field(
        default=LengthUnit.TOKENS.value,
        metadata={"help": f"Unit of L, the group's mean output length in Eq.7: {_choices(LengthUnit)}."},
    )
    zero_std_warn_fraction: float = field(
        default=0.8,
        metadata={"help": "Warn when frac_reward_zero_std (groups with no reward spread, hence no learning "
                          "signal) is at least this fraction; the remedy is the SFT warm-up."},
    )
    max_nonfinite_grad_steps: int = field(
        default=3,
        metadata={"help": "A step with NaN/inf gradients is skipped (no update; judge/guards.py); this many "
                          "in a row stop the run. 0: no check (the Trainer then writes NaN into the weights)."},
    )
    # ---- policy --------------------------------------------------------------------------------------------------
    policy_model: str | None = field(
        default="default",
        metadata={"help": "The policy: `default` (the embedded SmolLM2-135M-Instruct), a named base of "
                          "judge/bases.py (e.g. qwen2.5-coder-1.5b, converted once like the judge's) or a local HF "
                          "folder. Nothing is downloaded."},
    )
    policy_dtype: str = field(
        default="float32",
        metadata={"help": "Precision the policy weights are loaded in: float32 | bfloat16."},
    )
    use_lora: bool = field(default=True, metadata={"help": "Train LoRA adapters instead of the full policy."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (lora_alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "Module names that get LoRA adapters."},
    )
    # ---- data --------------------------------------------------------------------------------------------------
    prompt_set: str = field(
        default="smoke",
        metadata={"help": "GRPO prompts: `smoke` (the set shipped in policy_trainer/data), a datasets folder "
                          "written by `compeer-data emit`, or a JSONL file, with columns dialogue_id, history "
                          "[{role, text}], reference and optionally prompt (chat messages)."},
    )
    max_prompts: int | None = field(default=None, metadata={"help": "Use at most this many prompts (None: all)."})
    # ---- SFT warm-up -------------------------------------------------------------------------------------------
    sft_warmup_steps: int = field(
        default=0,
        metadata={"help": "Optimizer steps of SFT on CER-format outputs before GRPO (0: no warm-up). A small "
                          "policy never writes the CER tags unprompted; without a warm-up GRPO sees no reward "
                          "spread in most groups."},
    )
    sft_warmup_epochs: float = field(
        default=0.0,
        metadata={"help": "Epochs of SFT over the warm-up set, used when sft_warmup_steps is 0 (both 0: no warm-up; "
                          "set one of the two). The run writes OUT/warmup/stats.json: the targets' token lengths "
                          "and the share longer than max_completion_length (what GRPO would cut)."},
    )
    sft_warmup_dataset: str = field(
        default="smoke",
        metadata={"help": "Warm-up data: `smoke` or a JSONL/datasets folder with history and target (a CER "
                          "output) columns."},
    )
    sft_warmup_learning_rate: float = field(default=2e-4, metadata={"help": "Learning rate of the SFT warm-up."})
    sft_warmup_batch_size: int = field(
        default=4,
        metadata={"help": "Rows per optimizer step of the SFT warm-up (one device, no accumulation). An epoch of "
                          "the loop's 2,581 ESConv rows is 646 steps at 4 (~4-5 min on an H200 for SmolLM2-135M); a "
                          "GPU takes 16 in about the time of 4."},
    )
    sft_warmup_drop_marked: bool = field(
        default=True,
        metadata={"help": "Leave out warm-up rows whose target reply the degenerate-reply rule marks (the rule GRPO's "
                          "degenerate_share and the loop's report count): ESConv's short real turns (\"I see.\") "
                          "were 147 of the loop's 2,730 targets, and 'short, no word of the conversation' was the "
                          "one-epoch warm-up's most frequent degenerate reply. OUT/warmup/stats.json counts them."},
    )
    sft_warmup_max_length: int = field(
        default=3072,
        metadata={"help": "Longest warm-up row (prompt + target) in tokens; a longer row is cut from the right (its "
                          "target loses its end) and one whose prompt alone reaches it is dropped. ESConv histories "
                          "are long: at 1024, 66 of the loop's 2,730 rows were dropped and 102 cut (SmolLM2 tokens); "
                          "the longest row is 2,145. OUT/warmup/stats.json counts both."},
    )

    def __post_init__(self) -> None:
        self._validate_compeer_fields()
        if self.bf16 is None:
            self.bf16 = _cuda_available()
        elif self.bf16 and not _cuda_available():
            raise ValueError("bf16: true needs a GPU and none is visible; set `bf16: false` in the profile for CPU "
                             "runs (TRL turns bf16 on by default)")
        super().__post_init__()
        self._validate_grouping()

    def _validate_compeer_fields(self) -> None:
        if isinstance(self.reward_server, str):
            self.reward_server = [self.reward_server]
        if not self.reward_server:
            raise ValueError("reward_server is empty: set `reward_server: [host:port]` in the profile or pass "
                             "--reward-server HOST:PORT (start one with `compeer-reward serve`)")
        for addr in self.reward_server:
            if not _ADDRESS.match(addr):
                raise ValueError(f"reward_server entry {addr!r} is not host:port (e.g. localhost:50051) or a "
                                 "dns:///host:port target")
        if isinstance(self.orm_reward_server, str):
            self.orm_reward_server = [self.orm_reward_server]
        for addr in self.orm_reward_server:
            if not _ADDRESS.match(addr):
                raise ValueError(f"orm_reward_server entry {addr!r} is not host:port (e.g. localhost:50052)")
        self.judge_mode = _enum_value(RewardJudgeMode, self.judge_mode, "judge_mode")
        if self.orm_reward_server and self.judge_mode != RewardJudgeMode.PRM_ORM.value:
            raise ValueError("orm_reward_server is used by judge_mode prm_orm only; drop it or set judge_mode: prm_orm")
        self.reward_kind = _enum_value(RewardKind, self.reward_kind, "reward_kind")
        self.reward_overlap = _enum_value(RewardOverlap, self.reward_overlap, "reward_overlap")
        self.redundancy_mode = _enum_value(RedundancyMode, self.redundancy_mode, "redundancy_mode")
        self.length_unit = _enum_value(LengthUnit, self.length_unit, "length_unit")
        for name in ("redundancy_alpha", "redundancy_beta"):
            if not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number (paper: alpha 0.5, beta 5)")
        if self.redundancy_alpha < 0:
            raise ValueError("redundancy_alpha must be >= 0 (a negative alpha would penalise short outputs "
                             "instead of long ones); the paper uses 0.5")
        if not self.reward_timeout_s > 0:
            raise ValueError("reward_timeout_s must be > 0: training must never wait on a dead server unbounded")
        if self.reward_max_retries < 0:
            raise ValueError("reward_max_retries must be >= 0")
        if self.max_nonfinite_grad_steps < 0:
            raise ValueError(f"max_nonfinite_grad_steps must be >= 0 (got {self.max_nonfinite_grad_steps})")
        for name in ("reward_token_file", "reward_tls_ca", "reward_tls_cert", "reward_tls_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name} {path}: no such file")
        if bool(self.reward_tls_cert) != bool(self.reward_tls_key):
            raise ValueError("reward_tls_cert and reward_tls_key go together: give both or neither")
        if not 0.0 <= self.zero_std_warn_fraction <= 1.0:
            raise ValueError("zero_std_warn_fraction is a fraction of groups: set it between 0 and 1")
        if not self.policy_model:
            raise ValueError("policy_model is required: pass --policy-model PATH (a local HF folder) or set "
                             "`policy_model` in the profile (`default` is the embedded SmolLM2-135M)")
        if self.policy_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"policy_dtype must be float32 or bfloat16 (got {self.policy_dtype!r})")
        if self.use_lora and (self.lora_r <= 0 or not self.lora_target_modules):
            raise ValueError("use_lora needs lora_r > 0 and at least one lora_target_modules entry")
        if self.sft_warmup_max_length < 16:
            raise ValueError(f"sft_warmup_max_length {self.sft_warmup_max_length}: expected >= 16 tokens")
        if self.sft_warmup_steps < 0:
            raise ValueError("sft_warmup_steps must be >= 0 (0 turns the SFT warm-up off)")
        if self.sft_warmup_batch_size <= 0:
            raise ValueError(f"sft_warmup_batch_size {self.sft_warmup_batch_size}: expected >= 1 row a step")
        if self.sft_warmup_epochs < 0 or (self.sft_warmup_steps > 0 and self.sft_warmup_epochs > 0):
            raise ValueError(f"sft_warmup_epochs must be >= 0 and is used only when sft_warmup_steps is 0 (got "
                             f"{self.sft_warmup_epochs} epochs beside {self.sft_warmup_steps} steps): set one of them")
        if self.max_prompts is not None and self.max_prompts <= 0:
            raise ValueError("max_prompts must be positive, or null for all prompts")
        if self.log_completions:
            raise ValueError("log_completions prints prompts and completions (dialogue text, which is sensitive); "
                             "keep it false (compeer logs reward statistics only)")

    @property
    def warmup_on(self) -> bool:
        """Whether the run starts with an SFT warm-up (``sft_warmup_steps`` or ``sft_warmup_epochs`` set)."""
        return self.sft_warmup_steps > 0 or self.sft_warmup_epochs > 0

    def _validate_grouping(self) -> None:
        """Each process must hold whole rollout groups: the reweighting (Eq.5-7) works on a group at a time."""
        local = self.per_device_train_batch_size * (self.steps_per_generation or 1)
        group = self.num_generations or 1
        if self.world_size > 1 and local % group != 0:
            raise ValueError(
                f"with {self.world_size} processes each process generates {local} completions per generation "
                f"batch, which splits groups of num_generations={self.num_generations} across processes, and "
                "redundancy reweighting needs the whole group: make per_device_train_batch_size * "
                "steps_per_generation a multiple of num_generations")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _enum_value(enum_type: type[enum.Enum], value: Any, name: str) -> str:
    try:
        return str(enum_type(value.value if isinstance(value, enum.Enum) else value).value)
    except ValueError:
        raise ValueError(f"{name} must be one of {_choices(enum_type)} (got {value!r})") from None


#: the one profile loader (judge.profiles), shared with the judge trainer: flags, checks and error type
PROFILES = ProfileLoader(CompeerGRPOConfig, PROFILE_DIR, "compeer-train grpo", base=GRPOConfig)


def field_names() -> set[str]:
    """Every field a profile or an override may set."""
    return PROFILES.fields()


def resolve_profile(spec: str) -> Path:
    """A profile path, or the name of a shipped profile (``cpu-smoke``, ``gpu-paper``)."""
    return PROFILES.resolve(spec)


def read_profile(spec: str) -> dict[str, Any]:
    """The mapping a profile file holds; raises :class:`ConfigError` naming an unknown key."""
    return PROFILES.read(spec)


def parse_override(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as YAML (so numbers, booleans, lists and null work)."""
    return PROFILES.override(item)


def load_config(spec: str, overrides: Mapping[str, Any] | None = None) -> CompeerGRPOConfig:
    """Build the config from a profile and overrides (later wins). Raises :class:`ConfigError` with the remedy."""
    cfg: CompeerGRPOConfig = PROFILES.load(spec, overrides)
    return cfg


def describe_fields() -> str:
    """One line per COMPEER field with its help text (the TRL fields are documented by TRL)."""
    return PROFILES.describe()


__all__ = ["PROFILES", "CompeerGRPOConfig", "ConfigError", "LengthUnit", "RewardOverlap", "describe_fields",
           "field_names",
           "load_config", "parse_override", "read_profile", "resolve_profile"]
