"""UnifiReward training and measurement: judge SFT (unified, PRM-only, ORM-only) with TRL + PEFT LoRA,
held-out evaluation through the serving judge (:class:`judge.conversation.Judge`), the process/outcome
inconsistency audit (paper Fig. 5a) and the duplicate / rewrite / persona ablation.

Heavy imports (torch, transformers, trl, peft, datasets, sklearn, matplotlib) happen inside the functions that
need them, so importing this package is cheap.
"""

from cer.modes import TRAINED_MODES

#: The judge variants this package trains and evaluates, by mode name (:data:`cer.modes.TRAINED_MODES`).
VARIANTS: tuple[str, ...] = tuple(m.value for m in TRAINED_MODES)

__all__ = ["VARIANTS"]
