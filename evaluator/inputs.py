"""The harnesses' inputs: ESC-Eval role cards, SAGE profiles and ESConv held-out turns.

- Role cards, ESC-Eval's JSON: a list of ``{"base": "Age: ...\\nGender: ...\\nOccupation: ...\\nProblem: ...",
  "res": category, "source": corpus, "base_biaozhu": the Chinese rendering, "language": "english"|"chinese",
  "id": int|str}``. ``base`` and ``language`` are required, ``id`` must be unique; the seeker plays ``base`` (a
  Chinese card whose ``base`` is empty plays ``base_biaozhu``).
- SAGE profiles, JSONL: one ``{"id", "player", "scene", "main_cha", "cha_group": [traits], "task"}`` a line; the
  language follows the text (CJK -> Chinese).
- ESConv held-out turns: supporter turns of ESConv dialogues that answer a seeker turn, with the history before
  them, the gold reply and its strategy.

Errors name the file, the item and the field (``cards.json: [3].language: ...``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cer.dialogue import Role, Turn
from cer.taxonomy import load_taxonomy

PACKAGED_CARDS = "data/cards.json"
PACKAGED_PROFILES = "data/profiles.jsonl"


class InputError(ValueError):
    """An input file the harness cannot use; the message names the file, item and field."""


@dataclass(frozen=True)
class Card:
    """One ESC-Eval role card."""

    id: str
    base: str
    res: str
    source: str
    base_biaozhu: str
    language: str

    @property
    def persona(self) -> str:
        """What the seeker plays."""
        return self.base or self.base_biaozhu

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "res": self.res, "source": self.source, "base_biaozhu": self.base_biaozhu,
                "language": self.language, "id": self.id}


@dataclass(frozen=True)
class Profile:
    """One SAGE profile."""

    id: str
    player: str
    scene: str
    main_cha: str
    cha_group: tuple[str, ...]
    task: str

    @property
    def language(self) -> str:
        text = self.player + self.scene + self.task
        return "chinese" if any("\u4e00" <= c <= "\u9fff" for c in text) else "english"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "player": self.player, "scene": self.scene, "main_cha": self.main_cha,
                "cha_group": list(self.cha_group), "task": self.task}


@dataclass(frozen=True)
class GoldTurn:
    """A held-out supporter turn: the history before it, the gold reply and its strategy."""

    id: str
    history: tuple[Turn, ...]
    reference: str
    strategy: str | None
    language: str = "english"


def _text(obj: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    value = obj.get(key, None if required else "")
    if value is None or not isinstance(value, str) or (required and not value.strip()):
        raise InputError(f"{where}.{key}: expected a {'non-empty ' if required else ''}string, got {value!r:.40}")
    return value.strip()


def _read(path: Path | None, packaged: str) -> tuple[str, str]:
    if path is None:
        return resources.files("evaluator").joinpath(packaged).read_text(encoding="utf-8"), f"(packaged) {packaged}"
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc


def load_cards(path: Path | None = None) -> list[Card]:
    """Read role cards in ESC-Eval's JSON format (``None``: the project's own cards)."""
    text, name = _read(path, PACKAGED_CARDS)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: not JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, list) or not data:
        raise InputError(f"{name}: expected a non-empty JSON list of role cards")
    cards, seen = [], set()
    for i, obj in enumerate(data):
        where = f"{name}: [{i}]"
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected an object")
        language = str(obj.get("language", "")).strip().lower()
        if language not in ("english", "chinese"):
            raise InputError(f"{where}.language: expected 'english' or 'chinese', got {obj.get('language')!r:.40}")
        base = _text(obj, "base", where, required=language == "english" or not obj.get("base_biaozhu"))
        if not isinstance(obj.get("id"), (int, str)) or isinstance(obj.get("id"), bool) or str(obj["id"]) == "":
            raise InputError(f"{where}.id: expected an integer or string id")
        card_id = str(obj["id"])
        if card_id in seen:
            raise InputError(f"{where}.id: duplicate id {card_id!r}")
        seen.add(card_id)
        cards.append(Card(card_id, base, _text(obj, "res", where, False), _text(obj, "source", where, False),
                          _text(obj, "base_biaozhu", where, False), language))
    return cards


def load_profiles(path: Path | None = None) -> list[Profile]:
    """Read SAGE profiles, one JSON object a line (``None``: the project's own profiles)."""
    text, name = _read(path, PACKAGED_PROFILES)
    profiles, seen = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected an object")
        traits = obj.get("cha_group")
        if not isinstance(traits, list) or not all(isinstance(t, str) for t in traits):
            raise InputError(f"{where}.cha_group: expected a list of strings")
        if not isinstance(obj.get("id"), (int, str)) or str(obj.get("id")) == "":
            raise InputError(f"{where}.id: expected an integer or string id")
        pid = str(obj["id"])
        if pid in seen:
            raise InputError(f"{where}.id: duplicate id {pid!r}")
        seen.add(pid)
        profiles.append(Profile(pid, _text(obj, "player", where), _text(obj, "scene", where),
                                _text(obj, "main_cha", where, False), tuple(t.strip() for t in traits),
                                _text(obj, "task", where)))
    if not profiles:
        raise InputError(f"{name}: no profile")
    return profiles


def _esconv(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable ESConv JSON list ({exc})") from exc
    if not isinstance(data, list):
        raise InputError(f"{path}: expected ESConv's JSON list of dialogues")
    return data


def cards_from_esconv(path: Path, limit: int | None = None, seed: int = 0) -> list[Card]:
    """ESC-Eval cards from ESConv dialogues (``situation``, ``problem_type``, ``emotion_type``).

    ESConv has no age, gender or occupation: those lines say "Not mentioned", as ESC-Eval's own cards do when the
    source is silent; ``res`` is the problem type, ``id`` the dialogue's index in the file, ``base_biaozhu`` empty
    (no translation is made up). ``limit`` picks that many dialogues at random (``seed``), in file order.
    """
    data = _esconv(path)
    chosen = list(range(len(data)))
    if limit is not None and limit < len(chosen):
        chosen = sorted(random.Random(seed).sample(chosen, limit))
    cards = []
    for i in chosen:
        d = data[i]
        where = f"{path}: [{i}]"
        if not isinstance(d, dict):
            raise InputError(f"{where}: expected a dialogue object")
        situation = _text(d, "situation", where)
        problem = _text(d, "problem_type", where)
        emotion = _text(d, "emotion_type", where)
        base = (f"Age: Not mentioned\nGender: Not mentioned\nOccupation: Not mentioned\n"
                f"Problem: {situation} (problem: {problem}; feeling: {emotion})")
        cards.append(Card(str(i), base, problem, "ESConv", "", "english"))
    return cards


def gold_turns(path: Path, limit: int | None = None, seed: int = 0) -> list[GoldTurn]:
    """Held-out supporter turns of an ESConv file: each supporter turn right after a seeker turn.

    ``limit`` picks that many at random (``seed``), ordered by dialogue and turn. Strategies are normalised with the
    taxonomy (None when unmapped).
    """
    taxonomy = load_taxonomy()
    found: list[GoldTurn] = []
    for i, d in enumerate(_esconv(path)):
        dialog = d.get("dialog") if isinstance(d, dict) else None
        if not isinstance(dialog, list):
            raise InputError(f"{path}: [{i}].dialog: expected a list of turns")
        turns: list[Turn] = []
        for j, t in enumerate(dialog):
            speaker, text = (t.get("speaker"), t.get("content")) if isinstance(t, dict) else (None, None)
            if speaker not in ("seeker", "supporter") or not isinstance(text, str):
                raise InputError(f"{path}: [{i}].dialog[{j}]: expected speaker seeker|supporter and text content")
            if not text.strip():
                continue
            role = Role(speaker)
            if role is Role.SUPPORTER and turns and turns[-1].role is Role.SEEKER:
                raw = ((t.get("annotation") or {}).get("strategy")) or ""
                found.append(GoldTurn(f"{i}-{j}", tuple(turns), text.strip(),
                                      taxonomy.normalise(raw) if raw else None))
            turns.append(Turn(role, text.strip()))
    if limit is not None and limit < len(found):
        keep = set(random.Random(seed).sample(range(len(found)), limit))
        found = [g for k, g in enumerate(found) if k in keep]
    return found
