"""``compeer-eval``: multi-turn and reference-based evaluation of any chat model.

    compeer-eval esc   --out runs/esc   [--cards cards.json] [--model M] [--simulator S] [--scorer J] ...
    compeer-eval sage  --out runs/sage  [--profiles profiles.jsonl] [--max-rounds 10] ...
    compeer-eval gold  --out runs/gold  --esconv valid.json [--limit 200] [--model-format cer]
    compeer-eval cards --esconv valid.json --out cards.json [--limit 50]
    compeer-eval report RUN [RUN ...] --out DIR
    compeer-eval pairwise-export RUN_A RUN_B --out DIR
    compeer-eval pairwise-import --pairs DIR --votes votes.csv|export.json --out DIR

A run folder is resumable: the same command again continues where a killed run stopped (see ``evaluator.runs``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator import esc_eval, gold, sage
from evaluator.backends import ROLES, Roles, add_role_options, build_roles, spec_from_args
from evaluator.inputs import InputError, cards_from_esconv, gold_turns, load_cards, load_profiles
from evaluator.pairwise import VoteError, export_pairs, import_votes
from evaluator.prompts import load_prompts
from evaluator.report import write_report
from evaluator.runs import RunDir, RunError, run_items
from judge.settings import add_arguments, from_namespace, setting

log = logging.getLogger("evaluator")
ROLE_DEFAULTS = {"model": {"max_tokens": 256}, "simulator": {"max_tokens": 128}, "scorer": {"max_tokens": 96}}


def _digest(path: Path | None) -> str:
    return "packaged" if path is None else hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@dataclass
class RunFlags:
    """The flags every harness run (esc, sage, gold) shares, besides its harness config and its roles' engines."""

    limit: int | None = setting(None, help="evaluate only the first N inputs (gold: N held-out turns picked at random "
                                           "with --seed); None: all")
    concurrency: int = setting(4, help="dialogues in flight (engines batch their requests)")
    prompts: Path | None = setting(None, help="prompts/rubrics YAML; None: the packaged one")
    seed: int = setting(0, help="seed of every generation (retries use seed + attempt)")


@dataclass
class SampleFlags:
    """``compeer-eval cards``: how many ESConv dialogues, picked how."""

    limit: int | None = setting(None, help="that many dialogues, picked at random (--seed); None: all")
    seed: int = setting(0, help="seed of the pick")


@dataclass
class ExportFlags:
    """``compeer-eval pairwise-export``."""

    seed: int = setting(0, help="seed of the left/right order")


@dataclass
class ImportFlags:
    """``compeer-eval pairwise-import``."""

    bootstrap: int = setting(2000, help="bootstrap resamples")


#: each harness: its config (its own flags and --model-format, with the harness's default), the roles it uses and
#: its --limit default
HARNESSES: dict[str, tuple[type, tuple[str, ...], int | None]] = {
    "esc": (esc_eval.EscConfig, ROLES, None), "sage": (sage.SageConfig, ("model", "simulator"), None),
    "gold": (gold.GoldConfig, ("model",), 200)}


def _run_options(p: argparse.ArgumentParser, harness: str) -> None:
    config, roles, limit = HARNESSES[harness]
    # hand-written: --out is required (settings have no required flags); --overwrite discards a run, so it is said on
    # the command line only (no COMPEER_OVERWRITE)
    p.add_argument("--out", type=Path, required=True, help="run folder (created; the same folder again resumes)")
    p.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    add_arguments(p, config, title=f"{harness} harness")
    add_arguments(p, RunFlags, title="run", defaults={"limit": limit})
    for role in roles:
        add_role_options(p, role, **ROLE_DEFAULTS[role])


def make_parser() -> argparse.ArgumentParser:
    """The ``compeer-eval`` argument parser (positional and required flags hand-written: settings have neither)."""
    parser = argparse.ArgumentParser(prog="compeer-eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG (dialogue text included)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("esc", help="ESC-Eval-style: role cards, simulated seeker, 7 dimensions scored 0-4")
    p.add_argument("--cards", type=Path, default=None, help="ESC-Eval role cards JSON (default: the packaged cards)")
    _run_options(p, "esc")
    p = sub.add_parser("sage", help="SAGE-style: hidden intention, emotion score, success/failure")
    p.add_argument("--profiles", type=Path, default=None, help="SAGE profiles JSONL (default: the packaged ones)")
    _run_options(p, "sage")
    p = sub.add_parser("gold", help="ESConv held-out turns: BLEU-2, ROUGE-L, strategy accuracy, distinct-n")
    p.add_argument("--esconv", type=Path, required=True, help="ESConv JSON (e.g. shared/data/esconv/valid.json)")
    _run_options(p, "gold")
    p = sub.add_parser("cards", help="build ESC-Eval role cards from ESConv dialogues")
    p.add_argument("--esconv", type=Path, required=True, help="ESConv JSON")
    p.add_argument("--out", type=Path, required=True, help="cards JSON to write")
    add_arguments(p, SampleFlags, title="sample")
    p = sub.add_parser("report", help="markdown report and plots over one or more run folders")
    p.add_argument("runs", nargs="+", type=Path, help="run folders")
    p.add_argument("--out", type=Path, required=True, help="report folder")
    p = sub.add_parser("pairwise-export", help="model-vs-model pairs for human annotators (CSV, Label Studio)")
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--out", type=Path, required=True)
    add_arguments(p, ExportFlags, title="pairs")
    p = sub.add_parser("pairwise-import", help="win/tie/loss rates with bootstrap intervals from annotator votes")
    p.add_argument("--pairs", type=Path, required=True, help="the folder pairwise-export wrote")
    p.add_argument("--votes", type=Path, required=True, help="votes CSV or Label Studio JSON export")
    p.add_argument("--out", type=Path, required=True)
    add_arguments(p, ImportFlags, title="rates")
    return parser


def _roles(args: argparse.Namespace, run: RunDir, used: tuple[str, ...]) -> Roles:
    specs = {r: spec_from_args(args, r if r in used else "model") for r in ROLES}
    return build_roles(specs, run.cache_dir, args.seed)


def _config(args: argparse.Namespace, harness_cfg: dict[str, Any], inputs: Path | None, used: tuple[str, ...]
            ) -> dict[str, Any]:
    from evaluator.backends import resolve_spec

    roles = {}
    for r in used:
        spec = spec_from_args(args, r)
        roles[r] = {"identity": resolve_spec(spec).identity, "backend": spec.backend, "base_url": spec.base_url,
                    "max_tokens": spec.max_tokens, "temperature": spec.temperature}
    return {"harness": harness_cfg, "roles": roles, "inputs": {"path": str(inputs) if inputs else None,
                                                               "sha256": _digest(inputs), "limit": args.limit},
            "prompts": str(args.prompts) if args.prompts else None, "seed": args.seed}


async def _execute(run: RunDir, roles: Roles, items: list[tuple[str, Any]],
                   fn: Callable[[Any], Awaitable[dict[str, Any]]], concurrency: int, desc: str) -> None:
    try:
        await run_items(run, items, fn, concurrency, desc)
    finally:
        await roles.aclose()


def _harness(args: argparse.Namespace) -> int:
    prompts = load_prompts(str(args.prompts) if args.prompts else None)
    config_cls, used, _ = HARNESSES[args.command]
    cfg = from_namespace(config_cls, args)
    source: Path | None
    items: list[tuple[str, Any]]
    if isinstance(cfg, esc_eval.EscConfig):
        source, items = args.cards, [(c.id, c) for c in load_cards(args.cards)[:args.limit]]
    elif isinstance(cfg, sage.SageConfig):
        source, items = args.profiles, [(p.id, p) for p in load_profiles(args.profiles)[:args.limit]]
    else:
        source, items = args.esconv, [(g.id, g) for g in gold_turns(args.esconv, args.limit, args.seed)]
    harness_cfg = cfg.as_dict()
    run = RunDir.open(args.out, args.command, _config(args, harness_cfg, source, used), args.overwrite)
    roles = _roles(args, run, used)
    fn: Callable[[Any], Awaitable[dict[str, Any]]]
    if isinstance(cfg, esc_eval.EscConfig):
        fn = lambda c: esc_eval.run_card(c, roles, prompts, cfg)
    elif isinstance(cfg, sage.SageConfig):
        fn = lambda p: sage.run_profile(p, roles, prompts, cfg)
    else:
        fn = lambda g: gold.run_turn(g, roles, prompts, cfg)
    asyncio.run(_execute(run, roles, items, fn, args.concurrency, args.command))
    report = write_report([run.path], run.path)
    summary = json.loads((run.path / "results.json").read_text(encoding="utf-8"))["summary"]
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    print(f"report: {report}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``compeer-eval``; returns the exit code (2 for bad input, with a message naming it)."""
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command in ("esc", "sage", "gold"):
            if args.limit is not None and args.limit < 1:
                raise InputError(f"--limit {args.limit}: must be >= 1")
            return _harness(args)
        if args.command == "cards":
            cards = cards_from_esconv(args.esconv, args.limit, args.seed)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps([c.to_json() for c in cards], indent=2, ensure_ascii=False) + "\n",
                                encoding="utf-8")
            print(f"{len(cards)} cards -> {args.out}")
            return 0
        if args.command == "report":
            print(f"report: {write_report(args.runs, args.out)}")
            return 0
        if args.command == "pairwise-export":
            key = export_pairs(args.run_a, args.run_b, args.out, args.seed)
            print(f"{len(key['pairs'])} pairs -> {args.out}")
            return 0
        result = import_votes(args.pairs, args.votes, args.out, args.bootstrap)
        print(json.dumps(result, indent=2))
        return 0
    except (InputError, RunError, VoteError, ValueError, FileNotFoundError) as exc:
        print(f"compeer-eval {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
