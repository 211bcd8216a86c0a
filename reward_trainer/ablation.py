"""The paper's D / R / P ablation: the original training conversations plus an equal number of (D) duplicates of
originals, (R) plain rewrites, (P) persona rewrites; each set trains a judge with the same configuration and seed,
and all are evaluated on the same held-out split of original dialogues.

Where the rewrites come from: either separate judge SFT sets (``--rewrite DIR``, ``--persona DIR``, emitted by
data_builder from the rewritten dialogues), or the main set itself, whose rows derived from rewritten dialogues
carry ids ``<id>#rewrite`` / ``<id>#persona`` (data_builder's convention, :func:`data_builder.records.base_dialogue_id`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_trainer.config import config_from_mapping
from reward_trainer.data import HELDOUT_SPLIT, TRAIN_SPLIT, load_judge_set

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)

ORIGINAL, REWRITE, PERSONA = "original", "rewrite", "persona"
#: Set name → where its extra rows come from.
SETS: dict[str, str] = {"D": ORIGINAL, "R": REWRITE, "P": PERSONA}


def origin_of(dialogue_id: str) -> str:
    """``original``, or the rewrite kind after ``#`` in a derived dialogue id."""
    from data_builder.records import base_dialogue_id

    base = base_dialogue_id(dialogue_id)
    return dialogue_id[len(base) + 1:] if len(dialogue_id) > len(base) else ORIGINAL


def split_by_origin(ds: Dataset) -> dict[str, Dataset]:
    """Rows of ``ds`` grouped by :func:`origin_of` their dialogue id."""
    origins = [origin_of(d) for d in ds["dialogue_id"]]
    return {o: ds.select([i for i, x in enumerate(origins) if x == o]) for o in sorted(set(origins))}


@dataclass(frozen=True)
class AblationSets:
    """The three training sets (equal size) and the shared held-out split."""

    train: dict[str, Dataset]
    heldout: Dataset
    extra: int


def build_sets(original: Dataset, rewrite: Dataset, persona: Dataset, heldout: Dataset, seed: int,
               extra: int | None = None) -> AblationSets:
    """D / R / P = the originals + ``extra`` rows of duplicates / rewrites / persona rewrites (seeded sample)."""
    from datasets import concatenate_datasets

    limit = min(len(original), len(rewrite), len(persona))
    n = limit if extra is None else extra
    if n < 1 or n > limit:
        raise ValueError(f"ablation: {n} extra rows asked, but only {limit} are available in each source "
                         f"(originals {len(original)}, rewrites {len(rewrite)}, persona {len(persona)}); "
                         "emit more rewrites or lower --extra")
    sources = {"D": original, "R": rewrite, "P": persona}
    train = {}
    for name, src in sources.items():
        sample = src.shuffle(seed=seed).select(range(n))
        train[name] = concatenate_datasets([original, sample]).shuffle(seed=seed)
    return AblationSets(train, heldout, n)


def prepare(mapping: dict[str, Any], rewrite_dir: str | None, persona_dir: str | None,
            extra: int | None) -> AblationSets:
    """Load the sources named by the training config ``mapping`` and build the sets."""
    cfg = config_from_mapping(mapping)
    main = load_judge_set(cfg.data_dir, cfg.variant)
    by_origin = split_by_origin(main[TRAIN_SPLIT])
    original = by_origin.get(ORIGINAL)
    if original is None or len(original) == 0:
        raise ValueError(f"{cfg.data_dir}: no training rows of original dialogues")

    def source(kind: str, folder: str | None) -> Dataset:
        if folder:
            return load_judge_set(folder, cfg.variant)[TRAIN_SPLIT]
        if kind not in by_origin:
            raise ValueError(f"{cfg.data_dir}: no '#{kind}' rows in the train split; pass --{kind} DIR (a judge SFT "
                             f"set emitted from the {kind} dialogues)")
        return by_origin[kind]

    heldout = split_by_origin(main[HELDOUT_SPLIT]).get(ORIGINAL, main[HELDOUT_SPLIT])
    return build_sets(original, source(REWRITE, rewrite_dir), source(PERSONA, persona_dir), heldout, cfg.seed, extra)


def run_ablation(mapping: dict[str, Any], out_dir: Path, rewrite_dir: str | None, persona_dir: str | None,
                 extra: int | None, eval_options: Any) -> dict[str, Any]:
    """Train one judge per set and evaluate all three on the shared held-out split; write ablation.{json,md}."""
    from datasets import DatasetDict

    from reward_trainer.evaluate import run_evaluation
    from reward_trainer.sft import train

    sets = prepare(mapping, rewrite_dir, persona_dir, extra)
    variant = config_from_mapping(mapping).variant
    results: dict[str, Any] = {"extra_rows": sets.extra, "heldout_items": len(sets.heldout), "sets": {}}
    for name, ds in sets.train.items():
        data_root = out_dir / "sets" / name
        DatasetDict({TRAIN_SPLIT: ds, HELDOUT_SPLIT: sets.heldout}).save_to_disk(str(data_root / variant))
        cfg = config_from_mapping({**mapping, "data_dir": str(data_root), "output_dir": str(out_dir / name / "adapter")})
        trained = train(cfg)
        eval_options.data_dir = data_root
        eval_options.out_dir = out_dir / name / "eval"
        eval_options.adapters = {variant: str(trained.adapter_dir)}
        eval_options.include_base = name == "D"  # the base judge once: the held-out split is the same for all
        metrics = run_evaluation(eval_options)
        results["sets"][name] = {"source": SETS[name], "train_rows": len(ds), "steps": trained.steps,
                                 "train_loss": trained.train_loss, "metrics": metrics[variant]}
    (out_dir / "ablation.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (out_dir / "ablation.md").write_text(render(results, variant), encoding="utf-8")
    return results


def render(results: dict[str, Any], variant: str) -> str:
    """Markdown table of the three trained judges (and the base/majority rows of the first)."""
    from reward_trainer.report import COLUMNS, table_row

    lines = ["# D / R / P ablation", "",
             f"Originals + {results['extra_rows']} extra rows each; held-out: {results['heldout_items']} items "
             f"of original dialogues; variant {variant}.", "",
             "| Set | Judge | n | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 3)]
    for name, r in results["sets"].items():
        lines.append(table_row(f"{name} ({r['source']}, {r['train_rows']} rows)", r["metrics"]["judge"], r["metrics"]))
        for judge, base in r["metrics"].get("baselines", {}).items():
            lines.append(table_row(name, judge, base))
    return "\n".join(lines) + "\n"


__all__ = ["AblationSets", "SETS", "build_sets", "origin_of", "prepare", "render", "run_ablation", "split_by_origin"]
