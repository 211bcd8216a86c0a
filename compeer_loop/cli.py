"""``python -m compeer_loop.cli`` (``compeer-loop``): the COMPEER loop end to end.

    compeer-loop prompts --train ESCONV/train.json --valid ESCONV/valid.json --out DATA
    compeer-loop plan    --root ROOT --prompts DATA [--steps 30 --arms a b c ... any LoopSettings field]
    compeer-loop run     --root ROOT [--no-eval]     # servers, warm-up (a), GRPO arms, evaluation; resumable
                         [--root ROOT2 ...]          # seed replicates on the same judge servers (one arm card each)
    compeer-loop status  --root ROOT                 # one line per arm / evaluation from ROOT/state.json
    compeer-loop warmup  --root ROOT                 # arm (a) alone (run starts it)
    compeer-loop eval    --root ROOT --policy NAME   # one policy (run starts them)
    compeer-loop stop    --root ROOT                 # stop the reward servers run started
    compeer-loop merge   --out ROOT SRC SRC...       # loop folders trained on different machines, into one
    compeer-loop rescore --root ROOT --out NEWROOT --scorer base:qwen2.5-coder-0.5b  # evaluations, another scorer
    compeer-loop rejudge --root ROOT --out NEWROOT --address HOST:PORT     # evaluations, another training judge
    compeer-loop report  --root ROOT --out DIR       # report.md, curves, side-by-side replies
    compeer-loop across  --run N1=R0,R1 --run N2=R0 --out FILE.md  # arms of two runs, each through its own warm-up
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from compeer_loop.plan import ARM_BY_NAME, LoopSettings, all_judges, grpo_overrides
from compeer_loop.rescore import NOT_RERUN
from compeer_loop.runner import PLAN_FILE, STATE_FILE, WARMUP_ADAPTER, Driver, load_settings, stop_servers
from evaluator.runs import ITEMS
from judge.settings import add_arguments, from_namespace

log = logging.getLogger("compeer_loop")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compeer-loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prompts", help="GRPO, warm-up and evaluation prompt sets from ESConv")
    pr.add_argument("--train", type=Path, required=True)
    pr.add_argument("--valid", type=Path, required=True)
    pr.add_argument("--out", type=Path, required=True)
    pr.add_argument("--train-rounds", type=int, default=3, help="rounds sampled per train dialogue (Eq.1)")
    pr.add_argument("--eval-rounds", type=int, default=3,
                    help="rounds sampled per valid dialogue for evaluation (Eq.1; 3 gives 585 of ESConv valid's 195)")
    pr.add_argument("--max-eval", type=int, default=None,
                    help="at most this many evaluation prompts, sampled (default: all of them)")
    pr.add_argument("--seed", type=int, default=0)
    pl = sub.add_parser("plan", help="write ROOT/plan.json (the settings every later command reads)")
    pl.add_argument("--root", type=Path, required=True)
    pl.add_argument("--overwrite", action="store_true", help="replace a plan with other settings")
    add_arguments(pl, LoopSettings, title="loop settings (saved in ROOT/plan.json)")
    for name in ("run", "status", "warmup", "stop"):
        sp = sub.add_parser(name)
        if name == "run":
            sp.add_argument("--root", type=Path, required=True, action="append",
                            help="a loop folder; repeated: seed replicates (plans --seed apart) on one set of judge "
                                 "servers: in turn on one arm card, side by side on several, each folder evaluated "
                                 "while others train")
            sp.add_argument("--no-eval", action="store_true", help="train only")
        else:
            sp.add_argument("--root", type=Path, required=True)
    ev = sub.add_parser("eval", help="evaluate one policy (an arm name or `base`)")
    ev.add_argument("--root", type=Path, required=True)
    ev.add_argument("--policy", required=True)
    an = sub.add_parser("answers", help="the judge-free figures of a policy's answers (ROOT/eval/POLICY/answers.jsonl: "
                                        "format, strategy accuracy beside the majority baseline and kappa, degenerate "
                                        "replies), written to answers-summary.json beside them")
    an.add_argument("--root", type=Path, required=True)
    an.add_argument("--policy", required=True, help="an arm name or `base`")
    an.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of the prompts for the intervals")
    mg = sub.add_parser("merge", help="merge loop folders trained on different machines (same settings, same "
                                      "warm-up) into a new ROOT, for one report")
    mg.add_argument("--out", type=Path, required=True, help="the merged loop folder (must not exist)")
    mg.add_argument("sources", type=Path, nargs="+", help="loop folders, the one that trained the warm-up first")
    text = ("copy ROOT to a new folder and re-score its evaluations' records with another independent scorer (the "
            f"comparisons only; {NOT_RERUN}); NEWROOT/rescored.json says from where, with what, when, the counts")
    rs = sub.add_parser("rescore", help=text, description=text)
    rs.add_argument("--root", type=Path, required=True, help="the loop folder whose evaluations are re-scored")
    rs.add_argument("--out", type=Path, required=True,
                    help="the new loop folder (must not exist or be empty; the same command resumes its own run)")
    rs.add_argument("--scorer", required=True, help="the new independent_scorer, served bare: base:NAME (a base of "
                                                    "judge/bases.py, e.g. base:qwen2.5-coder-0.5b), judge-base or an "
                                                    "HF folder")
    rs.add_argument("--policies", nargs="+", help="re-score these evaluated policies only (default: every one)")
    rs.add_argument("--concurrency", type=int, help="scorer requests in flight (default: the plan's eval_concurrency)")
    text = ("copy ROOT to a new folder and judge its evaluations' replies again with the reward server at --address "
            "(any judge it serves); NEWROOT/rejudged.json names that judge (its Info), from where and when")
    rj = sub.add_parser("rejudge", help=text, description=text)
    rj.add_argument("--root", type=Path, required=True, help="the loop folder whose evaluations are judged again")
    rj.add_argument("--out", type=Path, required=True, help="the new loop folder (must not exist or be empty)")
    rj.add_argument("--address", required=True, help="the reward server's gRPC address, HOST:PORT")
    rj.add_argument("--policies", nargs="+", help="judge these evaluated policies only (default: every one)")
    rp = sub.add_parser("report", help="write the report from ROOT (several --root: seed replicates, seeds pooled)")
    rp.add_argument("--root", type=Path, required=True, action="append",
                    help="a loop folder; repeat it for seed replicates (one folder per seed, plans equal but the seed)")
    rp.add_argument("--out", type=Path, required=True)
    rp.add_argument("--gpu-log", type=Path, help="a text file of the GPU calls made (commands, seconds), quoted")
    rp.add_argument("--eval-step", nargs="*", default=[], metavar="POLICY=STEP",
                    help="a policy evaluated from an earlier checkpoint than --steps (e.g. d=20); labelled in the table")
    rp.add_argument("--notes", type=Path, help="a written Markdown section put after the conclusion")
    rp.add_argument("--preface", type=Path, help="a Markdown note put verbatim at the top (a correction found after "
                                                 "the run; default: ROOT/notes.md when present)")
    ac = sub.add_parser("across", help="arms of different runs (their own warm-ups) compared on judge-free scores")
    ac.add_argument("--run", required=True, action="append", metavar="NAME=ROOT[,ROOT...]",
                    help="a loop run: its name and its loop folders (one per seed); twice or more")
    ac.add_argument("--out", type=Path, required=True, help="the Markdown section; its figures go to OUT.json")
    ac.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples and permutation flips")
    rp.add_argument("--across-run", action="append", default=[], metavar="NAME=ROOT[,ROOT...]",
                    help="another run (its folders, one per seed) whose arms are compared with these through each "
                         "run's own warm-up (`compeer-loop across`); repeatable")
    return p


def _runs(items: list[str]) -> dict[str, list[Path]]:
    """``NAME=ROOT[,ROOT...]`` items -> name -> folders; ValueError on a name given twice."""
    from compeer_loop.across import parse_run

    runs: dict[str, list[Path]] = {}
    for text in items:
        name, roots = parse_run(text)
        if name in runs:
            raise ValueError(f"--run {name} given twice")
        runs[name] = roots
    return runs


def _across(args: argparse.Namespace) -> int:
    from compeer_loop.across import compare_runs

    text, figures = compare_runs(_runs(args.run), n_boot=args.n_boot)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
    print(args.out)
    return 0


def _eval_steps(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        policy, sep, step = item.partition("=")
        if not sep or not step.isdigit():
            raise SystemExit(f"--eval-step: expected POLICY=STEP (e.g. d=20), got {item!r}")
        out[policy] = int(step)
    return out


def _plan(args: argparse.Namespace) -> int:
    settings: LoopSettings = from_namespace(LoopSettings, args)
    if settings.prompts:
        settings = dataclasses.replace(settings, prompts=str(Path(settings.prompts).resolve()))
    path = args.root / PLAN_FILE
    if path.exists() and not args.overwrite:
        old = LoopSettings.from_json(json.loads(path.read_text()))
        if old != settings:
            diff = [f.name for f in dataclasses.fields(LoopSettings) if getattr(old, f.name) != getattr(settings, f.name)]
            print(f"compeer-loop plan: {path} has other settings ({', '.join(diff)}); pass --overwrite or another "
                  "--root", file=sys.stderr)
            return 2
    args.root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    print(json.dumps(settings.to_json(), indent=2))
    return 0


def _warmup(root: Path) -> int:
    """Arm (a): the SFT warm-up with exactly the settings the GRPO arms are given (they then reuse it)."""
    from policy_trainer.config import load_config, parse_override
    from policy_trainer.runner import load_policy, lora_config
    from policy_trainer.warmup import run_warmup

    s = load_settings(root)
    out = root / "a"
    if (out / WARMUP_ADAPTER / "adapter_config.json").is_file():
        print(f"warm-up already done: {out / WARMUP_ADAPTER}")
        return 0
    overrides: dict[str, Any] = dict(parse_override(item) for item in grpo_overrides(s, ARM_BY_NAME["c"], Path(s.prompts)))
    # the reward server is never called by the warm-up; the config names the one the GRPO arms start with
    overrides.update(output_dir=str(out), max_steps=s.steps, policy_model=s.policy_model,
                     reward_server=[all_judges(s)["trained"].address])
    cfg = load_config(s.profile, overrides)
    model, tokenizer, _ = load_policy(cfg)
    run_warmup(cfg, model, tokenizer, out, lora_config(cfg))
    print(f"warm-up adapter: {out / WARMUP_ADAPTER}")
    return 0


def _answers(root: Path, policy: str, n_boot: int) -> int:
    from compeer_loop.stats import summarise_answers

    path = root / "eval" / policy / "answers.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no answers (`compeer-loop eval` or tools/gpu/compeer_loop.sh probe write them)")
    with path.open() as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    summary = summarise_answers(records, n_boot=n_boot)
    text = json.dumps(summary, indent=1, ensure_ascii=False)
    (path.parent / "answers-summary.json").write_text(text + "\n")
    print(text)
    return 0


def eval_progress(out: Path) -> str:
    """How far a running evaluation (``ROOT/eval/<policy>``) got, read from its files: prompts answered
    (``gold/items.jsonl``), replies the judge scored (``scored.jsonl``), whether its records are written, and the
    ESC-Eval-style dialogues done (``esc/items.jsonl``), so a time-limited call can tell how much is left."""
    def lines(path: Path) -> int:
        return sum(1 for _ in path.open(encoding="utf-8")) if path.exists() else 0

    parts = [f"answered {lines(out / 'gold' / ITEMS)}", f"judged {lines(out / 'scored.jsonl')}"]
    if (out / "records.jsonl").exists():
        parts.append("records written")
    if (out / "esc").exists():
        parts.append(f"ESC dialogues {lines(out / 'esc' / ITEMS)}")
    return ", ".join(parts)


def _status(root: Path) -> int:
    path = root / STATE_FILE
    if not path.exists():
        print(f"{root}: no state yet")
        return 1
    st = json.loads(path.read_text())
    print(f"elapsed {st.get('elapsed_s', 0):.0f} s; servers: " + ", ".join(f"{k} {v}" for k, v in st.get("servers", {}).items()))
    if st.get("machine"):
        m, p = st["machine"], st.get("placement") or {}
        print(f"machine {m.get('hostname')} ({m.get('gpus')}); judge servers on card {p.get('judge_card')}, arms on "
              f"{', '.join(p.get('arm_cards') or []) or 'the same'}")
    for name, a in sorted(st["arms"].items()):
        print(f"  arm {name}: {a.get('status')} step {a.get('step')}/{a.get('max_steps')}  ({a.get('title')})")
        for j in a.get("judge", []):
            print(f"    judge {j['server']}: {j['model']} ({j['revision']}), adapter {j['adapter'] or 'none'}")
        if a.get("ran_on"):
            print(f"    ran on {a['ran_on']}")
    for name, e in sorted(st["eval"].items()):
        print(f"  eval {name}: {e}" + (f" ({eval_progress(root / 'eval' / name)})" if e == "running" else ""))
    done = root / "DONE"
    print("DONE: " + done.read_text() if done.exists() else "running or stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if args.command == "prompts":
            from compeer_loop.prompts import build_prompt_sets

            manifest = build_prompt_sets(args.train, args.valid, args.out, train_rounds=args.train_rounds,
                                         eval_rounds=args.eval_rounds, max_eval=args.max_eval, seed=args.seed)
            print(json.dumps(manifest["counts"]))
            return 0
        if args.command == "plan":
            return _plan(args)
        if args.command == "run":
            from compeer_loop.replicates import run_replicates

            states = run_replicates([Driver(r, load_settings(r)) for r in args.root], evaluate=not args.no_eval)
            for root, state in zip(args.root, states):
                print(json.dumps({"root": str(root), "arms": {k: v.get("status") for k, v in state["arms"].items()},
                                  "eval": state["eval"]}))
            return 0
        if args.command == "status":
            return _status(args.root)
        if args.command == "warmup":
            return _warmup(args.root)
        if args.command == "stop":
            stop_servers(args.root)
            return 0
        if args.command == "eval":
            from compeer_loop.evaluate import evaluate_policy

            print(json.dumps(evaluate_policy(args.root, args.policy)))
            return 0
        if args.command == "answers":
            return _answers(args.root, args.policy, args.n_boot)
        if args.command == "merge":
            from compeer_loop.merge import merge_roots

            merged = merge_roots(args.sources, args.out)
            print(json.dumps({"root": str(args.out), "arms": merged.arms, "eval_policies": merged.eval_policies}))
            return 0
        if args.command == "across":
            return _across(args)
        if args.command == "rescore":
            from compeer_loop.rescore import rescore

            done = rescore(args.root, args.out, args.scorer, args.policies, args.concurrency)
            print(json.dumps({"root": str(args.out), "scorer": args.scorer,
                              "policies": {k: v["independent_status"] for k, v in done["policies"].items()}}))
            return 0
        if args.command == "rejudge":
            from compeer_loop.rejudge import rejudge

            done = rejudge(args.root, args.out, args.address, args.policies)
            print(json.dumps({"root": str(args.out), "judge": done["judge"],
                              "policies": {k: v["judge_status"] for k, v in done["policies"].items()}}))
            return 0
        from compeer_loop.report import write_report

        print(write_report(args.root, args.out, args.gpu_log, eval_steps=_eval_steps(args.eval_step),
                           notes=args.notes, preface=args.preface, across=_runs(args.across_run)))
        return 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"compeer-loop {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
