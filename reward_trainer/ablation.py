"""The paper's D / R / P ablation as one command: the same base training items plus an equal number of (D)
duplicates of base items, (R) plain rewrites, (P) persona rewrites; each set trains a judge with the same
configuration and seed, and all three are evaluated on the same held-out split of base dialogues.

The sets are built by data_builder (:func:`data_builder.emit.make_ablation_sets`) from ``judge_item`` records:
the silver / annotated items of the original dialogues, and the items made from ``persona --mode rewrite`` and
``persona`` dialogues (``source`` ``rewrite`` / ``persona``), from the same files or separate ones.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from reward_trainer.config import config_from_mapping

log = logging.getLogger(__name__)

SETS: dict[str, str] = {"D": "duplicate", "R": "rewrite", "P": "persona"}
AUGMENTED_SOURCES = frozenset(SETS.values())


def read_pools(items: list[str], rewrite: list[str], persona: list[str]) -> tuple[list[Any], list[Any], list[Any]]:
    """(base, rewrites, personas) judge items: ``items`` split by ``source``, plus the extra files' items."""
    from data_builder.records import JUDGE_ITEM, read_records

    records = read_records([Path(p) for p in items], (JUDGE_ITEM,))
    base = [r for r in records if str(r.get("source", "silver")) not in AUGMENTED_SOURCES]
    rewrites = [r for r in records if r.get("source") == "rewrite"]
    personas = [r for r in records if r.get("source") == "persona"]
    rewrites += read_records([Path(p) for p in rewrite], (JUDGE_ITEM,))
    personas += read_records([Path(p) for p in persona], (JUDGE_ITEM,))
    if not base:
        raise ValueError("ablation: no base judge items (records with a source other than rewrite/persona/duplicate)")
    return base, rewrites, personas


def run_ablation(mapping: dict[str, Any], out_dir: Path, items: list[str], rewrite: list[str], persona: list[str],
                 extra: int | None, eval_options: Any) -> dict[str, Any]:
    """Build D / R / P, train one judge per set, evaluate all three on the shared held-out split; write
    ``ablation.json`` and ``ablation.md`` under ``out_dir``."""
    from data_builder.emit import make_ablation_sets
    from reward_trainer.evaluate import run_evaluation
    from reward_trainer.sft import train

    cfg0 = config_from_mapping(mapping)
    variant = cfg0.variant
    base, rewrites, personas = read_pools(items, rewrite, persona)
    sets = make_ablation_sets(base, rewrites, personas, n_extra=extra, modes=(variant,), seed=cfg0.seed)
    results: dict[str, Any] = {"variant": variant, "sets": {}}
    for name, by_mode in sets.items():
        dsd = by_mode[variant]
        data_root = out_dir / "sets" / name
        dsd.save_to_disk(str(data_root / variant))
        cfg = config_from_mapping({**mapping, "data_dir": str(data_root), "output_dir": str(out_dir / name / "adapter")})
        trained = train(cfg)
        eval_options.data_dir = data_root
        eval_options.out_dir = out_dir / name / "eval"
        eval_options.adapters = {variant: str(trained.adapter_dir)}
        eval_options.include_base = name == "D"  # the base judge once: the held-out split is the same for all
        metrics = run_evaluation(eval_options)
        results["sets"][name] = {"source": SETS[name], "train_rows": len(dsd["train"]),
                                 "heldout_items": len(dsd["heldout"]), "steps": trained.steps,
                                 "train_loss": trained.train_loss, "metrics": metrics[variant]}
    sizes = {r["train_rows"] for r in results["sets"].values()}
    if len(sizes) != 1:
        raise ValueError(f"ablation sets differ in size: {sorted(sizes)}")
    (out_dir / "ablation.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (out_dir / "ablation.md").write_text(render(results), encoding="utf-8")
    return results


def render(results: dict[str, Any]) -> str:
    """Markdown table of the three trained judges (and the base/majority rows of the first)."""
    from reward_trainer.report import COLUMNS, table_row

    lines = ["# D / R / P ablation", "",
             (f"Variant {results['variant']}; equal-size training sets (base items + the same number of "
             "duplicates / plain rewrites / persona rewrites), one shared held-out split of base dialogues."), "",
             "| Set | Judge | n | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 3)]
    for name, r in results["sets"].items():
        lines.append(table_row(f"{name} ({r['source']}, {r['train_rows']} rows)", r["metrics"]["judge"], r["metrics"]))
        for judge, base in r["metrics"].get("baselines", {}).items():
            lines.append(table_row(name, judge, base))
    return "\n".join(lines) + "\n"


__all__ = ["SETS", "read_pools", "render", "run_ablation"]
