"""``compeer-train <command>``: dispatch to the reward trainer (judge, judge-eval, ablation) or the policy trainer (grpo)."""

from __future__ import annotations

import importlib
import sys

#: command -> module whose ``main(argv)`` runs it (imported lazily: each pulls in heavy training stacks).
COMMANDS: dict[str, str] = {
    "judge": "reward_trainer.cli",
    "judge-eval": "reward_trainer.cli",
    "judge-contrast": "reward_trainer.cli",
    "judge-calibrate": "reward_trainer.cli",
    "judge-ablation": "reward_trainer.cli",
    "grpo": "policy_trainer.cli",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print(f"usage: compeer-train {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[args[0]])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
