"""GRPO with the reward call off the critical path (``reward_overlap``), on TRL's ``GRPOTrainer`` as it is.

TRL scores a generation batch in one method (``_generate_and_score_completions``): it generates the rollouts
(``_generate``), runs the old-policy and reference log-prob passes, then calls the reward functions and waits. The
subclass here changes only *when* the compeer reward call starts; TRL's code computes everything else:

* ``same_step``: the call starts the moment ``_generate`` returns, so the judge works during TRL's log-prob passes;
  TRL's later reward call takes that result (:meth:`policy_trainer.rewards.CompeerReward.prefetch`). Same rollouts,
  same rewards, same algorithm.
* ``next_step``: at each generation boundary the batch TRL hands over is generated at once (with the current policy)
  and sent to the judge, and the batch generated at the previous boundary, already judged while the last step
  trained, is the one scored and trained now (TRL's method runs on it with ``_generate`` replaying its rollouts).
  So every batch is trained one optimizer step after it was sampled. With vLLM generation TRL's importance-sampling
  correction (old-policy log-probs against the sampler's) weighs the gap, as it weighs the vLLM/trainer mismatch;
  with transformers generation nothing corrects it. The first boundary has no batch judged ahead: its prompts are
  sampled twice (one batch trained at once, one judged for the next step), and the last boundary's batch is judged
  but never trained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from trl import GRPOTrainer

from policy_trainer.config import RewardOverlap
from policy_trainer.rewards import CompeerReward

log = logging.getLogger(__name__)

#: how many fields TRL's ``_generate`` returns: prompt ids, completion ids, tool mask, completions, (older TRL,
#: e.g. 1.6: num_items_in_batch,) sampling log-probs, extra fields, images, tool images; the overlap reads two of them
_GENERATE_FIELDS = (8, 9)
_COMPLETION_IDS, _COMPLETIONS = 1, 3
#: dataset columns TRL does not pass to reward functions
_NOT_REWARD_COLUMNS = ("prompt", "completion", "completion_ids")


class OverlapUnsupported(ValueError):
    """A trainer setting ``reward_overlap`` cannot be combined with."""


@dataclass
class _Rollout:
    """A generated batch waiting to be scored: TRL's inputs, the prompts generated from, what ``_generate`` gave."""

    inputs: list[dict[str, Any]]
    prompts: list[Any]
    generated: tuple[Any, ...]


class OverlappedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
    """TRL's ``GRPOTrainer`` whose compeer reward call starts before TRL asks for it (see the module docstring).

    Args:
        reward: the compeer reward, also among ``reward_funcs`` (as :meth:`CompeerReward.as_reward_func`).
        overlap: ``same_step`` or ``next_step`` (``off`` is the plain ``GRPOTrainer``).
        *args, **kwargs: ``GRPOTrainer``'s. Tools, environments and a ``rollout_func`` are refused: TRL rewrites
            the prompts for those before generating, which a replayed batch would not match.
    """

    def __init__(self, *args: Any, reward: CompeerReward, overlap: RewardOverlap, **kwargs: Any) -> None:
        if overlap is RewardOverlap.OFF:
            raise OverlapUnsupported("reward_overlap off: use trl.GRPOTrainer itself")
        for name in ("tools", "environment_factory", "rollout_func"):
            if kwargs.get(name):
                raise OverlapUnsupported(f"reward_overlap {overlap.value} does not support {name}: set "
                                         "reward_overlap: off")
        super().__init__(*args, **kwargs)
        self._reward, self._overlap = reward, overlap
        self._scoring: list[dict[str, Any]] | None = None  # same_step: the inputs of the batch being generated
        self._replay: _Rollout | None = None  # next_step: the batch TRL's method is scoring now
        self._ahead: _Rollout | None = None  # next_step: generated and sent to the judge, trained next boundary

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.model is None or not self.model.training:  # evaluation: TRL's order
            return super()._generate_and_score_completions(inputs)
        if self._overlap is RewardOverlap.SAME_STEP:
            self._scoring = inputs
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self._scoring = None
        if self._ahead is None:  # first boundary (or the first after a resume): nothing judged ahead yet
            batch = self._rollout(inputs)
            log.info("reward_overlap next_step: the first batch's prompts are sampled twice (one batch trained now, "
                     "one judged while it trains)")
        else:
            batch = self._ahead
        self._ahead = self._rollout(inputs)
        self._replay = batch
        try:
            return super()._generate_and_score_completions(batch.inputs)
        finally:
            self._replay = None

    def _generate(self, prompts: list[Any]) -> Any:
        if self._replay is not None:
            if prompts != self._replay.prompts:
                raise RuntimeError("reward_overlap next_step: TRL generated from other prompts than the batch "
                                   "being replayed (a TRL change the overlap does not know); set reward_overlap: off")
            return self._replay.generated
        generated = super()._generate(prompts)
        if self._scoring is not None:
            self._start_judging(self._scoring, prompts, generated)
        return generated

    def _rollout(self, inputs: list[dict[str, Any]]) -> _Rollout:
        """Generate ``inputs``' rollouts with the current policy and send them to the judge."""
        prompts = [x["prompt"] for x in inputs]
        generated = super()._generate(prompts)
        self._start_judging(inputs, prompts, generated)
        return _Rollout(inputs, prompts, generated)

    def _start_judging(self, inputs: list[dict[str, Any]], prompts: list[Any], generated: Any) -> None:
        if (not isinstance(generated, tuple) or len(generated) not in _GENERATE_FIELDS
                or len(generated[_COMPLETIONS]) != len(prompts)):
            raise RuntimeError("TRL's _generate returned something other than the tuple of TRL 1.6-1.16 (completion "
                               "ids second, completions fourth) that reward_overlap reads; set reward_overlap: off")
        columns = {key: [x[key] for x in inputs] for key in inputs[0] if key not in _NOT_REWARD_COLUMNS}
        self._reward.prefetch(prompts, generated[_COMPLETIONS], generated[_COMPLETION_IDS], columns, self.async_loop)


__all__ = ["OverlapUnsupported", "OverlappedGRPOTrainer"]
