"""The judge modes: which components of a candidate one judgment decides (see DESIGN.md, UnifiReward).

The service, the trainers and the dataset pipeline all name modes by these values; nothing else defines them.
"""

from __future__ import annotations

import enum


class JudgeMode(str, enum.Enum):
    """How a candidate is judged."""

    UNIFIED = "unified"  # 4 rounds: steps 1-3, then reference vs candidate reply
    SINGLE_PASS = "single_pass"  # one generation judges every component
    PRM = "prm"  # steps only
    ORM = "orm"  # reply preference only

    @property
    def judges_steps(self) -> bool:
        return self is not JudgeMode.ORM

    @property
    def judges_preference(self) -> bool:
        return self is not JudgeMode.PRM
