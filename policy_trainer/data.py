"""GRPO prompt sets and SFT warm-up sets.

The GRPO prompt set written by ``compeer-data emit`` is a datasets folder with columns ``dialogue_id``,
``history`` (``[{role, text}]``), ``reference`` (the reference reply) and ``prompt`` (chat messages). A JSONL file
with the same keys works too, and ``smoke`` names the small set shipped in ``policy_trainer/data``. When
``prompt`` is absent it is built with :func:`cer.policy_prompt.policy_messages`, the one place the policy's
system prompt lives.

Warm-up sets have ``history`` and ``target`` (a CER output, ``<analysis>...</response>``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, load_from_disk

from cer.dialogue import Turn
from cer.policy_prompt import policy_messages
from cer.reasoning import parse

SMOKE_PROMPTS = Path(__file__).parent / "data" / "smoke_prompts.jsonl"
GRPO_COLUMNS = ("dialogue_id", "history", "reference")


def _read_rows(spec: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file, a datasets folder (split ``train`` of a DatasetDict) or the ``smoke`` set."""
    path = SMOKE_PROMPTS if spec == "smoke" else Path(spec)
    if path.is_dir():
        loaded = load_from_disk(str(path))
        if isinstance(loaded, DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"{path}: a DatasetDict without a 'train' split (has {list(loaded)})")
            loaded = loaded["train"]
        return [dict(r) for r in loaded]
    if path.is_file():
        rows = []
        with path.open() as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        return rows
    raise FileNotFoundError(f"prompt set {spec!r}: not `smoke`, a datasets folder or a JSONL file")


def _turns(row: dict[str, Any], where: str) -> list[Turn]:
    raw = row.get("history")
    if not isinstance(raw, list):
        raise ValueError(f"{where}: `history` must be a list of {{role, text}} turns")  # noqa: TRY004 (bad data)
    try:
        return [Turn.from_dict(t) for t in raw]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: bad history turn ({exc}); roles are seeker | supporter") from exc


def _prompt(row: dict[str, Any], turns: list[Turn], where: str) -> list[dict[str, str]]:
    prompt = row.get("prompt")
    if prompt is None:
        return policy_messages(turns)
    if isinstance(prompt, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    raise ValueError(f"{where}: `prompt` must be chat messages [{{role, content}}] (or absent)")


def load_prompt_set(spec: str, max_prompts: int | None = None) -> Dataset:
    """The GRPO training set: columns prompt (chat messages), history, reference, dialogue_id."""
    rows = _read_rows(spec)
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        where = f"{spec} row {i}"
        missing = [c for c in GRPO_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"{where}: missing columns {missing} (expected {list(GRPO_COLUMNS)} [+ prompt])")
        turns = _turns(row, where)
        if not turns:
            raise ValueError(f"{where}: empty history (the policy needs at least the seeker's turn)")
        out.append({"prompt": _prompt(row, turns, where), "history": [t.to_dict() for t in turns],
                    "reference": row["reference"], "dialogue_id": str(row["dialogue_id"])})
        if max_prompts is not None and len(out) >= max_prompts:
            break
    if not out:
        raise ValueError(f"prompt set {spec!r} is empty")
    return Dataset.from_list(out)


def load_warmup_set(spec: str, drop_marked: bool = False) -> tuple[Dataset, dict[str, int]]:
    """SFT warm-up rows in TRL's conversational prompt-completion form; every target must be well-formed CER.

    ``drop_marked``: leave out rows whose target reply the degenerate-reply rule marks in its conversation
    (:func:`data_builder.policy_negatives.mark_reply`, the rule the loop's report and GRPO's ``degenerate_share``
    count; ESConv holds real turns such as "I see." that it marks ``generic/short_no_content``). Returns the rows and
    the count of rows left out per mark."""
    from data_builder.policy_negatives import mark_reply

    out: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    for i, row in enumerate(_read_rows(spec)):
        where = f"{spec} row {i}"
        target = row.get("target")
        if not isinstance(target, str):
            raise ValueError(f"{where}: the warm-up set needs a `target` column (a CER output)")  # noqa: TRY004
        parsed = parse(target)
        if not parsed.ok:
            raise ValueError(f"{where}: target is not well-formed CER (missing {parsed.missing})")
        turns = _turns(row, where)
        mark = mark_reply(parsed.response or "", [t.to_dict() for t in turns]) if drop_marked else None
        if mark is not None:
            dropped[mark] = dropped.get(mark, 0) + 1
            continue
        out.append({"prompt": _prompt(row, turns, where),
                    "completion": [{"role": "assistant", "content": target}]})
    if not out:
        raise ValueError(f"warm-up set {spec!r} is empty" + (f" (every row marked: {dropped})" if dropped else ""))
    return Dataset.from_list(out), dropped
