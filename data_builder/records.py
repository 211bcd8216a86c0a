"""The on-disk records stages exchange (JSONL, one JSON object a line, each with a ``record`` kind).

- ``dialogue`` (ingest, filter, persona): ``{"record": "dialogue", "id", "source", "origin", "lang",
  "turns": [{"role": "seeker"|"supporter", "text", "strategy": canonical name|null, "strategy_raw"?}],
  "meta": {...}}``. ``origin`` is ``original``, ``persona`` or ``rewrite``; ``meta`` holds the corpus
  metadata (``emotion_type``, ``problem_type``, ``situation``, ``experience_type``, ``initial_intensity``,
  ``final_intensity``, ...).
- ``round`` (sample): one sampled supporter round with its ``history`` (ends with a seeker turn), the
  ``reference`` reply, the gold ``strategy`` and the dialogue's ``meta``.
- ``generation`` (generate): a round plus the LLM's CER ``candidate``.
- ``judge_item`` (silver, annotate): ``history``, ``reference`` (the reply the judge sees first),
  ``candidate`` (CER text), ``labels`` {step1, step2, step3: bool, preference: label}, ``source``.
"""

from __future__ import annotations

import json
import lzma
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cer.dialogue import Turn

Record = dict[str, Any]

DIALOGUE = "dialogue"
ROUND = "round"
GENERATION = "generation"
JUDGE_ITEM = "judge_item"
ORIGINS = ("original", "persona", "rewrite")


def base_dialogue_id(dialogue_id: str) -> str:
    """The id of the corpus dialogue a record derives from (rewrites are ``<id>#persona`` / ``<id>#rewrite``).

    Train/held-out splits group by this id, so a rewrite never leaks a held-out dialogue into training.
    """
    return dialogue_id.split("#", 1)[0]


def turns_of(history: list[dict[str, Any]]) -> list[Turn]:
    """``[{"role", "text"}, ...]`` → :class:`cer.dialogue.Turn` list (extra keys ignored)."""
    return [Turn.from_dict({"role": t["role"], "text": t["text"]}) for t in history]


def plain_history(turns: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """Keep only ``role`` and ``text`` of each turn (the wire form of a history)."""
    return [{"role": str(t["role"]), "text": str(t["text"])} for t in turns]


def read_jsonl(path: str | Path) -> Iterator[Record]:
    """Yield the JSON objects of a JSONL file, xz-compressed when its name ends in ``.xz`` (blank lines skipped);
    raises ``ValueError`` with file:line."""
    with (lzma.open(path, "rt", encoding="utf-8") if str(path).endswith(".xz") else open(path, encoding="utf-8")) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")  # noqa: TRY004 (a data error)
            yield obj


def read_records(paths: Iterable[str | Path], kinds: tuple[str, ...] | None = None) -> list[Record]:
    """All records of several JSONL files, optionally only those whose ``record`` kind is in ``kinds``."""
    out: list[Record] = []
    for p in paths:
        for rec in read_jsonl(p):
            if kinds is None or rec.get("record") in kinds:
                out.append(rec)
    return out


def write_jsonl(path: str | Path, records: Iterable[Record]) -> int:
    """Write records atomically (temp file then rename); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def detect_lang(text: str) -> str:
    """``zh`` when at least 30% of the letters are CJK ideographs, else ``en``."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return "en"
    cjk = sum(1 for c in letters if "\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf")
    return "zh" if cjk / len(letters) >= 0.3 else "en"
