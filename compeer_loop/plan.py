"""The plan: which policy arms there are, which judge (reward server) each trains against, and the settings every
arm shares (same seed, steps, data), defined once here.

Arms (issue 17): (a) the SFT warm-up alone; (b) GRPO against the untrained base judge; (c) GRPO against the shipped
trained judge with redundancy reweighting ``paper``; (d) the same with ``sign_aware``; (e) with reweighting off;
(f) against separate PRM and ORM judges (the paper's POR ablation; needs their adapters). Every GRPO arm starts
from arm (a)'s warm-up adapter, so the arms differ only in the judge and the reweighting. (c), (d), (e) share one
reward server (same judge); GRPO arms run concurrently, one process each.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any

from compeer_loop.prompts import TRAIN_FILE, WARMUP_FILE


@dataclass(frozen=True)
class JudgeServer:
    """One reward server: the judge it serves (``adapter``: ``default`` = shipped trained judge merged into the base,
    ``none`` = the untrained base, or a PEFT folder) and its ports."""

    name: str
    adapter: str
    grpc_port: int
    http_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass(frozen=True)
class Arm:
    """One policy: trained with GRPO against ``judges`` (one server, or PRM then ORM servers), or warm-up only."""

    name: str
    title: str
    judges: tuple[str, ...] = ()
    judge_mode: str = "unified"
    redundancy_mode: str = "paper"

    @property
    def grpo(self) -> bool:
        return bool(self.judges)


ARMS: tuple[Arm, ...] = (
    Arm("a", "SFT warm-up only"),
    Arm("b", "GRPO, untrained base judge, reweighting paper", ("base",)),
    Arm("c", "GRPO, trained judge, reweighting paper", ("trained",)),
    Arm("d", "GRPO, trained judge, reweighting sign_aware", ("trained",), redundancy_mode="sign_aware"),
    Arm("e", "GRPO, trained judge, reweighting off", ("trained",), redundancy_mode="off"),
    Arm("f", "GRPO, PRM + ORM judges, reweighting paper", ("prm", "orm"), judge_mode="prm_orm"),
)
ARM_BY_NAME = {a.name: a for a in ARMS}
#: the policy evaluated beside the arms: SmolLM2 as shipped, no warm-up, no GRPO
BASE_POLICY = "base"
#: ``independent_scorer`` values: the bare base of the device's default judge; not run
JUDGE_BASE, NO_SCORER = "judge-base", "none"
#: ``independent_scorer`` ``base:NAME``: the named base of judge/bases.py, served bare
BASE_SCORER_PREFIX = "base:"
#: ``judge_backend`` / ``generation`` values
ENGINES = ("transformers", "vllm")
#: TRL's colocated vLLM runs under torch.distributed's one-process launch; arms running at once need their own port
MASTER_PORT_BASE = 29500


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class LoopSettings:
    """Everything the loop is told; every arm gets the same values. Saved to ``ROOT/plan.json``."""

    prompts: str = field(default="", metadata=_help("folder written by `compeer-loop prompts`"))
    arms: list[str] = field(default_factory=lambda: [a.name for a in ARMS], metadata=_help("arms to run"))
    steps: int = field(default=30, metadata=_help("GRPO optimizer steps of every GRPO arm"))
    seed: int = field(default=0, metadata=_help("seed of every arm (sampling, data order, LoRA init)"))
    profile: str = field(default="gpu-paper", metadata=_help("policy_trainer profile (gpu-paper, cpu-smoke, a YAML)"))
    policy_model: str = field(default="default", metadata=_help(
        "`default` (SmolLM2-135M-Instruct), a base name of judge/bases.py (qwen2.5-coder-1.5b) or an HF folder"))
    device: str = field(default="cuda", metadata=_help("device of the reward servers and the evaluation: cuda | cpu"))
    learning_rate: float = field(default=2.0e-5, metadata=_help("GRPO learning rate (LoRA of a 135M policy)"))
    max_completion_length: int = field(default=256, metadata=_help(
        "new tokens per GRPO completion: 256 holds 99.5% of the warm-up targets in SmolLM2's tokens (160 cut 13.9%; "
        "each run's warmup/stats.json measures it)"))
    warmup_steps: int = field(default=0, metadata=_help(
        "SFT warm-up steps (arm a; every GRPO arm starts there); 0: warmup_epochs instead"))
    warmup_epochs: float = field(default=1.0, metadata=_help(
        "SFT warm-up epochs over the warm-up rows, when warmup_steps is 0 (one epoch of 2,730 rows: 683 steps of 4)"))
    warmup_learning_rate: float = field(default=3.0e-4, metadata=_help("SFT warm-up learning rate"))
    save_steps: int = field(default=5, metadata=_help("checkpoint every N GRPO steps (what a resumed arm loses)"))
    grpo_sets: list[str] = field(default_factory=list, metadata=_help("extra KEY=VALUE overrides for every GRPO arm"))
    static_cache: bool = field(default=True, metadata=_help(
        "reward servers with --static-cache (GPU, transformers engine only)"))
    judge_backend: str = field(default="transformers", metadata=_help(
        "the reward servers' engine: `transformers` (the loop's figures so far) or `vllm` (the serving default on a "
        "GPU; on cuda with the CUDA image's `line` rationale bound; needs vLLM importable)"))
    judge_gpu_memory: float = field(default=0.12, metadata=_help(
        "judge_backend vllm on cuda: each reward server's --gpu-memory-utilization (up to four 1.5B judges share the "
        "first card: 0.12 of an H200 is 17 GB each, the weights 3.1 GB of it)"))
    generation: str = field(default="transformers", metadata=_help(
        "how the GRPO arms generate: `transformers` (the figures so far) or `vllm`, TRL's colocated vLLM (~2 s a step "
        "against ~16-22 s on an H200, docs/policy_trainer.md); with vllm the arms train with gradient checkpointing "
        "(ESConv conversations x 32 completions ran a policy out of memory without it beside a judge)"))
    policy_vllm_memory: float = field(default=0.2, metadata=_help(
        "generation vllm: each arm's vllm_gpu_memory_utilization (the share of its card TRL's vLLM takes)"))
    embedding_model: str = field(default="default", metadata=_help("reward servers' --embedding-model"))
    prm_adapter: str | None = field(default=None, metadata=_help("PRM judge adapter folder (arm f)"))
    orm_adapter: str | None = field(default=None, metadata=_help("ORM judge adapter folder (arm f)"))
    max_concurrent_arms: int | None = field(default=None, metadata=_help(
        "GRPO arms trained at once; unset: one per arm card on a machine with several GPUs (the judge servers on the "
        "first card, the arms on the others), 2 where the arms share one card. One arm at max_completion_length 160 "
        "on ESConv prompts held 48-74 GB on an H200 (more while its completions stay long), so 2 on a 140 GB card, 1 "
        "on an 80 GB one; an arm that runs out of GPU memory beside another on its card runs again alone (not a "
        "failed try), and one arm per card from then on"))
    cards: list[str] = field(default_factory=list, metadata=_help(
        "GPU cards the driver places processes on (CUDA_VISIBLE_DEVICES entries; the first gets the judge servers "
        "and evaluations, the others the arms); empty: CUDA_VISIBLE_DEVICES or every card nvidia-smi lists"))
    judge_probe_groups: int = field(default=8, metadata=_help(
        "groups (2 CER candidates each, from the first warm-up rows) every GRPO arm's judge scores before the arm "
        "trains; their component means go to ROOT/<arm>/judge.json and the report"))
    max_restarts: int = field(default=2, metadata=_help("times a failed arm is resumed from its last checkpoint"))
    eval_policies: list[str] = field(default_factory=lambda: [BASE_POLICY, *(a.name for a in ARMS)],
                                     metadata=_help("policies evaluated (arms + `base`)"))
    eval_max_tokens: int = field(default=200, metadata=_help("new tokens per evaluation reply (greedy)"))
    eval_limit: int | None = field(default=None, metadata=_help("evaluate on the first N eval prompts (None: all)"))
    esc_cards: int = field(default=50, metadata=_help(
        "ESC-Eval-style dialogues per policy (the first N cards of the valid dialogues; simulator and scorer: the "
        "base SmolLM2-135M-Instruct, the only model offline); 0: not run"))
    esc_rounds: int = field(default=5, metadata=_help("seeker/policy rounds of each ESC-Eval-style dialogue"))
    independent_scorer: str = field(default=JUDGE_BASE, metadata=_help(
        "the scorer that is not the training judge (issue 26 item 4): compares every evaluation reply with the real "
        "reply, zero-shot, and plays the simulator + scorer of the ESC-Eval-style step. `judge-base`: the bare base "
        "of the device's default judge (Qwen2.5-Coder-1.5B on cuda, SmolLM2-135M on cpu: arm b's training judge "
        "too); `base:NAME`: a base of judge/bases.py served bare (base:qwen2.5-coder-0.5b: weights no arm's judge "
        "has); or `default` (SmolLM2-135M-Instruct) or an HF folder; `none`: not run"))
    independent_scorer_adapter: str = field(default="none", metadata=_help(
        "the independent scorer's adapter: `none` (the bare model) or a PEFT folder; never a training judge's "
        "(`default`, the PRM/ORM adapters: the plan is refused)"))
    distinct_first_tokens: int = field(default=16, metadata=_help(
        "distinct-n is also reported on each reply's first N tokens (apart from reply length)"))
    eval_concurrency: int = field(default=64, metadata=_help("evaluation requests in flight per policy"))
    server_wait_s: float = field(default=420.0, metadata=_help("how long a reward server may take to become ready"))
    base_port: int = field(default=50061, metadata=_help("gRPC port of the first judge server (HTTP: base_port + 100 + i)"))

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARM_BY_NAME]
        if unknown:
            raise ValueError(f"arms {unknown}: expected names among {list(ARM_BY_NAME)}")
        bad = [p for p in self.eval_policies if p != BASE_POLICY and p not in ARM_BY_NAME]
        if bad:
            raise ValueError(f"eval_policies {bad}: expected `base` or arm names")
        if self.steps < 1 or self.save_steps < 1 or self.warmup_steps < 0 or self.warmup_epochs < 0:
            raise ValueError("steps and save_steps must be >= 1, warmup_steps and warmup_epochs >= 0")
        if self.warmup_steps == 0 and self.warmup_epochs <= 0:
            raise ValueError("set warmup_steps or warmup_epochs: every GRPO arm starts from the warm-up")
        if self.esc_cards < 0 or self.esc_rounds < 1:
            raise ValueError(f"esc_cards must be >= 0 and esc_rounds >= 1 (got {self.esc_cards}, {self.esc_rounds})")
        if self.judge_probe_groups < 1:
            raise ValueError(f"judge_probe_groups must be >= 1 (got {self.judge_probe_groups}): the probe is the "
                             "control that each arm's judge scores what its plan says")
        if self.max_concurrent_arms is not None and self.max_concurrent_arms < 1:
            raise ValueError(f"max_concurrent_arms must be >= 1 (got {self.max_concurrent_arms})")
        if self.distinct_first_tokens < 2:
            raise ValueError(f"distinct_first_tokens must be >= 2 (got {self.distinct_first_tokens})")
        scorer_base_error(self.independent_scorer, self.independent_scorer_adapter)
        training = {a for a in ("default", self.prm_adapter, self.orm_adapter) if a}
        if self.independent_scorer != NO_SCORER and self.independent_scorer_adapter in training:
            raise ValueError(f"independent_scorer_adapter {self.independent_scorer_adapter!r} is a training judge's "
                             "adapter: the independent scorer must not be the judge an arm trains against")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device {self.device!r}: expected cuda or cpu")
        for name in ("judge_backend", "generation"):
            if getattr(self, name) not in ENGINES:
                raise ValueError(f"{name} {getattr(self, name)!r}: expected one of {', '.join(ENGINES)}")
        for name in ("judge_gpu_memory", "policy_vllm_memory"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} {getattr(self, name)}: expected a fraction of the card in (0, 1)")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopSettings:
        names = {f.name for f in fields(cls)}
        # a plan written before the ESC-Eval-style step / the independent scorer existed did not run them
        return cls(**{"esc_cards": 0, "independent_scorer": NO_SCORER, **{k: v for k, v in data.items() if k in names}})


def scorer_base(scorer: str) -> str | None:
    """The base name of an ``independent_scorer`` ``base:NAME`` (None for any other value)."""
    return scorer[len(BASE_SCORER_PREFIX):] if scorer.startswith(BASE_SCORER_PREFIX) else None


def scorer_base_error(scorer: str, adapter: str | None) -> None:
    """ValueError, listing the valid names, when ``scorer`` is ``base:NAME`` with NAME no base of judge/bases.py,
    or with an adapter (a named base is served bare)."""
    name = scorer_base(scorer)
    if name is None:
        return
    from judge.model_store import BASES

    if name not in BASES:
        raise ValueError(f"independent_scorer {scorer!r}: no base {name!r} in judge/bases.py; expected "
                         f"{', '.join(BASE_SCORER_PREFIX + b for b in BASES)}, {JUDGE_BASE}, {NO_SCORER} or a folder")
    if adapter not in (None, "", "none"):
        raise ValueError(f"independent_scorer {scorer!r} is served bare: independent_scorer_adapter must be none, "
                         f"not {adapter!r}")


def all_judges(s: LoopSettings) -> dict[str, JudgeServer]:
    """Every judge the loop knows, with its ports (fixed by the judge, so a restarted loop finds them)."""
    adapters = {"base": "none", "trained": "default", "prm": s.prm_adapter or "", "orm": s.orm_adapter or ""}
    return {name: JudgeServer(name, adapters[name], s.base_port + i, s.base_port + 100 + i)
            for i, name in enumerate(("base", "trained", "prm", "orm"))}


def judge_servers(s: LoopSettings) -> dict[str, JudgeServer]:
    """The judges the selected arms and evaluations need (the servers the driver starts)."""
    needed = {j for a in s.arms for j in ARM_BY_NAME[a].judges}
    if s.eval_policies:
        needed.add("trained")  # the evaluation scores every policy with the trained judge
    return {name: j for name, j in all_judges(s).items() if name in needed}


def server_argv(j: JudgeServer, s: LoopSettings, log_level: str = "INFO") -> list[str]:
    """``compeer-reward serve`` for one judge (the plan's ``judge_backend``, in-memory result cache)."""
    argv = [sys.executable, "-m", "reward_server.cli", "serve", "--backend", s.judge_backend, "--model", "default",
            "--adapter", j.adapter, "--device", s.device, "--embedding-model", s.embedding_model,
            "--cache", "memory", "--host", "127.0.0.1", "--grpc-port", str(j.grpc_port),
            "--http-port", str(j.http_port), "--log-level", log_level]
    if s.device == "cuda" and s.judge_backend == "vllm":  # the CUDA image's bound for the 1.5B judge
        argv += ["--rationale-bound", "line", "--gpu-memory-utilization", str(s.judge_gpu_memory)]
    elif s.static_cache and s.device == "cuda":
        argv.append("--static-cache")
    return argv


def _yaml(value: Any) -> str:
    """A value as ``--set`` reads it (YAML); floats positional, since YAML 1.1 reads ``2e-05`` as a string."""
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")
    return json.dumps(value)


def warmup_length(s: LoopSettings) -> str:
    """The warm-up's length as the plan sets it (``80 steps``, ``1 epoch(s)``)."""
    return f"{s.warmup_steps} steps" if s.warmup_steps else f"{s.warmup_epochs:g} epoch(s)"


def grpo_overrides(s: LoopSettings, arm: Arm, prompts: Path) -> list[str]:
    """The ``--set KEY=VALUE`` items of an arm: the shared settings, then the arm's judge mode and reweighting."""
    values: dict[str, Any] = {
        "judge_mode": arm.judge_mode, "redundancy_mode": arm.redundancy_mode, "seed": s.seed,
        "learning_rate": s.learning_rate, "max_completion_length": s.max_completion_length,
        "sft_warmup_steps": s.warmup_steps, "sft_warmup_epochs": 0.0 if s.warmup_steps else s.warmup_epochs,
        "sft_warmup_dataset": str(prompts / WARMUP_FILE),
        "sft_warmup_learning_rate": s.warmup_learning_rate, "save_strategy": "steps", "save_steps": s.save_steps,
        "disable_tqdm": True}
    if s.device == "cuda":
        values["gradient_checkpointing"] = s.generation == "vllm"
    if s.generation == "vllm":
        values.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=s.policy_vllm_memory)
    out = [f"{k}={_yaml(v)}" for k, v in values.items()]
    return out + list(s.grpo_sets)


def grpo_argv(arm: Arm, s: LoopSettings, root: Path, servers: dict[str, JudgeServer], resume: bool) -> list[str]:
    """``compeer-train grpo`` for one arm; PRM + ORM arms name the ORM server with ``orm_reward_server``."""
    prompts = Path(s.prompts)
    argv = [sys.executable, "-m", "policy_trainer.cli", "grpo", "--config", s.profile, "--out", str(root / arm.name),
            "--max-steps", str(s.steps), "--policy-model", s.policy_model, "--prompt-set", str(prompts / TRAIN_FILE),
            "--reward-server", servers[arm.judges[0]].address]
    for item in grpo_overrides(s, arm, prompts):
        argv += ["--set", item]
    if arm.judge_mode == "prm_orm":
        argv += ["--set", f"orm_reward_server={json.dumps([servers[arm.judges[1]].address])}"]
    if resume:
        argv.append("--resume")
    return argv


def arm_env(arm: Arm, s: LoopSettings) -> dict[str, str]:
    """The environment a GRPO arm needs beyond its card: with ``generation`` vllm, torch.distributed's one-process
    launch for TRL's colocated vLLM, on a port of the arm's own (arms train at once, and so do the arms of seed
    replicates on other cards: the port also depends on the seed)."""
    if s.generation != "vllm":
        return {}
    port = MASTER_PORT_BASE + [a.name for a in ARMS].index(arm.name) + len(ARMS) * (s.seed % 100)
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def warmup_argv(s: LoopSettings, root: Path) -> list[str]:
    """Arm (a): the SFT warm-up alone, with the settings every GRPO arm then starts from."""
    return [sys.executable, "-m", "compeer_loop.cli", "warmup", "--root", str(root)]


def arm_missing_inputs(arm: Arm, s: LoopSettings) -> str | None:
    """Why an arm cannot run with these settings (None: it can)."""
    if arm.judge_mode == "prm_orm" and not (s.prm_adapter and s.orm_adapter):
        return "no PRM/ORM judge adapters given (--prm-adapter, --orm-adapter)"
    return None
