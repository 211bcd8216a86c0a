"""``compeer-data <stage> [options] --out DIR INPUT...``: one command per stage of the CER dataset pipeline.

Stages: ingest, filter, sample, generate, silver, annotate (export | import), persona, emit, contrast,
policy-negatives; plus
``summary DIR...``, which prints the counts of several stage folders as one table, and ``cues ITEMS...``, which
measures whether a surface cue of the candidate (a question, a short reply) tells the label of judge items.
Exit status: 0 on success, 2 on a usage or input error (the message says which file and line) or when the engine
cannot start.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_builder import (
    annotate,
    contrast,
    cues,
    emit,
    generate,
    ingest,
    llm_filter,
    persona,
    policy_negatives,
    sample,
    silver,
)
from data_builder.stage import MANIFEST, StageError, read_manifest, summary_table
from judge.engines.base import EngineError

STAGES = (ingest, llm_filter, sample, generate, silver, annotate, persona, emit, contrast, policy_negatives)


def _summary(args: argparse.Namespace, **_: Any) -> int:
    manifests = []
    for d in args.dirs:
        if not (Path(d) / MANIFEST).exists():
            raise StageError(f"{d}: no {MANIFEST} (not a stage output folder)")
        manifests.append(read_manifest(d))
    print(summary_table(manifests))
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The argparse parser of every stage (``run`` default holds the stage's entry function)."""
    parser = argparse.ArgumentParser(prog="compeer-data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v INFO, -vv DEBUG logging")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for mod in STAGES:
        mod.add_parser(sub)
    s = sub.add_parser("summary", help="print the counts of stage output folders as one table")
    s.add_argument("dirs", nargs="+", help="stage output folders (with manifest.json)")
    s.set_defaults(run=_summary)
    cues.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, llm_factory: Callable[..., Any] | None = None) -> int:
    """Run one stage; ``llm_factory`` (tests) replaces how LLM stages build their :class:`~data_builder.llm.LLM`."""
    parser = make_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args, argv=argv, llm_factory=llm_factory))
    except (StageError, ValueError, FileNotFoundError, EngineError) as exc:
        print(f"compeer-data {args.stage}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
