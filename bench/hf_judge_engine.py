"""The transformers judge engine on one device: how long one GRPO step's judging takes (``--groups`` x
``--group-size`` candidates, unified mode, constrained verdict lines) with the dynamic KV cache and with the
static (compiled) cache, side by side in one run, against plain batched ``model.generate`` of the same round
prompts (the hand-written baseline: one call per round, no grammar, no micro-batcher). Configurations name the
engine options: the grammar backend is xgrammar unless the name says guidance (llguidance); the rationale's
100-character bound is the engine's line bound (``max_line_chars``) unless the name says counted (the counted
repetition in the regex, as on vLLM).

    python -m bench.hf_judge_engine --model DIR [--device cuda] [--groups 8] [--group-size 4] [--steps 4]

Each configuration starts its own engine (start time includes its compile warm-up), judges ``--steps`` sets of
fresh groups (the first set is also timed but reported apart, as ``first_step_s``), and reports the median step
wall time, generate() calls per step, mean rows per call, decoding positions per call, milliseconds per decoding
position, and the share of candidates whose every verdict parsed. Writes bench/results/hf_judge_engine.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench.common import print_table, write_result
from bench.judge_throughput import RecordingEngine, make_groups
from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from judge.conversation import Judge
from judge.engines.base import EngineConfig, Message
from judge.engines.hf.engine import TransformersEngine
from judge.engines.settings import TransformersSettings
from judge.model_store import resolve_model
from judge.protocol import JudgeSettings, load_template

# configuration name -> TransformersSettings fields (besides max_batch and max_wait_ms) and EngineConfig.rationale_bound
CONFIGS: dict[str, dict[str, Any]] = {
    "dynamic": {},
    "static": {"static_cache": True},
    "static-torch-native": {"static_cache": True, "grammar_kernel": "torch_native"},
    "static-guidance": {"static_cache": True, "grammar_backend": "guidance"},
    # the counted bound as the engine ran it before the line bound: masks filled on 8 threads
    "static-counted": {"static_cache": True, "rationale_bound": "counted", "grammar_threads": 8},
    "dynamic-counted": {"rationale_bound": "counted", "grammar_threads": 8},
}
# ratio name -> (slower configuration, faster configuration, note): printed when both ran
SPEED_RATIOS: dict[str, tuple[str, str, str]] = {
    "static_vs_dynamic": ("dynamic", "static", ""),
    "guidance_vs_xgrammar": ("static", "static-guidance", ", static cache; xgrammar is the default"),
    "line_bound_vs_counted_static": ("static-counted", "static", "; the line bound is the default"),
    "line_bound_vs_counted_dynamic": ("dynamic-counted", "dynamic", "; the line bound is the default"),
}


async def engine_phase(model_path: str, device: str, name: str, args: argparse.Namespace
                       ) -> tuple[dict[str, Any], list[list[list[Message]]]]:
    """Judge ``args.steps`` fresh sets through one engine; returns figures and, per step, each round's prompts."""
    fields = dict(CONFIGS[name])
    bound = fields.pop("rationale_bound", "auto")
    settings = TransformersSettings(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, **fields)
    config = EngineConfig(backend="transformers", model_path=model_path, device=device, dtype="auto",
                          transformers=settings, rationale_bound=bound)
    inner = TransformersEngine(config)
    engine = RecordingEngine(inner)
    t = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - t
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings())
    walls, calls, rows, positions, step_positions, parsed_ok, n = [], [], [], [], [], 0, 0
    rounds_by_step: list[list[list[Message]]] = []
    timing_lists = {"prep_ms_per_call": inner.stats.prep_s, "generate_ms_per_call": inner.stats.generate_s,
                    "prefill_ms_per_call": inner.stats.prefill_s,
                    "first_decode_ms_per_call": inner.stats.first_decode_s,
                    "device_wait_ms_per_position": inner.stats.device_wait_s,
                    "mask_host_ms_per_position": inner.stats.mask_host_s,
                    "loop_host_ms_per_position": inner.stats.loop_host_s}
    steady_from: dict[str, int] = {}  # each timing list's length when the steady (second) step began
    for step in range(args.steps):
        if step == 1:
            steady_from = {k: len(v) for k, v in timing_lists.items()}
        groups = make_groups(args.groups, args.group_size, seed=1000 + step)
        jobs = [(g.history, g.reference, parse(c), JudgeMode.UNIFIED) for g in groups for c in g.candidates]
        engine.sequences = {}
        b0, z0, s0 = inner.stats.batches, len(inner.stats.batch_sizes), len(inner.stats.decode_steps)
        t = time.perf_counter()
        judgments = await asyncio.gather(*(judge.judge(*j) for j in jobs))
        walls.append(time.perf_counter() - t)
        calls.append(inner.stats.batches - b0)
        rows.extend(inner.stats.batch_sizes[z0:])
        positions.extend(inner.stats.decode_steps[s0:])
        step_positions.append(sum(inner.stats.decode_steps[s0:]))
        parsed_ok += sum(1 for j in judgments if all(j.verdicts.get(c) is not None for c in j.judged))
        n += len(judgments)
        seqs = list(engine.sequences.values())
        rounds_by_step.append([seq[r][0] for r in range(min(len(s) for s in seqs)) for seq in seqs])
    await engine.stop()
    steady = walls[1:]
    steady_positions = sum(step_positions[1:]) or 1
    breakdown: dict[str, float] = {}
    for k, values in timing_lists.items():
        tail = values[steady_from[k]:]
        if tail:
            breakdown[k] = 1000 * (statistics.mean(tail) if k.endswith("_per_call") else sum(tail) / steady_positions)
    figures = {
        "start_s": start_s,
        "first_step_s": walls[0],
        "step_s_median": statistics.median(steady),
        "generate_calls_per_step": statistics.mean(calls),
        "rows_per_call_mean": statistics.mean(rows),
        "positions_per_call_mean": statistics.mean(positions),
        "ms_per_position": 1000 * sum(steady) / steady_positions,
        "all_verdicts_parsed": parsed_ok / n,
        "untapped_positions": inner.stats.untapped_positions,
        **breakdown,
    }
    return figures, rounds_by_step


def plain_generate_phase(model_path: str, device: str, rounds: list[list[Message]], per_round: int) -> float:
    """Plain batched ``model.generate`` of one step's round prompts: one call per round (greedy, 96 new tokens,
    dynamic cache, no grammar). A real judge needs round k's answer in round k+1's prompt, so this is a floor, not
    a judge. Returns the wall time of the step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judge.device import resolve_device_dtype

    dev, dtype = resolve_device_dtype(device, "auto")
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, local_files_only=True)
    model = model.to(dev).eval()
    chunks = [rounds[i:i + per_round] for i in range(0, len(rounds), per_round)]

    def run(chunk: list[list[Message]]) -> None:
        texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)  # type: ignore[arg-type]
                 for m in chunk]
        enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt").to(dev)
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id)

    run(chunks[0])  # warm-up
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for chunk in chunks:
        run(chunk)
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="HF folder of the judge (default: the embedded SmolLM2)")
    p.add_argument("--device", default="auto")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="sets of fresh groups per configuration (>= 2)")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--configs", default="dynamic,static", help=f"comma list of {', '.join(CONFIGS)}")
    args = p.parse_args(argv)
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        p.error(f"--configs: unknown {', '.join(sorted(unknown))}; expected {', '.join(CONFIGS)}")
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first set is reported apart)")
    model_path = resolve_model(args.model).path
    results: dict[str, Any] = {"groups": args.groups, "group_size": args.group_size, "steps": args.steps}
    rounds: list[list[Message]] = []
    for name in args.configs.split(","):
        figures, by_step = asyncio.run(engine_phase(model_path, args.device, name, args))
        results[name] = figures
        rounds = rounds or by_step[-1]
        print_table(f"transformers engine, {name} cache", [(k, v, "") for k, v in figures.items()])
    plain = plain_generate_phase(model_path, args.device, rounds, args.groups * args.group_size)
    results["plain_generate_step_s"] = plain
    rows = [("plain_generate_step_s (floor: no grammar, no round dependency)", plain, "")]
    for name in args.configs.split(","):
        ratio = plain / results[name]["step_s_median"]
        results[f"{name}_vs_plain_generate"] = ratio
        rows.append((f"{name}_vs_plain_generate (speed ratio)", ratio, ""))
    for name, (slower, faster, note) in SPEED_RATIOS.items():
        if slower in results and faster in results:
            results[name] = results[slower]["step_s_median"] / results[faster]["step_s_median"]
            rows.append((f"{name} (speed ratio{note})", results[name], ""))
    print_table("one GRPO step's judging", rows)
    print("wrote", write_result("hf_judge_engine", results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
