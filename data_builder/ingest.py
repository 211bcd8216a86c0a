"""Stage 1, ingest: corpus files → ``dialogues.jsonl`` (see :mod:`data_builder.records`).

Formats:

- ``esconv``: ESConv JSON, a list of dialogues with ``emotion_type``, ``problem_type``, ``situation``,
  ``experience_type``, ``survey_score`` (strings "1".."5", any may be missing) and ``dialog`` turns
  ``{speaker: seeker|supporter, annotation: {strategy}|{feedback}|{}, content}``. A file that does not start
  with ``[`` is read as JSONL (one dialogue a line).
- ``esconv-raw``: the same corpus with speakers ``speaker`` (the seeker) / ``listener`` (the supporter) and
  unnormalised strategy names ("Questions", "Direct Guidance", ...), mapped through the taxonomy aliases.
- ``jsonl``: one dialogue a line: ``{"id"?, "lang"?, "turns"|"messages": [{"role", "text"|"content",
  "strategy"?}], "meta"|"metadata"?: {...}}``; roles seeker|user|client|speaker and supporter|assistant|
  counselor|listener.
- ``sio``: conversations of system/input/output turns, ``{"conversation": [{"system"?, "input", "output"},
  ...]}`` (JSON list or JSONL), as many Chinese counselling corpora ship: input is the seeker, output the
  supporter, the system prompt is kept in ``meta.system``.

Strategy names are normalised with :meth:`cer.taxonomy.Taxonomy.normalise`; names it cannot map are counted
(``unmapped_strategies``) and the turn keeps ``strategy: null`` plus ``strategy_raw``. A malformed record is
reported as ``file:line: reason`` (never its text), counted and skipped; ``--strict`` aborts instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cer.dialogue import Role
from cer.taxonomy import Taxonomy, load_taxonomy
from data_builder.records import DIALOGUE, Record, detect_lang, write_jsonl
from data_builder.stage import StageError, StageRun, add_common, progress

log = logging.getLogger(__name__)
FORMATS = ("esconv", "esconv-raw", "jsonl", "sio")

SEEKER_NAMES = {"seeker", "user", "usr", "client", "help_seeker", "speaker", "human", "求助者", "来访者"}
SUPPORTER_NAMES = {"supporter", "assistant", "sys", "system_supporter", "counselor", "counsellor", "listener",
                   "bot", "gpt", "支持者", "咨询师"}


class MalformedRecord(ValueError):
    """A record that cannot become a dialogue; the message says why (never the record's text)."""


@dataclass
class IngestReport:
    """Counts of an ingest run."""

    read: int = 0
    kept: int = 0
    malformed: int = 0
    duplicates: int = 0
    empty_turns_dropped: int = 0
    strategies: Counter[str] = field(default_factory=Counter)
    unmapped: Counter[str] = field(default_factory=Counter)
    langs: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def as_counts(self) -> dict[str, Any]:
        return {"read": self.read, "kept": self.kept, "malformed": self.malformed, "duplicates": self.duplicates,
                "empty_turns_dropped": self.empty_turns_dropped, "languages": dict(sorted(self.langs.items())),
                "strategies": dict(sorted(self.strategies.items())),
                "unmapped_strategies": dict(self.unmapped.most_common())}


# --- reading files: (line, object) pairs -----------------------------------------------------------------

def iter_json_objects(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` for each element of a top-level JSON array, or each line of a JSONL file.

    A JSONL line that is not JSON yields ``(line, MalformedRecord)``; a syntax error inside a JSON array
    yields one MalformedRecord at its line and ends the file (the rest cannot be re-synchronised).
    """
    text = path.read_text(encoding="utf-8-sig")
    stripped = text.lstrip()
    if not stripped.startswith("["):
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 etc. may occur in text
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, MalformedRecord(f"not JSON ({exc.msg} at column {exc.colno})")
        return
    decoder = json.JSONDecoder()
    idx = len(text) - len(stripped) + 1
    cur_line, counted_to = 1, 0

    def line_at(pos: int) -> int:
        nonlocal cur_line, counted_to
        cur_line += text.count("\n", counted_to, pos)
        counted_to = pos
        return cur_line

    n = len(text)
    while True:
        while idx < n and text[idx] in " \t\r\n":
            idx += 1
        if idx >= n:
            yield line_at(n), MalformedRecord("JSON array is not closed")
            return
        if text[idx] == "]":
            return
        try:
            value, end = decoder.raw_decode(text, idx)
        except json.JSONDecodeError as exc:
            yield line_at(exc.pos), MalformedRecord(f"not JSON ({exc.msg}); rest of file skipped")
            return
        yield line_at(idx), value
        idx = end
        while idx < n and text[idx] in " \t\r\n":
            idx += 1
        if idx < n and text[idx] == ",":
            idx += 1
        elif idx < n and text[idx] != "]":
            yield line_at(idx), MalformedRecord("expected ',' or ']' after an element; rest of file skipped")
            return


# --- converting one object ---------------------------------------------------------------------------------

def _intensity(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        v = int(float(str(value).strip()))
    except ValueError:
        return None
    return v if 1 <= v <= 5 else None


def _role(raw: Any, names_seeker: set[str], names_supporter: set[str]) -> Role:
    key = str(raw).strip().lower() if raw is not None else ""
    if key in names_seeker:
        return Role.SEEKER
    if key in names_supporter:
        return Role.SUPPORTER
    raise MalformedRecord(f"unknown speaker/role {key[:20]!r}")


class Converter:
    """Turns corpus objects into dialogue records, counting strategies and unmapped names."""

    def __init__(self, fmt: str, taxonomy: Taxonomy, report: IngestReport) -> None:
        if fmt not in FORMATS:
            raise StageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.taxonomy = taxonomy
        self.report = report

    def _turn(self, role: Role, text: Any, strategy: Any) -> dict[str, Any] | None:
        if not isinstance(text, str):
            raise MalformedRecord("turn text is not a string")
        text = text.strip()
        if not text:
            self.report.empty_turns_dropped += 1
            return None
        turn: dict[str, Any] = {"role": role.value, "text": text, "strategy": None}
        if role is Role.SUPPORTER and strategy not in (None, ""):
            raw = str(strategy).strip()
            canon = self.taxonomy.normalise(raw)
            if canon is None:
                self.report.unmapped[raw] += 1
                turn["strategy_raw"] = raw
            else:
                self.report.strategies[canon] += 1
                turn["strategy"] = canon
        return turn

    def convert(self, obj: Any) -> Record:
        """One corpus object → a dialogue record (without id); raises MalformedRecord."""
        if not isinstance(obj, dict):
            raise MalformedRecord("record is not a JSON object")
        if self.fmt in ("esconv", "esconv-raw"):
            turns, meta, lang = self._esconv(obj), self._esconv_meta(obj), None
        elif self.fmt == "jsonl":
            turns, meta, lang = self._generic(obj)
        else:
            turns, meta, lang = self._sio(obj)
        if not any(t["role"] == "seeker" for t in turns):
            raise MalformedRecord("no seeker turn")
        if not any(t["role"] == "supporter" for t in turns):
            raise MalformedRecord("no supporter turn")
        lang = lang or detect_lang(" ".join(t["text"] for t in turns[:6]))
        return {"record": DIALOGUE, "source": self.fmt, "origin": "original", "lang": lang, "turns": turns,
                "meta": meta}

    def _esconv(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        dialog = obj.get("dialog")
        if not isinstance(dialog, list) or not dialog:
            raise MalformedRecord("missing or empty 'dialog' list")
        if self.fmt == "esconv":
            seekers, supporters = {"seeker"}, {"supporter"}
        else:
            seekers, supporters = {"speaker", "seeker", "usr"}, {"listener", "supporter", "sys"}
        turns = []
        for i, t in enumerate(dialog):
            if not isinstance(t, dict):
                raise MalformedRecord(f"dialog[{i}] is not an object")
            try:
                role = _role(t.get("speaker"), seekers, supporters)
            except MalformedRecord as exc:
                raise MalformedRecord(f"dialog[{i}]: {exc}") from None
            ann = t.get("annotation") or {}
            if not isinstance(ann, dict):
                raise MalformedRecord(f"dialog[{i}].annotation is not an object")
            strategy = ann.get("strategy", t.get("strategy"))
            turn = self._turn(role, t.get("content", t.get("text")), strategy)
            if turn is not None:
                fb = _intensity(ann.get("feedback"))
                if fb is not None:
                    turn["feedback"] = fb
                turns.append(turn)
        return turns

    @staticmethod
    def _esconv_meta(obj: dict[str, Any]) -> dict[str, Any]:
        def obj_at(d: dict[str, Any], key: str) -> dict[str, Any]:
            v = d.get(key)
            return v if isinstance(v, dict) else {}

        survey = obj_at(obj, "survey_score")
        seeker, supporter = obj_at(survey, "seeker"), obj_at(survey, "supporter")
        meta: dict[str, Any] = {k: str(obj[k]).strip() for k in ("experience_type", "emotion_type", "problem_type",
                                                                    "situation") if obj.get(k) not in (None, "")}
        meta["initial_intensity"] = _intensity(seeker.get("initial_emotion_intensity"))
        meta["final_intensity"] = _intensity(seeker.get("final_emotion_intensity"))
        meta["survey"] = {"seeker_empathy": _intensity(seeker.get("empathy")),
                          "seeker_relevance": _intensity(seeker.get("relevance")),
                          "supporter_relevance": _intensity(supporter.get("relevance"))}
        return meta

    def _generic(self, obj: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], str | None]:
        raw_turns = obj.get("turns", obj.get("messages"))
        if not isinstance(raw_turns, list) or not raw_turns:
            raise MalformedRecord("missing or empty 'turns' list")
        turns = []
        for i, t in enumerate(raw_turns):
            if not isinstance(t, dict):
                raise MalformedRecord(f"turns[{i}] is not an object")
            if str(t.get("role", "")).lower() == "system":
                continue
            try:
                role = _role(t.get("role", t.get("speaker")), SEEKER_NAMES, SUPPORTER_NAMES)
            except MalformedRecord as exc:
                raise MalformedRecord(f"turns[{i}]: {exc}") from None
            turn = self._turn(role, t.get("text", t.get("content")), t.get("strategy"))
            if turn is not None:
                turns.append(turn)
        meta = obj.get("meta", obj.get("metadata")) or {}
        if not isinstance(meta, dict):
            raise MalformedRecord("'meta' is not an object")
        meta = dict(meta)
        for k in ("initial_intensity", "final_intensity"):
            if k in meta:
                meta[k] = _intensity(meta[k])
        if obj.get("id") not in (None, ""):
            meta["corpus_id"] = str(obj["id"])
        lang = obj.get("lang")
        return turns, meta, str(lang) if lang in ("en", "zh") else None

    def _sio(self, obj: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], str | None]:
        conv = obj.get("conversation", obj.get("conversations"))
        if not isinstance(conv, list) or not conv:
            raise MalformedRecord("missing or empty 'conversation' list")
        turns, meta = [], {}
        for i, t in enumerate(conv):
            if not isinstance(t, dict):
                raise MalformedRecord(f"conversation[{i}] is not an object")
            if "input" not in t or "output" not in t:
                raise MalformedRecord(f"conversation[{i}] lacks 'input' or 'output'")
            if t.get("system") and "system" not in meta:
                meta["system"] = str(t["system"]).strip()
            for role, key in ((Role.SEEKER, "input"), (Role.SUPPORTER, "output")):
                turn = self._turn(role, t[key], t.get("strategy") if role is Role.SUPPORTER else None)
                if turn is not None:
                    turns.append(turn)
        if obj.get("id") not in (None, ""):
            meta["corpus_id"] = str(obj["id"])
        lang = obj.get("lang")
        return turns, meta, str(lang) if lang in ("en", "zh") else None


def dialogue_id(fmt: str, record: Record) -> str:
    """Stable id: the corpus id when it has one, else a content hash of the turns (order-independent of files)."""
    corpus_id = record["meta"].get("corpus_id")
    if corpus_id:
        return f"{fmt}-{corpus_id}"
    h = hashlib.sha256(json.dumps([(t["role"], t["text"]) for t in record["turns"]], ensure_ascii=False)
                       .encode("utf-8")).hexdigest()
    return f"{fmt}-{h[:16]}"


def ingest_files(paths: list[Path], fmt: str, taxonomy: Taxonomy | None = None, strict: bool = False,
                 limit: int | None = None, report: IngestReport | None = None) -> tuple[list[Record], IngestReport]:
    """Load dialogues from corpus files; returns the records and the report (counts, errors as file:line).

    ``limit`` stops after that many records were read. ``strict`` raises :class:`StageError` at the first
    malformed record.
    """
    report = report or IngestReport()
    conv = Converter(fmt, taxonomy or load_taxonomy(), report)
    out: list[Record] = []
    seen: set[str] = set()
    for path in paths:
        if not path.is_file():
            raise StageError(f"{path}: no such file")
        for lineno, obj in progress(iter_json_objects(path), f"ingest {path.name}"):
            if limit is not None and report.read >= limit:
                return out, report
            report.read += 1
            try:
                if isinstance(obj, MalformedRecord):
                    raise obj
                rec = conv.convert(obj)
            except MalformedRecord as exc:
                msg = f"{path}:{lineno}: {exc}"
                if strict:
                    raise StageError(f"malformed record (--strict): {msg}") from None
                report.malformed += 1
                report.errors.append(msg)
                if len(report.errors) <= 20:
                    log.warning("skipping malformed record %s", msg)
                elif len(report.errors) == 21:
                    log.warning("more malformed records: see malformed.jsonl of the output folder")
                continue
            rec["id"] = dialogue_id(fmt, rec)
            if rec["id"] in seen:
                report.duplicates += 1
                continue
            seen.add(rec["id"])
            rec = {"record": rec["record"], "id": rec["id"], **{k: v for k, v in rec.items() if k not in ("record", "id")}}
            report.langs[rec["lang"]] += 1
            out.append(rec)
    report.kept = len(out)
    return out, report


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data ingest``."""
    p = sub.add_parser("ingest", help="load corpus files into dialogue records",
                       description="Load ESConv / raw ESConv / JSONL / system-input-output corpora.")
    add_common(p)
    p.add_argument("--format", required=True, choices=FORMATS, help="input format")
    p.add_argument("--strict", action="store_true", help="abort at the first malformed record")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML (default: cer's ESConv eight)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the ingest stage."""
    st = StageRun("ingest", args.out, argv, list(args.inputs),
                  params={"format": args.format, "strict": args.strict, "limit": args.limit, "taxonomy": args.taxonomy})
    records, report = ingest_files([Path(p) for p in args.inputs], args.format, load_taxonomy(args.taxonomy),
                                   strict=args.strict, limit=args.limit)
    report.kept = len(records)
    write_jsonl(st.path("dialogues.jsonl"), records)
    write_jsonl(st.path("malformed.jsonl"), ({"error": e} for e in report.errors))
    st.counts = report.as_counts()
    st.finish(quiet=args.quiet)
    return 0
