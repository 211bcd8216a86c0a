"""``compeer-train judge | judge-eval | judge-contrast | judge-ablation``: train, evaluate and ablate the judge.

``main(argv)`` takes the command as ``argv[0]`` (``compeer_cli.train`` dispatches here)::

    compeer-train judge --config cpu-smoke|gpu|FILE [--out DIR] [--max-steps N] [--data DIR] [--variant V]
    compeer-train judge-eval --adapter DIR [--adapter VARIANT=DIR ...] --data DIR --out DIR [--backend ...]
    compeer-train judge-contrast --groups GROUPS.jsonl [--adapter [LABEL=]DIR ...] [--no-base] --out DIR
    compeer-train judge-ablation --config FILE --out DIR --items ITEMS.jsonl [--rewrite F --persona F] [--extra N]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from judge.protocol import DEFAULT_TEMPLATE
from reward_trainer import VARIANTS

COMMANDS = ("judge", "judge-eval", "judge-contrast", "judge-ablation")


def _eval_flags() -> argparse.ArgumentParser:
    from judge.factory import EngineChoice
    from judge.settings import add_arguments

    p = argparse.ArgumentParser(add_help=False)
    # --backend, --model, --device, --base-url, --api-key-env, --max-retries: the judge factory's engine choice
    add_arguments(p, EngineChoice, title="judging engine (the judge factory's, as every offline command)")
    g = p.add_argument_group("judging (same Judge as the reward service)")
    g.add_argument("--max-items", type=int, default=None, help="evaluate at most N held-out items per variant")
    g.add_argument("--max-tokens", type=int, default=96, help="judge max tokens per component")
    g.add_argument("--seed", type=int, default=0, help="judge sampling seed (retries sample)")
    g.add_argument("--concurrency", type=int, default=32, help="items judged concurrently")
    g.add_argument("--max-batch", type=int, default=32, help="engine micro-batch size (transformers)")
    g.add_argument("--template", default=DEFAULT_TEMPLATE, help="judge template version")
    g.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML (default: the packaged one)")
    g.add_argument("--no-base", action="store_true", help="skip the untrained base judge rows")
    g.add_argument("--no-audit", action="store_true", help="skip the Fig. 5a inconsistency audit")
    g.add_argument("--auditor-backend", default=None, help="auditing LLM backend (default: --backend)")
    g.add_argument("--auditor-model", default=None, help="auditing LLM model (default: --model)")
    return p


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of the three commands."""
    parser = argparse.ArgumentParser(prog="compeer-train", description="Train and measure the UnifiReward judge.")
    sub = parser.add_subparsers(dest="command", required=True)

    j = sub.add_parser("judge", help="SFT a judge adapter (TRL SFTTrainer + LoRA, judge turns only)")
    from reward_trainer.config import PROFILES

    # --config, --set KEY=VALUE, --help-fields (--help-config: its old name): the one trainer profile loader's flags
    PROFILES.add_flags(j, aliases=("--help-config",))
    j.add_argument("--out", default=None, help="adapter output folder (overrides output_dir)")
    j.add_argument("--max-steps", type=int, default=None, help="optimizer steps (overrides max_steps)")
    j.add_argument("--data", default=None, help="judge_sft folder (overrides data_dir)")
    j.add_argument("--variant", choices=VARIANTS, default=None, help=f"{' | '.join(VARIANTS)} (overrides variant)")

    e = sub.add_parser("judge-eval", parents=[_eval_flags()], help="Table 1 metrics on the held-out split")
    e.add_argument("--adapter", action="append", default=[],
                   help="trained adapter folder, or VARIANT=DIR; repeat for several variants")
    e.add_argument("--variants", default="", help="comma list of extra variants to evaluate with base/majority rows")
    e.add_argument("--data", required=True, help="judge_sft folder (parent of unified/ prm/ orm/)")
    e.add_argument("--out", required=True, help="report folder (report.md, metrics.json, PNGs)")

    c = sub.add_parser("judge-contrast", parents=[_eval_flags()],
                       help="reward AUC: a real turn vs each kind of negative (compeer-data contrast groups)")
    c.add_argument("--groups", required=True, help="contrast groups.jsonl (compeer-data contrast)")
    c.add_argument("--adapter", action="append", default=[],
                   help="a trained judge's adapter folder (LABEL=DIR to name it; repeatable)")
    c.add_argument("--out", required=True, help="report folder (contrast.json, contrast.md)")

    a = sub.add_parser("judge-ablation", parents=[_eval_flags()], help="D / R / P training-set ablation")
    PROFILES.add_flags(a, required=True)  # the profile of the three runs
    a.add_argument("--out", required=True, help="ablation folder")
    a.add_argument("--items", nargs="+", required=True,
                   help="judge_item JSONL files (data_builder silver/annotate); rewrite/persona sources are pools")
    a.add_argument("--rewrite", nargs="*", default=[], help="more judge_item files made from plain rewrites")
    a.add_argument("--persona", nargs="*", default=[], help="more judge_item files made from persona rewrites")
    a.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run (overrides max_steps)")
    a.add_argument("--extra", type=int, default=None, help="extra items per set (default: the most all pools allow)")
    return parser


def parse_adapters(values: list[str]) -> dict[str, str]:
    """``DIR`` (variant from its compeer_judge.json) or ``VARIANT=DIR`` → {variant: DIR}."""
    from reward_trainer.sft import read_adapter_stamp

    out: dict[str, str] = {}
    for value in values:
        variant, sep, folder = value.partition("=")
        if not sep or variant not in VARIANTS:
            folder, variant = value, str(read_adapter_stamp(value).get("variant", ""))
        if not (Path(folder) / "adapter_config.json").is_file():
            raise ValueError(f"--adapter {value!r}: {folder} is not a PEFT adapter folder (no adapter_config.json)")
        if variant not in VARIANTS:
            raise ValueError(f"--adapter {value!r}: its variant is unknown (no compeer_judge.json); pass VARIANT=DIR")
        if variant in out:
            raise ValueError(f"--adapter: two adapters for variant {variant!r}")
        out[variant] = folder
    return out


def eval_options(args: argparse.Namespace, data: str, out: str) -> Any:
    """EvalOptions from the shared judging flags."""
    from judge.factory import EngineChoice
    from judge.protocol import JudgeSettings
    from judge.settings import from_namespace
    from reward_trainer.evaluate import EvalOptions
    from reward_trainer.predict import JudgeRuntime

    choice: EngineChoice = from_namespace(EngineChoice, args)
    settings = JudgeSettings(max_tokens_per_component=args.max_tokens, max_retries=choice.max_retries, seed=args.seed)
    runtime = JudgeRuntime(engine=choice, max_batch=args.max_batch, template=args.template, taxonomy=args.taxonomy,
                           settings=settings, concurrency=args.concurrency)
    return EvalOptions(data_dir=Path(data), out_dir=Path(out), runtime=runtime, max_items=args.max_items,
                       include_base=not args.no_base, audit=not args.no_audit, auditor_backend=args.auditor_backend,
                       auditor_model=args.auditor_model)


def _train(args: argparse.Namespace) -> int:
    from reward_trainer.config import PROFILES, load_config
    from reward_trainer.sft import train

    if args.help_fields:
        print(PROFILES.describe())
        return 0
    if not args.config:
        print("compeer-train judge: --config is required (a profile: cpu-smoke, gpu; or a YAML file)", file=sys.stderr)
        return 2
    cfg = load_config(args.config, PROFILES.overrides(args.overrides, {
        "output_dir": args.out, "max_steps": args.max_steps, "data_dir": args.data, "variant": args.variant}))
    result = train(cfg)
    print(json.dumps({"adapter": str(result.adapter_dir), "variant": result.variant, "steps": result.steps,
                      "train_rows": result.train_rows, "train_loss": result.train_loss,
                      "seconds": round(result.seconds, 1)}))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from reward_trainer.evaluate import run_evaluation

    options = eval_options(args, args.data, args.out)
    options.adapters = parse_adapters(args.adapter)
    options.variants = tuple(v for v in args.variants.split(",") if v)
    metrics = run_evaluation(options)
    summary = {v: {k: metrics[v][k] for k in ("judge", "step_false_recall", "response_accuracy", "parse_failure_rate")}
               for v in VARIANTS if v in metrics}
    print(json.dumps({"out": args.out, "summary": summary}))
    return 0


def _contrast(args: argparse.Namespace) -> int:
    import asyncio

    from reward_trainer.contrast import ContrastOptions, run_contrast

    judges: dict[str, str | None] = {} if args.no_base else {"base": None}
    for value in args.adapter:
        label, sep, folder = value.partition("=")
        label, folder = (label, folder) if sep else ("trained" if "trained" not in judges else folder, value)
        if not (Path(folder) / "adapter_config.json").is_file():
            raise ValueError(f"--adapter {value!r}: {folder} is not a PEFT adapter folder (no adapter_config.json)")
        judges[label] = folder
    runtime = eval_options(args, args.out, args.out).runtime
    metrics = asyncio.run(run_contrast(ContrastOptions(Path(args.groups), Path(args.out), judges, runtime,
                                                       args.max_items)))
    # judge -> reference -> reward kind (discrete, graded) -> kind of negative -> AUC
    summary = {j: {ref: {rk: {k: s[k]["auc"] for k in s["kinds"]} for rk, s in by_kind.items()}
                   for ref, by_kind in by.items()} for j, by in metrics["judges"].items()}
    print(json.dumps({"out": args.out, "auc": summary}))
    return 0


def _ablate(args: argparse.Namespace) -> int:
    from reward_trainer.ablation import run_ablation
    from reward_trainer.config import PROFILES

    mapping = {**PROFILES.read(args.config), **PROFILES.overrides(args.overrides, {"max_steps": args.max_steps})}
    options = eval_options(args, args.out, args.out)
    options.audit = False
    results = run_ablation(mapping, Path(args.out), args.items, args.rewrite, args.persona, args.extra, options)
    print(json.dumps({"out": args.out, "sets": {k: {"train_rows": v["train_rows"],
                                                    "step_false_recall": v["metrics"]["step_false_recall"]}
                                                for k, v in results["sets"].items()}}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``argv[0]`` (judge | judge-eval | judge-ablation) with the remaining arguments."""
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"judge": _train, "judge-eval": _evaluate, "judge-contrast": _contrast, "judge-ablation": _ablate}
    from judge.profiles import ConfigError

    try:
        return handlers[args.command](args)
    except ConfigError as exc:  # the trainers' one message for a profile or override mistake
        print(f"compeer-train {args.command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"compeer-train {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
