"""Both judge engines on one device, same run: the vLLM engine with each rationale bound and the transformers engine,
judging the same workloads with the real default judge (the shipped adapter merged into SmolLM2-135M-Instruct).

    python -m bench.judge_engines_gpu [--device cuda] [--configs vllm-counted,vllm-max_tokens,vllm-line,transformers]

Workloads (unified mode, every round constrained by the verdict grammar, greedy):

* ``grpo_step``: one GRPO step's judging, ``--groups`` x ``--group-size`` candidates (8 x 4), all at once;
* ``score_batch``: the judging of one ScoreBatch of ``--score-groups`` groups (64 x ``--group-size``), all at once
  (the judge's share of a ScoreBatch: no reward cache, no embedding).

Each configuration starts its own engine (start time reported), runs ``--steps`` fresh sets of each workload (the
first reported apart as ``first_*_s``, the rest as the median) and reports every candidate's verdicts parsed, the
generations per round (re-generations after an unparsable answer included), tokens a generation, the step time per
sequential decode position (rounds x tokens a round: comparable with the launch bound below), and for vLLM the
answers cut at a line over the bound. Grammar semantics are the same in every configuration: a one-line rationale of at most
``rationale_max_chars`` characters then the verdict line (``counted``: a counted repetition in the regex;
``max_tokens``: an unbounded pattern, an over-long line re-generated; ``line``: vLLM logits processor / the
transformers engine's line bound).

The launch-bound estimate (``--launch-bound``, vLLM only): ``--launch-rows`` (32) unconstrained rows decoding a fixed
number of tokens (ignore_eos) with CUDA graphs, ``(t(long) - t(short)) / (long - short)`` = ms per decode position:
the floor any engine's per-position cost can be placed against.

Prints the figures and the ratios (transformers / each vLLM configuration, per workload); writes
``bench/results/judge_engines_gpu.json`` (and ``--out`` when given).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from bench.common import print_table, write_result
from bench.judge_throughput import make_groups
from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from judge.conversation import Judge
from judge.engines.base import DelegatingEngine, Engine, EngineConfig, GenParams, GenResult, Message
from judge.engines.settings import RATIONALE_BOUNDS, TransformersSettings, VllmSettings
from judge.factory import build_engine, resolve_engine
from judge.protocol import JudgeSettings, load_template

#: configuration name -> (backend, the backend's settings fields; ``rationale_bound``: EngineConfig's)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"vllm-{b}": ("vllm", {"rationale_bound": b}) for b in RATIONALE_BOUNDS},
    "transformers": ("transformers", {"static_cache": True}),  # the GPU configuration: line bound, static cache
    "transformers-dynamic": ("transformers", {}),
}
WORKLOADS = ("grpo_step", "score_batch")


class CountingEngine(DelegatingEngine):
    """Wraps an engine: counts generations (rounds and their re-generations) and decoded tokens."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.generations = 0
        self.output_tokens = 0

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        result = await self.inner.generate(messages, params, request_id)
        self.generations += 1
        self.output_tokens += result.output_tokens
        return result


def engine_config(name: str, model_path: str, device: str, args: argparse.Namespace) -> EngineConfig:
    backend, fields = CONFIGS[name]
    if backend == "vllm":
        return EngineConfig(backend="vllm", model_path=model_path, device=device, max_model_len=args.max_model_len,
                            rationale_bound=fields["rationale_bound"],
                            vllm=VllmSettings(gpu_memory_utilization=args.gpu_memory_utilization))
    return EngineConfig(backend="transformers", model_path=model_path, device=device, max_model_len=args.max_model_len,
                        transformers=TransformersSettings(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                                                          **fields))


async def judge_set(judge: Judge, engine: CountingEngine, n_groups: int, group_size: int, seed: int
                    ) -> dict[str, float]:
    """Judge ``n_groups`` fresh groups at once; wall time, parsed share, generations and tokens."""
    groups = make_groups(n_groups, group_size, seed=seed)
    jobs = [(g.history, g.reference, parse(c), JudgeMode.UNIFIED) for g in groups for c in g.candidates]
    g0, t0 = engine.generations, engine.output_tokens
    t = time.perf_counter()
    judgments = await asyncio.gather(*(judge.judge(*j) for j in jobs), return_exceptions=True)
    wall = time.perf_counter() - t
    ok = [j for j in judgments if not isinstance(j, BaseException)]
    parsed = sum(1 for j in ok if j.judged and all(j.verdicts.get(c) is not None for c in j.judged))
    rounds = sum(len(j.texts) for j in ok) or 1
    return {"wall_s": wall, "parsed": parsed / len(jobs), "errors": len(judgments) - len(ok),
            "generations_per_round": (engine.generations - g0) / rounds,
            "tokens": float(engine.output_tokens - t0), "generations": float(engine.generations - g0),
            "rounds_per_candidate": rounds / max(1, len(ok))}


async def launch_bound(engine: Engine, rows: int, short: int, long: int) -> dict[str, float]:
    """ms per decode position of ``rows`` unconstrained rows on vLLM (CUDA graphs as configured; no grammar)."""
    from vllm import SamplingParams

    llm = getattr(engine.inner if isinstance(engine, CountingEngine) else engine, "_llm", None)  # AsyncLLM
    if llm is None:
        raise RuntimeError("the launch-bound estimate needs a started vLLM engine")

    async def one(i: int, n: int, tag: str) -> None:
        sp = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
        async for _ in llm.generate(f"Tell me a long story about the number {i} and {tag}.", sp, f"lb-{tag}-{i}"):
            pass

    async def timed(n: int, tag: str) -> float:
        t = time.perf_counter()
        await asyncio.gather(*(one(i, n, tag) for i in range(rows)))
        return time.perf_counter() - t

    await timed(long, "warm")
    t_short = min([await timed(short, f"s{k}") for k in range(3)])
    t_long = min([await timed(long, f"l{k}") for k in range(3)])
    return {"rows": rows, "short_tokens": short, "long_tokens": long, "short_s": t_short, "long_s": t_long,
            "ms_per_position": 1000 * (t_long - t_short) / (long - short)}


def bound_of(name: str, engine: Engine) -> dict[str, Any]:
    """How the configuration bounds the rationale: ``rationale_bound`` (``counted``: in the regex; ``max_tokens``: not
    while decoding, an over-long line cut after it and re-generated; ``line``: while decoding) and whether the bound
    is enforced while decoding (``max_tokens`` takes ``max_line_chars`` but only checks it after generation)."""
    backend, fields = CONFIGS[name]
    bound = fields["rationale_bound"] if backend == "vllm" else ("line" if engine.supports_line_bound else "counted")
    return {"rationale_bound": bound, "bound_while_decoding": bound in ("counted", "line")}


async def run_config(name: str, model_path: str, device: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start one engine, run every workload ``args.steps`` times, stop it."""
    engine = CountingEngine(build_engine(engine_config(name, model_path, device, args)))
    t = time.perf_counter()
    await engine.start()
    figures: dict[str, Any] = {"start_s": time.perf_counter() - t, **bound_of(name, engine)}
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings())
    sizes = {"grpo_step": args.groups, "score_batch": args.score_groups}
    for w in WORKLOADS:
        sets = [await judge_set(judge, engine, sizes[w], args.group_size, seed=1000 * (i + 1) + sizes[w])
                for i in range(args.steps)]
        steady = sets[1:]
        figures[w] = {
            "first_s": sets[0]["wall_s"], "median_s": statistics.median(s["wall_s"] for s in steady),
            "all_verdicts_parsed": min(s["parsed"] for s in sets), "errors": sum(s["errors"] for s in sets),
            "generations_per_round": statistics.mean(s["generations_per_round"] for s in steady),
            "tokens_per_s": sum(s["tokens"] for s in steady) / sum(s["wall_s"] for s in steady),
        }
        # the rounds of a candidate run one after another: a set's critical path is about rounds x tokens a round
        per_gen = sum(s["tokens"] for s in steady) / max(1.0, sum(s["generations"] for s in steady))
        path = statistics.mean(s["rounds_per_candidate"] for s in steady) * per_gen
        figures[w]["tokens_per_generation"] = per_gen
        figures[w]["ms_per_sequential_position"] = 1000 * figures[w]["median_s"] / max(1.0, path)
    if hasattr(engine.inner, "overlong_lines"):
        figures["answers_cut_at_overlong_line"] = engine.inner.overlong_lines
    if args.launch_bound and CONFIGS[name][0] == "vllm" and "launch_bound" not in args.done:
        figures["launch_bound"] = await launch_bound(engine, args.launch_rows, 16, args.launch_tokens)
        args.done.add("launch_bound")
    await engine.stop()
    return figures


def ratios(results: dict[str, Any], names: list[str]) -> list[tuple[str, float]]:
    """transformers step time / each vLLM configuration's (> 1: vLLM faster), per workload, and ms per position
    relative to the launch bound."""
    out = []
    hf = next((n for n in names if CONFIGS[n][0] == "transformers" and n in results), None)
    for w in WORKLOADS:
        for n in names:
            if CONFIGS[n][0] == "vllm" and hf is not None and n in results:
                out.append((f"{w}: {hf} / {n} (speed ratio)", results[hf][w]["median_s"] / results[n][w]["median_s"]))
    counted = results.get("vllm-counted")
    for n in ("vllm-max_tokens", "vllm-line"):
        if counted is not None and n in results:
            out.append((f"grpo_step: vllm-counted / {n} (speed ratio)",
                        counted["grpo_step"]["median_s"] / results[n]["grpo_step"]["median_s"]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="'default' (the default judge, adapter merged) or an HF folder")
    p.add_argument("--device", default="cuda")
    p.add_argument("--configs", default="vllm-counted,vllm-max_tokens,vllm-line,transformers",
                   help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--groups", type=int, default=8, help="groups of one GRPO step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--score-groups", type=int, default=64, help="groups of the ScoreBatch")
    p.add_argument("--steps", type=int, default=3, help="sets of fresh groups per workload (>= 2)")
    p.add_argument("--max-batch", type=int, default=32, help="transformers engine micro-batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--launch-bound", action=argparse.BooleanOptionalAction, default=True,
                   help="measure vLLM's ms per decode position (first vLLM configuration)")
    p.add_argument("--launch-rows", type=int, default=32)
    p.add_argument("--launch-tokens", type=int, default=144)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    names = args.configs.split(",")
    unknown = set(names) - set(CONFIGS)
    if unknown:
        p.error(f"--configs: unknown {', '.join(sorted(unknown))}; expected {', '.join(CONFIGS)}")
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first set is reported apart)")
    args.done = set()
    # the judge factory resolves the judge once (device and dtype auto, the shipped adapter merged)
    ref = resolve_engine(EngineConfig(backend="transformers", device=args.device), args.model, "default")
    if ref.adapter is not None:
        p.error("--model: a merged judge folder or 'default' (the benchmark serves no run-time LoRA)")
    results: dict[str, Any] = {"model": ref.model_id, "adapter": ref.adapter_id, "device": args.device,
                               "groups": args.groups, "group_size": args.group_size,
                               "score_groups": args.score_groups, "steps": args.steps, "configs": names}
    # vLLM first: its engine core is a child process, the transformers engine then takes the device in this one
    for name in sorted(names, key=lambda n: CONFIGS[n][0] != "vllm"):
        print(f"--- {name}", flush=True)
        try:
            results[name] = asyncio.run(run_config(name, ref.model_path, args.device, args))
        except Exception as exc:  # noqa: BLE001 (one configuration failing must not lose the others' figures)
            traceback.print_exc()
            results[name] = {"failed": f"{type(exc).__name__}: {exc}"}
            print(f"{name} failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        f = results[name]
        rows = [("start_s", f["start_s"], "")]
        for w in WORKLOADS:
            rows += [(f"{w}.{k}", v, "goal <= 0.5 s" if (w, k) == ("grpo_step", "median_s") else "")
                     for k, v in f[w].items()]
        rows += [(k, v, "") for k, v in f.items() if k in ("answers_cut_at_overlong_line",)]
        if "launch_bound" in f:
            rows += [(f"launch_bound.{k}", v, "") for k, v in f["launch_bound"].items()]
        print_table(f"{name} ({args.device})", rows)
    if args.device.startswith("cuda"):  # asked only now: CUDA in this process before vLLM forces spawned workers
        import torch

        results["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    ok = {n: results[n] for n in names if "failed" not in results[n]}
    found = ratios(ok, names)
    results["ratios"] = dict(found)
    if found:
        print_table("ratios, same run and card", [(k, v, "") for k, v in found])
    path = write_result("judge_engines_gpu", results)
    if args.out:
        Path(args.out).write_text(json.dumps(json.loads(path.read_text()), indent=2))
    print("card:", results.get("card", args.device), "| wrote", path, *([args.out] if args.out else []))
    return 0 if len(ok) == len(names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
