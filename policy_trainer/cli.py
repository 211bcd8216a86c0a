"""``compeer-train grpo``: COMPEER GRPO training against a running reward service.

    compeer-train grpo --config cpu-smoke --out runs/smoke [--max-steps N] [--reward-server HOST:PORT ...]
                       [--policy-model PATH] [--prompt-set PATH] [--set KEY=VALUE ...] [--resume]

``--config`` is a YAML profile (a path, or the name of a shipped one: cpu-smoke, gpu-paper). Outputs in OUT:
``checkpoint-N/`` (LoRA adapters + trainer state, for --resume), ``final/`` (the trained adapter),
``metrics.jsonl`` (one line per step), ``plots/*.png`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("policy_trainer")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compeer-train grpo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    from policy_trainer.config import PROFILES

    PROFILES.add_flags(p)  # --config, --set KEY=VALUE, --help-fields: the one trainer profile loader's flags
    p.add_argument("--out", type=Path, help="output folder (checkpoints, final adapter, metrics, plots)")
    p.add_argument("--max-steps", type=int, help="number of GRPO optimizer steps (overrides the profile)")
    p.add_argument("--reward-server", nargs="+", metavar="ADDR", help="reward service gRPC address(es) host:port")
    p.add_argument("--reward-token-file", help="file holding the reward service's bearer token (default: env "
                                               "COMPEER_REWARD_TOKEN when set)")
    p.add_argument("--reward-tls-ca", help="PEM CA of the reward service's certificate (turns TLS on)")
    p.add_argument("--reward-tls-cert", help="PEM client certificate (mutual TLS); needs --reward-tls-key")
    p.add_argument("--reward-tls-key", help="PEM private key of --reward-tls-cert")
    p.add_argument("--policy-model", help="policy: `default` or a local HF folder (required by gpu-paper)")
    p.add_argument("--prompt-set", help="`smoke`, a datasets folder from `compeer-data emit`, or a JSONL file")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from policy_trainer.config import PROFILES

    names = ("max_steps", "reward_token_file", "reward_tls_ca", "reward_tls_cert", "reward_tls_key", "policy_model",
             "prompt_set")
    flags: dict[str, Any] = {"output_dir": str(args.out), **{name: getattr(args, name) for name in names}}
    flags["reward_server"] = list(args.reward_server) if args.reward_server else None
    return PROFILES.overrides(args.overrides, flags)


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``argv`` may start with ``grpo`` (as ``compeer_cli.train`` passes it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "grpo":
        args_list = args_list[1:]
    parser = make_parser()
    args = parser.parse_args(args_list)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from policy_trainer.config import describe_fields, load_config

    if args.help_fields:
        print(describe_fields())
        return 0
    if not args.config or args.out is None:
        parser.error("--config and --out are required")
    try:
        cfg = load_config(args.config, _overrides(args))
    except ValueError as exc:
        print(f"compeer-train grpo: configuration error: {exc}", file=sys.stderr)
        return 2
    from policy_trainer.runner import run

    result = run(cfg, args.out, resume=args.resume)
    print(json.dumps({"out": str(result.out_dir), "final_adapter": str(result.final_dir),
                      "resumed_from": result.resumed_from, **result.summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
