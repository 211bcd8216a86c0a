"""Independent rounds, or the answer prefix, against today's sequential rounds (issue 27, item 2), side by side in
one run on one engine.

Today a unified judgment is four rounds, one after another, each with the earlier rounds' answers in its context, so
a GRPO step waits for the sum of its rounds' decoded tokens. With ``JudgeSettings.independent_rounds`` every round
is sent at once after the system message and the conversation alone (the conversation is a shared prefix, cached),
so a judgment waits for its longest round. The judge was trained on the sequential conversation: its verdicts can
change, and this run measures how often. With ``--compare prefix`` the other path is ``JudgeSettings.answer_prefix``
instead: each round's answer is started for the engine with ``Rationale:``, so it decodes only the rest (the same
conversation, a few positions fewer a round); "today's sequential rounds" is then the path without the prefix.
``--compare independent,prefix`` sets both beside today's path on the one engine; ``discrete`` is today's path without
the verdict probabilities (``JudgeSettings.verdict_probs`` off: no top-k logprobs asked, discrete rewards only), which
measures what the graded reward's logprobs cost a judged step; ``top5`` is today's path with 5 alternatives a token
instead of 20 (``JudgeSettings.verdict_top_k``): the same verdicts, its cost, and how far its label probabilities are
from today's (``probability_gap``: total variation distance per component).

    python -m bench.judge_rounds [--compare independent|prefix|discrete|top5|...,...] [--judge 1.5b-judge]
        [--device cpu|cuda] [--dtype float32] [--sets 2] [--launch-bound]

Workload: real ESConv conversations (``--data``) as :mod:`bench.judge_bases_cpu` builds them: ``--groups`` x
``--group-size`` contrast candidates a set (default one GRPO step, 8 x 4: the real supporter turn and negatives that
differ from it in one part), the real turn as the reference, unified mode, the default template and settings (verdict
grammar, graded rewards' logprobs). One engine (vLLM, prefix caching) serves both paths; before each path of each
set the prefix cache is reset, and the order of the two paths alternates between sets (the machine drifts).

Per path: the step's wall time (``step_s``, mean over sets), the sequential decode positions a judgment needs (the
accepted rounds' tokens, by the judge's tokenizer: their sum when sequential, their largest when independent; a
step's positions = the largest over its candidates, which decode together; the prefix path decodes each round's
tokens less the prefix's), seconds per position, generations a round (re-generations of unparsable rounds
included). Agreement: per component, the share of candidates whose verdict is the same on both paths. Writes
``bench/results/judge_rounds_<device>.json`` (``judge_rounds_prefix_<device>.json`` with ``--compare prefix``,
``judge_rounds_all_<device>.json`` with both); ratios are each other path over sequential.

``--backend transformers`` runs the paths on the transformers engine instead (no prefix cache to reset, no launch
floor): for ``top5``'s probability gap where the logprobs are the model's unmasked distribution.
``--rationale-bound`` picks the engine's bound, ``--structured-outputs-backend`` its mask library and
``--max-num-batched-tokens`` its scheduler's tokens a step (one of each a run: all are the engine's); ``--baseline``
takes the JSON
of an earlier run on the same rounds (every candidate's verdicts are in it) and adds each path's agreement with that
run's sequential path: e.g. ``max_tokens`` against ``counted``. ``--launch-bound`` (the default on
``cuda``) measures, after the paths and on the same engine, the launch floor of
:func:`bench.judge_engines_gpu.launch_bound` with as many unconstrained rows as a set has candidates (ms per decode
position), and per path ``floor_multiple``: the step's wall time over floor x the step's sequential positions (issue
27's goal: within 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import machine_description, print_table, write_result
from bench.judge_bases_cpu import ESCONV_VALID, JUDGES, esconv_groups, verdict_rows
from bench.judge_engines_gpu import launch_bound
from judge.engines.settings import RATIONALE_BOUNDS, STRUCTURED_OUTPUTS_BACKENDS

#: the judge settings of each path: "sequential" is the unoptimised path (no prefix, 20 alternatives a token, as the
#: figures before 2026-11-29 measured it); each other path changes one thing. ``top5`` is vLLM's default since then
#: (``judge.conversation.verdict_top_k``)
PATH_SETTINGS: dict[str, dict[str, bool | int]] = {
    "sequential": {"answer_prefix": False, "verdict_top_k": 20},
    "independent": {"independent_rounds": True, "answer_prefix": False, "verdict_top_k": 20},
    "prefix": {"answer_prefix": True, "verdict_top_k": 20},
    "discrete": {"answer_prefix": False, "verdict_probs": False},
    "top5": {"answer_prefix": False, "verdict_top_k": 5}}


async def _judge_set(judge: Any, groups: list[dict[str, Any]]) -> tuple[float, list[Any]]:
    """Every candidate of ``groups`` at once (unified mode): wall time and the judgments, in candidate order."""
    from cer.modes import JudgeMode
    from cer.reasoning import parse
    from data_builder.records import turns_of

    jobs = [(turns_of(g["history"]), g["reference"], parse(text)) for g in groups for _, text in g["candidates"]]
    t = time.perf_counter()
    done = await asyncio.gather(*(judge.judge(h, ref, p, JudgeMode.UNIFIED) for h, ref, p in jobs))
    return time.perf_counter() - t, list(done)


def positions(texts: list[str], independent: bool, count: Any, given: int = 0) -> int:
    """Sequential decode positions of one judgment: its rounds' tokens summed, or the largest when independent;
    ``given``: the tokens of each round the engine did not decode (an answer prefix's)."""
    sizes = [count(t) - given + 1 for t in texts]  # + the end-of-turn token each round stops on
    return (max(sizes) if independent else sum(sizes)) if sizes else 0


def floor_multiple(step_s: float, step_positions: float, floor_ms: float) -> float:
    """A judged step's wall time over what its sequential decode positions cost at the launch floor."""
    return step_s / (floor_ms * step_positions / 1000)


def agreement(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per component: candidates judged on both sides (:func:`verdict_rows`, in the same candidate order) and the
    share with the same verdict (an unparsed verdict never agrees)."""
    out: dict[str, dict[str, float | int]] = {}
    for comp in sorted({c for row in a + b for c in row}):
        pairs = [(x[comp], y[comp]) for x, y in zip(a, b) if comp in x and comp in y]
        same = sum(1 for x, y in pairs if x == y and x is not None)
        out[comp] = {"candidates": len(pairs), "same": same, "share": same / len(pairs) if pairs else float("nan")}
    return out


def prob_rows(judgments: list[Any]) -> list[dict[str, dict[str, float] | None]]:
    """Each candidate's verdict label probabilities per component (None where none were read)."""
    return [dict(j.probs) for j in judgments]


def prob_gap(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per component: candidates with label probabilities on both sides (:func:`prob_rows`, same candidate order),
    those with them on one side only, and the total variation distance between the two distributions (mean, max)."""
    out: dict[str, dict[str, float | int]] = {}
    for comp in sorted({c for row in a + b for c in row}):
        pairs = [(x.get(comp), y.get(comp)) for x, y in zip(a, b)]
        both = [(x, y) for x, y in pairs if x is not None and y is not None]
        tv = [0.5 * sum(abs(x.get(k, 0.0) - y.get(k, 0.0)) for k in set(x) | set(y)) for x, y in both]
        out[comp] = {"candidates": len(both), "one_side_only": sum(1 for x, y in pairs if (x is None) != (y is None)),
                     "tv_mean": sum(tv) / len(tv) if tv else float("nan"), "tv_max": max(tv, default=float("nan"))}
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Both paths on one engine; the figures of each, and their agreement."""
    from transformers import AutoTokenizer

    from cer.taxonomy import load_taxonomy
    from judge.conversation import Judge
    from judge.engines.base import EngineConfig
    from judge.engines.settings import VllmSettings
    from judge.engines.vllm_engine import VllmEngine
    from judge.factory import build_engine, resolve_engine
    from judge.protocol import ANSWER_PREFIX, JudgeSettings, load_template

    paths = ("sequential", *args.compare)
    base, adapter = JUDGES[args.judge]
    bound = {"rationale_bound": args.rationale_bound} if args.rationale_bound else {}
    vllm = VllmSettings(structured_outputs_backend=args.structured_outputs_backend,
                        max_num_batched_tokens=args.max_num_batched_tokens)
    config = resolve_engine(EngineConfig(backend=args.backend, dtype=args.dtype, device=args.device,
                                         max_model_len=4096, vllm=vllm, **bound), base, adapter)
    engine = build_engine(config)
    if args.backend == "vllm" and not isinstance(engine, VllmEngine):
        raise TypeError(f"expected the vLLM engine, got {type(engine).__name__}")

    async def reset() -> None:  # vLLM's prefix cache; the transformers engine keeps none across requests
        if isinstance(engine, VllmEngine):
            await engine.reset_prefix_cache()
    tokenizer = AutoTokenizer.from_pretrained(config.model_path, local_files_only=True)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    given = {p: count(ANSWER_PREFIX) if PATH_SETTINGS[p]["answer_prefix"] else 0 for p in paths}

    def pos(p: str, texts: list[str]) -> int:
        return positions(texts, p == "independent", count, given[p])

    t = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - t
    template, taxonomy = load_template(), load_taxonomy()
    judges = {p: Judge(engine, template, taxonomy, JudgeSettings(**PATH_SETTINGS[p])) for p in paths}
    assert all(judges[p].prefixed == PATH_SETTINGS[p]["answer_prefix"] for p in paths)
    groups = esconv_groups(args.data, 1 + args.sets * args.groups, args.group_size, args.seed)
    warm = [{**groups[0], "candidates": groups[0]["candidates"][:1]}]
    for judge in judges.values():  # compile and warm both paths' shapes before anything is timed
        await _judge_set(judge, warm)
    sets = [groups[1 + i * args.groups:1 + (i + 1) * args.groups] for i in range(args.sets)]
    walls: dict[str, list[float]] = {p: [] for p in paths}
    steps: dict[str, list[int]] = {p: [] for p in paths}
    done: dict[str, list[Any]] = {p: [] for p in paths}
    for i, groups_ in enumerate(sets):
        for p in paths[i % len(paths):] + paths[:i % len(paths)]:  # each path first in turn
            await reset()
            wall, judgments = await _judge_set(judges[p], groups_)
            walls[p].append(wall)
            steps[p].append(max(pos(p, j.texts) for j in judgments))
            done[p] += judgments
    floor = None
    if args.launch_bound:
        await reset()
        floor = await launch_bound(engine, sum(len(g["candidates"]) for g in sets[0]), 16, args.launch_tokens)
    await engine.stop()
    rows = {p: verdict_rows(done[p]) for p in paths}
    probs = {p: prob_rows(done[p]) for p in paths}
    figures: dict[str, Any] = {}
    for p in paths:
        rounds = sum(len(j.texts) for j in done[p])
        step_s, step_pos = sum(walls[p]) / len(sets), sum(steps[p]) / len(sets)
        figures[p] = {"step_s": step_s, "step_s_per_set": walls[p], "step_positions": step_pos,
                      "ms_per_position": 1000 * step_s / step_pos if step_pos else None,
                      "judgment_positions_mean": sum(pos(p, j.texts) for j in done[p]) / len(done[p]),
                      "round_positions_mean": sum(positions([t], False, count, given[p]) for j in done[p]
                                                  for t in j.texts) / max(1, rounds),
                      "generations_per_round": sum(j.generations for j in done[p]) / max(1, rounds),
                      "unparsed_components": sum(1 for j in done[p] for v in j.verdicts.values() if v is None)}
        if floor is not None and step_pos:
            figures[p]["floor_multiple"] = floor_multiple(step_s, step_pos, floor["ms_per_position"])
    return {"model": config.model_id, "adapter": config.adapter_id, "dtype": args.dtype, "start_s": start_s,
            "rationale_bound": config.bound, "structured_outputs_backend": args.structured_outputs_backend,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "candidates_per_set": sum(len(g["candidates"]) for g in sets[0]), "paths": figures,
            "launch_bound": floor,
            "agreement": {p: agreement(rows["sequential"], rows[p]) for p in paths[1:]},
            "probability_gap": {p: prob_gap(probs["sequential"], probs[p]) for p in paths[1:]
                                if PATH_SETTINGS[p].get("verdict_probs", True)},
            "settings": {p: PATH_SETTINGS[p] for p in paths},
            "dialogues": [g["dialogue_id"] for s in sets for g in s], "verdicts": rows}


def with_baseline(fig: dict[str, Any], baseline: dict[str, Any], source: str) -> dict[str, Any]:
    """``fig`` plus each path's agreement with ``baseline``'s sequential path: an earlier run of this benchmark on
    the same rounds (e.g. another rationale bound, which needs its own engine); ValueError when the rounds differ."""
    if baseline.get("dialogues") != fig["dialogues"] or "verdicts" not in baseline:
        raise ValueError(f"--baseline {source}: not a run of this benchmark on the same rounds (same --data, --seed, "
                         "--sets, --groups and --group-size)")
    base = baseline["verdicts"]["sequential"]
    return {**fig, "baseline": {"file": source, "rationale_bound": baseline.get("rationale_bound")},
            "agreement_with_baseline": {p: agreement(base, r) for p, r in fig["verdicts"].items()}}


def baseline_mismatch(baseline: dict[str, Any], args: argparse.Namespace) -> str | None:
    """Why ``baseline`` cannot be compared with a run of ``args`` (checked before the engine starts, so a mismatch costs
    no engine time), or None: the workload settings that choose the rounds must be the same (the data file's content
    is checked after the run, by :func:`with_baseline`, from the dialogues judged)."""
    work = baseline.get("workload") or {}
    if "verdicts" not in baseline:
        return "it holds no per-candidate verdicts (a run before --baseline existed)"
    wanted = {"groups": args.groups, "group_size": args.group_size, "sets": args.sets, "seed": args.seed}
    have = {k: work.get(k) for k in wanted}
    diff = [f"{k}: {have[k]} in the baseline, {wanted[k]} here" for k in wanted if have[k] != wanted[k]]
    return "; ".join(diff) or None


def _compared(value: str) -> tuple[str, ...]:
    """``--compare``: one or more of the non-sequential paths, comma-separated, each once."""
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if not names or len(set(names)) != len(names) or not set(names) <= set(PATH_SETTINGS) - {"sequential"}:
        others = ", ".join(p for p in PATH_SETTINGS if p != "sequential")
        raise argparse.ArgumentTypeError(f"--compare {value!r}: expected one or more of {others}, comma-separated")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ESCONV_VALID, help="ESConv JSON (raw corpus schema)")
    p.add_argument("--compare", default="independent", type=_compared,
                   help="the path(s) set beside today's sequential rounds: one or more of independent, prefix, "
                        "discrete and top5, comma-separated")
    p.add_argument("--judge", default="1.5b-judge", choices=sorted(JUDGES), help="the judge (bench.judge_bases_cpu)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--backend", default="vllm", choices=("vllm", "transformers"),
                   help="the judge's engine (transformers: its unmasked logprobs, for top5's probability gap; no "
                        "prefix cache, no launch floor)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--groups", type=int, default=8, help="groups (prompts) of a set")
    p.add_argument("--group-size", type=int, default=4, help="candidates a group")
    p.add_argument("--sets", type=int, default=2, help="sets; each is judged by both paths")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rationale-bound", choices=RATIONALE_BOUNDS, default=None,
                   help="the engine's rationale bound (default: the engine's default)")
    p.add_argument("--structured-outputs-backend", choices=STRUCTURED_OUTPUTS_BACKENDS, default="auto",
                   help="the library vLLM computes the verdict masks with (the server's flag)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="vLLM's tokens a scheduler step (the server's flag; default: vLLM's, 2,048 for an AsyncLLM)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="an earlier run's JSON on the same rounds: each path's agreement with its sequential verdicts")
    p.add_argument("--launch-bound", action=argparse.BooleanOptionalAction, default=None,
                   help="measure the launch floor on the same engine afterwards (default: on cuda only)")
    p.add_argument("--launch-tokens", type=int, default=144, help="the launch floor's long run (tokens a row)")
    p.add_argument("--note", action="append", default=[], help="a note to record in the JSON (repeatable)")
    args = p.parse_args(argv)
    if args.launch_bound is None:
        args.launch_bound = args.device == "cuda" and args.backend == "vllm"
    if args.launch_bound and args.backend != "vllm":
        p.error("--launch-bound measures vLLM's launch floor: use it with --backend vllm")
    baseline = json.loads(args.baseline.read_text(encoding="utf-8")) if args.baseline else None
    if baseline is not None and (why := baseline_mismatch(baseline, args)):
        p.error(f"--baseline {args.baseline}: not comparable with this run ({why})")
    fig = asyncio.run(measure(args))
    if baseline is not None:
        fig = with_baseline(fig, baseline, str(args.baseline))
    seq = fig["paths"]["sequential"]
    ratios = {c: {k: fig["paths"][c][k] / seq[k] for k in ("step_s", "step_positions", "ms_per_position")
                  if seq[k] and fig["paths"][c][k]} for c in args.compare}
    name = {("independent",): "judge_rounds", ("prefix",): "judge_rounds_prefix"}.get(args.compare, "judge_rounds_all")
    name += "" if args.backend == "vllm" else f"_{args.backend}"
    out = write_result(f"{name}_{args.device}", {
        "command": " ".join(["python -m bench.judge_rounds", *(argv if argv is not None else sys.argv[1:])]),
        "workload": {"data": str(args.data), "groups": args.groups, "group_size": args.group_size, "sets": args.sets,
                     "seed": args.seed, "mode": "unified", "engine": f"{args.backend}-{args.device}",
                     "prefix_caching": args.backend == "vllm",
                     "vllm_cpu_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_CPU_")}},
        "machine_detail": machine_description(), **fig,
        **{f"ratios_{c}_over_sequential": ratios[c] for c in args.compare}, "notes": args.note})
    for c in args.compare:
        other = fig["paths"][c]
        rows = [(k, seq.get(k), f"{other[k]:.4g} ({ratios[c][k]:.2f}x)" if k in ratios[c] else str(other.get(k)))
                for k in ("step_s", "step_positions", "ms_per_position", "floor_multiple", "judgment_positions_mean",
                          "round_positions_mean", "generations_per_round", "unparsed_components")]
        rows += [(f"agreement {comp}", a["candidates"], f"{a['share']:.3f}") for comp, a in fig["agreement"][c].items()]
        rows += [(f"probability TV {comp} (mean, max)", g["candidates"], f"{g['tv_mean']:.2e}, {g['tv_max']:.2e}")
                 for comp, g in fig["probability_gap"].get(c, {}).items()]
        print_table(f"{fig['model']} + {fig['adapter']} on {args.device}: sequential vs {c}", rows)
    for c, comps in fig.get("agreement_with_baseline", {}).items():
        print(f"agreement of {c} with the baseline's sequential path ({fig['baseline']['rationale_bound']}): "
              + ", ".join(f"{comp} {a['same']}/{a['candidates']}" for comp, a in comps.items()))
    if fig["launch_bound"]:
        print(f"launch floor: {fig['launch_bound']['ms_per_position']:.3f} ms a position "
              f"({fig['launch_bound']['rows']} rows)")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
