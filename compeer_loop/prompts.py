"""Prompt sets from real conversations, built with the dataset pipeline's own stages.

``build_prompt_sets(train_json, valid_json, out)`` writes, from the ESConv splits (which are split by dialogue):

- ``grpo_train.jsonl``: GRPO prompts of the train dialogues (``data_builder`` ingest -> Eq.1 round sampling ->
  :func:`data_builder.emit.build_grpo_prompts`): ``dialogue_id``, ``history`` (ends with a seeker turn),
  ``reference`` (the real supporter turn), ``prompt`` (the policy's chat messages);
- ``warmup.jsonl``: SFT warm-up rows of the same train rounds, ``history`` and ``target``: a CER output whose three
  steps state the round's gold facts (problem and situation, annotated emotion, annotated strategy; the silver
  stage's :func:`data_builder.silver.true_facts` and phrasings) and whose response is the real supporter turn;
- ``eval.jsonl``: ``eval_rounds`` sampled rounds per valid dialogue (default 3: 585 supporter turns of ESConv valid's
  195 dialogues, rather than one a dialogue; ``id``, ``dialogue_id``, ``history``, ``reference``,
  ``strategy``: the annotated strategy of the real turn, normalised to the taxonomy);
- ``cards.json``: ESC-Eval role cards of the valid dialogues (:func:`evaluator.inputs.cards_from_esconv`, file
  order), for the ESC-Eval-style evaluation of every policy;
- ``manifest.json``: the inputs' sha256, the parameters and the counts.

No dialogue of the valid file enters a training set (checked: the dialogue ids are disjoint, else ValueError).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from cer.reasoning import render
from cer.taxonomy import load_taxonomy
from data_builder.emit import build_grpo_prompts
from data_builder.ingest import ingest_files
from data_builder.records import Record, base_dialogue_id
from data_builder.sample import sample_dialogues
from data_builder.silver import true_facts
from data_builder.silver_text import load_config, render_steps
from evaluator.inputs import cards_from_esconv

TRAIN_FILE, WARMUP_FILE, EVAL_FILE, MANIFEST_FILE = "grpo_train.jsonl", "warmup.jsonl", "eval.jsonl", "manifest.json"
CARDS_FILE = "cards.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file written here."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _rounds(path: Path, per_dialogue: int, seed: int) -> tuple[list[Record], int]:
    dialogues, report = ingest_files([path], "esconv")
    if report.malformed:
        raise ValueError(f"{path}: {report.malformed} malformed dialogues (first: {report.errors[:1]})")
    rounds, _ = sample_dialogues(dialogues, per_dialogue, seed)
    return rounds, len(dialogues)


def warmup_rows(rounds: list[Record], seed: int) -> list[dict[str, Any]]:
    """CER targets stating each round's gold facts, with the real supporter turn as the response (rounds without
    gold facts are left out)."""
    taxonomy, cfg = load_taxonomy(), load_config()
    rng = random.Random(seed)
    rows = []
    for r in rounds:
        facts, _, _ = true_facts(r, taxonomy, cfg)
        if facts is None or not r["history"] or r["history"][-1]["role"] != "seeker":
            continue
        steps = render_steps(facts, r.get("lang", "en"), taxonomy, cfg, rng)
        rows.append({"dialogue_id": r["dialogue_id"], "history": r["history"],
                     "target": render({**steps, "response": r["reference"]})})
    return rows


def eval_rows(rounds: list[Record]) -> list[dict[str, Any]]:
    """Evaluation prompts with the annotated strategy of the real turn (None when it maps to no taxonomy name)."""
    taxonomy = load_taxonomy()
    rows = []
    for r in rounds:
        if not r["history"] or r["history"][-1]["role"] != "seeker":
            continue
        raw = r.get("strategy")
        rows.append({"id": f"{r['dialogue_id']}#r{r['round_index']}", "dialogue_id": r["dialogue_id"],
                     "history": r["history"], "reference": r["reference"],
                     "strategy": taxonomy.normalise(raw) if raw else None})
    return rows


def build_prompt_sets(train_json: Path, valid_json: Path, out: Path, *, train_rounds: int = 3, eval_rounds: int = 3,
                      max_eval: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Write the three sets and the manifest to ``out``; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    train_rounds_l, n_train = _rounds(train_json, train_rounds, seed)
    valid_rounds_l, n_valid = _rounds(valid_json, eval_rounds, seed)
    overlap = ({base_dialogue_id(r["dialogue_id"]) for r in train_rounds_l}
               & {base_dialogue_id(r["dialogue_id"]) for r in valid_rounds_l})
    if overlap:
        raise ValueError(f"{len(overlap)} dialogues are in both {train_json} and {valid_json}: split by dialogue")
    grpo = build_grpo_prompts(train_rounds_l, heldout=set())["train"]
    train = [dict(r) for r in grpo]
    warm = warmup_rows(train_rounds_l, seed)
    ev = eval_rows(valid_rounds_l)
    if max_eval is not None and len(ev) > max_eval:
        keep = set(random.Random(seed).sample(range(len(ev)), max_eval))
        ev = [r for i, r in enumerate(ev) if i in keep]
    for name, rows in ((TRAIN_FILE, train), (WARMUP_FILE, warm), (EVAL_FILE, ev)):
        if not rows:
            raise ValueError(f"{name}: no rows (check the inputs)")
        _write_jsonl(out / name, rows)
    cards = [c.to_json() for c in cards_from_esconv(valid_json)]
    (out / CARDS_FILE).write_text(json.dumps(cards, ensure_ascii=False) + "\n", encoding="utf-8")
    manifest = {
        "inputs": {"train": {"path": str(train_json), "sha256": _sha256(train_json), "dialogues": n_train},
                   "valid": {"path": str(valid_json), "sha256": _sha256(valid_json), "dialogues": n_valid}},
        "params": {"train_rounds_per_dialogue": train_rounds, "eval_rounds_per_dialogue": eval_rounds,
                   "max_eval": max_eval, "seed": seed},
        "counts": {"grpo_train": len(train), "warmup": len(warm), "eval": len(ev),
                   "eval_with_strategy": sum(1 for r in ev if r["strategy"]), "cards": len(cards)},
        "files": {name: _sha256(out / name) for name in (TRAIN_FILE, WARMUP_FILE, EVAL_FILE, CARDS_FILE)},
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
