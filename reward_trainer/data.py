"""Reading data_builder's judge SFT sets and tokenising them with the judge's turns as the only labels (Eq. 4).

A judge SFT set is a ``datasets.DatasetDict`` saved with ``save_to_disk`` at ``OUT/judge_sft/<mode>/`` with
splits ``train`` and ``heldout`` and the columns of :data:`REQUIRED_COLUMNS`; ``messages`` is
:func:`judge.protocol.render_judge_chat`'s output (system, then user/assistant per judge round).

Label masking: the conversation is rendered with the tokenizer's own chat template (the one the serving engines
use), and every token is masked (-100) except those of the judge's assistant turns: the turn's content and its
end-of-turn marker (e.g. ``<|im_end|>``); the template's role header (``<|im_start|>assistant\\n``) and the
whitespace after the marker are masked. Spans are found on characters (each prefix rendering must be a prefix of
the full rendering) and mapped to tokens with the fast tokenizer's offsets, so BPE merges across turn
boundaries cannot shift them.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_trainer import VARIANTS

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

log = logging.getLogger(__name__)

REQUIRED_COLUMNS: tuple[str, ...] = ("messages", "dialogue_id", "history", "reference", "candidate", "labels", "mode")
TRAIN_SPLIT = "train"
HELDOUT_SPLIT = "heldout"
IGNORE_INDEX = -100


def resolve_variant_dir(data_dir: str | Path, variant: str) -> Path:
    """``data_dir/<variant>`` when it is a saved DatasetDict, else ``data_dir`` itself when it is one."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    root = Path(data_dir)
    for candidate in (root / variant, root):
        if (candidate / "dataset_dict.json").is_file():
            return candidate
    raise FileNotFoundError(f"no judge SFT set for variant {variant!r} under {root}: expected {root / variant}/ "
                            "(a datasets.DatasetDict saved by `compeer-data emit`, splits train and heldout)")


def load_judge_set(data_dir: str | Path, variant: str) -> DatasetDict:
    """Load and validate the judge SFT set of ``variant`` (columns, splits, mode column)."""
    from datasets import load_from_disk

    path = resolve_variant_dir(data_dir, variant)
    dsd = load_from_disk(str(path))
    if not hasattr(dsd, "keys"):
        raise ValueError(f"{path}: expected a DatasetDict with splits {TRAIN_SPLIT!r} and {HELDOUT_SPLIT!r}")
    for split in dsd:
        missing = [c for c in REQUIRED_COLUMNS if c not in dsd[split].column_names]
        if missing:
            raise ValueError(f"{path} split {split!r} lacks columns {missing}; re-run `compeer-data emit`")
        modes = set(dsd[split].unique("mode"))
        if modes - {variant}:
            raise ValueError(f"{path} split {split!r} holds mode(s) {sorted(modes)}, not {variant!r}: point "
                             "data_dir at the judge_sft root or at the folder of this variant")
    return dsd


def check_template(ds: Dataset, system_prompt: str, template_version: str) -> None:
    """Refuse a set rendered with another judge template than the one the served judge uses."""
    if len(ds) == 0:
        return
    first = ds[0]["messages"]
    if not first or first[0].get("role") != "system" or first[0].get("content") != system_prompt:
        raise ValueError(f"the judge SFT set was not rendered with template {template_version!r} (its system prompt "
                         "differs): re-emit it with that template or set `template:` to the one it used")


def judge_turn_labels(tokenizer: Any, messages: list[dict[str, str]]) -> dict[str, list[int]]:
    """``input_ids`` of the whole conversation and ``labels`` that keep only the judge's assistant turns."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans: list[tuple[int, int]] = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (full.startswith(head) and full.startswith(upto) and len(upto) > len(head)):
            raise ValueError("the chat template does not render conversations incrementally (a turn's rendering is "
                             "not a prefix of the whole conversation); labels cannot be located")
        end = len(upto.rstrip())
        if not full[len(head):end].startswith(msg["content"].rstrip()):
            raise ValueError("the chat template changes the assistant turn's text; labels cannot be located")
        spans.append((len(head), end))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    labels = [IGNORE_INDEX] * len(ids)
    for t, (start, _stop) in enumerate(enc["offset_mapping"]):
        if any(a <= start < b for a, b in spans):
            labels[t] = ids[t]
    return {"input_ids": ids, "labels": labels}


def has_false_step(labels: dict[str, Any]) -> bool:
    """True when any step label of a row is False (missing steps do not count)."""
    return any(labels.get(f"step{i}") is False for i in (1, 2, 3))


def oversample_false(ds: Dataset, factor: float, seed: int) -> Dataset:
    """Repeat rows with a False step label ``factor`` times in all (a fraction adds a seeded random extra copy)."""
    if factor <= 1.0:
        return ds
    rng = random.Random(seed)
    whole, frac = int(factor), factor - int(factor)
    index: list[int] = []
    for i, row_labels in enumerate(ds["labels"]):
        copies = 1
        if has_false_step(row_labels):
            copies = whole + (1 if rng.random() < frac else 0)
        index.extend([i] * copies)
    rng.shuffle(index)
    return ds.select(index)


def build_train_dataset(ds: Dataset, tokenizer: Any, *, max_rows: int | None = None, false_factor: float = 1.0,
                        seed: int = 0) -> Dataset:
    """Tokenised training rows (``input_ids``, ``labels``) ready for TRL's SFTTrainer (which keeps given labels)."""
    if max_rows is not None and len(ds) > max_rows:
        ds = ds.shuffle(seed=seed).select(range(max_rows))
    ds = oversample_false(ds, false_factor, seed)

    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        return judge_turn_labels(tokenizer, row["messages"])

    out = ds.map(encode, remove_columns=ds.column_names, desc="tokenising judge conversations")
    log.info("judge SFT rows: %d (after oversampling False x%.2f)", len(out), false_factor)
    return out


__all__ = ["HELDOUT_SPLIT", "IGNORE_INDEX", "REQUIRED_COLUMNS", "TRAIN_SPLIT", "build_train_dataset",
           "check_template", "has_false_step", "judge_turn_labels", "load_judge_set", "oversample_false",
           "resolve_variant_dir"]
