"""Training guards, for both trainers (the GRPO policy trainer and the judge SFT trainer): a step whose gradients
are not finite is skipped instead of written into the weights.

Why (GPU loop run of 2026-11-26, docs/compeer_loop.md): two GRPO arms logged a finite loss but ``grad_norm: NaN``
at the same step; the Trainer clipped (NaN coefficient) and stepped, so the LoRA weights became NaN and the next
generation sampled from NaN probabilities (CUDA device-side assert). A resume re-drew the same batch and died
again. The Trainer has no skip of its own (``logging_nan_inf_filter`` only hides the logged loss), so this callback
drops the gradients before ``optimizer.step()`` (AdamW leaves a parameter without gradient untouched, moments
included), counts the step in ``compeer/nonfinite_grad_steps`` and stops the run after ``max_consecutive`` such
steps in a row, since then the model itself is broken. The 1.5B judge's first LoRA runs on an H200 (2026-11-27,
docs/evaluations/judge-esconv/report.md) hit the same: ``grad_norm: nan`` within the first 10 steps, after which
every loss was NaN; the judge trainer takes the guard too (``JudgeSFTConfig.max_nonfinite_grad_steps``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger(__name__)
METRIC = "compeer/nonfinite_grad_steps"


class NonFiniteGradientError(RuntimeError):
    """Too many optimizer steps in a row had non-finite gradients."""


class SkipNonFiniteGradients(TrainerCallback):
    """Skip optimizer steps with NaN/inf gradients; fail after ``max_consecutive`` in a row (0: never skip)."""

    def __init__(self, max_consecutive: int) -> None:
        self.max_consecutive = max_consecutive
        self.skipped = 0
        self.consecutive = 0

    def check(self, model: torch.nn.Module, step: int) -> bool:
        """Drop every gradient of ``model`` if any is not finite; returns whether the step was skipped."""
        grads = [(p, p.grad) for p in model.parameters() if p.grad is not None]
        if not grads or all(bool(torch.isfinite(g).all()) for _, g in grads):
            self.consecutive = 0
            return False
        names = {id(p): n for n, p in model.named_parameters()}
        bad = [names.get(id(p), "?") for p, g in grads if not bool(torch.isfinite(g).all())]
        for p, _ in grads:
            p.grad = None
        self.skipped += 1
        self.consecutive += 1
        log.warning("step %d: non-finite gradients in %d of %d tensors (first: %s), optimizer step skipped "
                    "(%d in a row, %d in all)", step, len(bad), len(grads), ", ".join(bad[:3]),
                    self.consecutive, self.skipped)
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteGradientError(
                f"{self.consecutive} optimizer steps in a row had non-finite gradients (last: step {step}); "
                "stopping instead of training a broken model (max_nonfinite_grad_steps)")
        return True

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        if self.max_consecutive > 0 and kwargs.get("model") is not None:
            self.check(kwargs["model"], state.global_step + 1)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs is not None and self.max_consecutive > 0:
            logs[METRIC] = float(self.skipped)
