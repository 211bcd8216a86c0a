"""The warm-up with and without the marked rows, paired per valid prompt (same 585 prompts, seed, settings).

Run from the repository root: ``PYTHONPATH=. python docs/evaluations/compeer-loop/warmup-probe-2026-11-28-drop-marked/paired.py``
(extracts both probes' answers to a temporary folder; prints and writes paired.json here)."""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path

from compeer_loop.replies import is_degenerate
from compeer_loop.stats import add_item_figures, paired_difference, per_prompt

HERE = Path(__file__).parent
RUNS = {"kept": HERE.parent / "warmup-probe-2026-11-28" / "probe.tar.xz", "dropped": HERE / "probe.tar.xz"}


def answers(archive: Path, tmp: Path) -> list[dict]:
    with tarfile.open(archive) as tar:
        tar.extract("eval/a/answers.jsonl", tmp, filter="data")
    with (tmp / "eval/a/answers.jsonl").open() as fh:
        return [add_item_figures(json.loads(line)) for line in fh]


def main() -> None:
    runs = {}
    for name, archive in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            runs[name] = answers(archive, Path(tmp))
    scores = {
        "strategy_correct": lambda rs: per_prompt(rs, "strategy_correct", 0),
        "degenerate": lambda rs: {r["id"]: 100.0 * is_degenerate(r["reply_mark"]) for r in rs},
        "format_ok": lambda rs: {r["id"]: 100.0 * bool(r["format_ok"]) for r in rs},
    }
    out = {key: paired_difference(fn(runs["dropped"]), fn(runs["kept"])) for key, fn in scores.items()}
    (HERE / "paired.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
