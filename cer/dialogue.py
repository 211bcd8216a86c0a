"""Dialogue types shared by every compeer package."""

from __future__ import annotations

import enum
import unicodedata
from dataclasses import dataclass


class Role(str, enum.Enum):
    """Who speaks a turn of an emotional-support conversation."""

    SEEKER = "seeker"
    SUPPORTER = "supporter"


@dataclass(frozen=True)
class Turn:
    """One utterance of a conversation."""

    role: Role
    text: str

    def to_dict(self) -> dict[str, str]:
        """The JSON form used on the wire and on disk: ``{"role": ..., "text": ...}``."""
        return {"role": self.role.value, "text": self.text}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> Turn:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` on an unknown role."""
        return cls(role=Role(data["role"]), text=data["text"])


def normalise_text(text: str) -> str:
    """Canonical form of an utterance for hashing: NFC, whitespace runs collapsed, ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def normalise_history(history: list[Turn]) -> list[tuple[str, str]]:
    """Canonical form of a history (used in cache keys)."""
    return [(t.role.value, normalise_text(t.text)) for t in history]
