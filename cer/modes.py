"""The judge modes: which components of a candidate one judgment decides (see DESIGN.md, UnifiReward).

The service, the trainers and the dataset pipeline all name modes by these values; nothing else defines them.
:data:`TRAINED_MODES` are the judges trained (and emitted as SFT sets) one each; :class:`RewardJudgeMode` is how the
policy trainer composes its reward from judge modes.
"""

from __future__ import annotations

import enum


class JudgeMode(str, enum.Enum):
    """How a candidate is judged."""

    UNIFIED = "unified"  # 4 rounds: steps 1-3, then reference vs candidate reply
    SINGLE_PASS = "single_pass"  # one generation judges every component
    PRM = "prm"  # steps only
    ORM = "orm"  # reply preference only
    REPLY = "reply"  # a plain reply judged point-wise (True | False), no reasoning parts, no reference

    @property
    def judges_steps(self) -> bool:
        return self in (JudgeMode.UNIFIED, JudgeMode.SINGLE_PASS, JudgeMode.PRM)

    @property
    def judges_preference(self) -> bool:
        return self in (JudgeMode.UNIFIED, JudgeMode.SINGLE_PASS, JudgeMode.ORM)

    @property
    def judges_reply(self) -> bool:
        return self is JudgeMode.REPLY


#: The judge variants trained separately (judge SFT sets, adapters); single_pass is served by the unified judge,
#: and reply rows can be mixed into another variant's training (``extra_modes``).
TRAINED_MODES: tuple[JudgeMode, ...] = (JudgeMode.UNIFIED, JudgeMode.PRM, JudgeMode.ORM, JudgeMode.REPLY)


class RewardJudgeMode(str, enum.Enum):
    """How the policy trainer asks the reward service to judge.

    ``unified``: UnifiReward's multi-turn judge (steps 1-3 then the reply), the paper's UR/URP.
    ``single_pass``: one judge generation for all four components.
    ``prm_orm``: the paper's POR ablation: two calls on the same server, mode ``prm`` (steps) and mode ``orm``
    (reply preference); the reward is steps + preference + format.
    """

    UNIFIED = JudgeMode.UNIFIED.value
    SINGLE_PASS = JudgeMode.SINGLE_PASS.value
    PRM_ORM = "prm_orm"

    @property
    def judge_modes(self) -> tuple[JudgeMode, ...]:
        """The judge mode of each call one reward needs."""
        return (JudgeMode.PRM, JudgeMode.ORM) if self is RewardJudgeMode.PRM_ORM else (JudgeMode(self.value),)
