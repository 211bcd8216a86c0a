"""Evaluation throughput: ESC-Eval-style dialogues a minute at concurrency 1 vs 8, side by side in one run.

One transformers engine (the default SmolLM2-135M) plays the model under test, the seeker simulator and the scorer;
both passes run the same cards, each from its own empty call cache, on the already-started engine, so the ratio
measures how well concurrent dialogues batch in the engine. Calls repeated inside a pass (two cards whose dialogues
coincide ask the scorer the same thing) are cache hits, as in a real run; at concurrency 8 such twins may both be in
flight and both generate, so that pass never does less work (the generation counts are reported). Writes ``bench/results/eval_throughput.json``.

    python -m bench.eval_throughput [--cards 8] [--rounds 2] [--max-tokens 24] [--backend transformers|vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, write_result
from evaluator import esc_eval
from evaluator.backends import ChatRole, EnginePool, ModelSpec, Roles, resolve_spec
from evaluator.inputs import load_cards
from evaluator.prompts import load_prompts
from evaluator.runs import RunDir, run_items


async def _pass(pool: EnginePool, spec: ModelSpec, scorer: ModelSpec, workdir: Path, concurrency: int,
                cards: list[Any], rounds: int) -> dict[str, Any]:
    resolved = resolve_spec(spec)
    engine = pool.engine_for(spec, resolved)
    cache = workdir / f"cache-c{concurrency}"
    model, simulator, judge = (ChatRole(r, scorer if r == "scorer" else spec, engine, resolved.identity, cache)
                               for r in ("model", "simulator", "scorer"))
    roles = Roles(model, simulator, judge, pool)
    run = RunDir.open(workdir / f"run-c{concurrency}", esc_eval.HARNESS, {"rounds": rounds})
    prompts, cfg = load_prompts(), esc_eval.EscConfig(rounds=rounds)
    start = time.perf_counter()
    records = await run_items(run, [(c.id, c) for c in cards],
                              lambda c: esc_eval.run_card(c, roles, prompts, cfg), concurrency, f"c={concurrency}")
    wall = time.perf_counter() - start
    generations = sum(r.llm.stats.generations for r in (roles.model, roles.simulator, roles.scorer))
    hits = sum(r.llm.stats.cache_hits for r in (roles.model, roles.simulator, roles.scorer))
    return {"concurrency": concurrency, "dialogues": len(records), "ok": sum(r["status"] == "ok" for r in records),
            "wall_s": wall, "dialogues_per_minute": 60.0 * len(records) / wall, "generations": generations,
            "cache_hits": hits}


async def run(n_cards: int, rounds: int, max_tokens: int, backend: str = "transformers") -> dict[str, Any]:
    """Both passes on one started engine; returns the figures."""
    spec = ModelSpec(backend=backend, max_tokens=max_tokens)
    scorer = ModelSpec(backend=backend, max_tokens=48)
    cards = (load_cards() * ((n_cards + 7) // 8))[:n_cards]
    cards = [type(c)(f"{c.id}-{i}", c.base, c.res, c.source, c.base_biaozhu, c.language) for i, c in enumerate(cards)]
    pool = EnginePool()
    engine = pool.engine_for(spec, resolve_spec(spec))
    t0 = time.perf_counter()
    await engine.start()  # the pooled engine, started once
    start_s = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            one = await _pass(pool, spec, scorer, Path(tmp), 1, cards, rounds)
            eight = await _pass(pool, spec, scorer, Path(tmp), 8, cards, rounds)
    finally:
        await pool.aclose()
    return {"backend": backend, "cards": n_cards, "rounds": rounds, "max_tokens": max_tokens, "engine_start_s": start_s,
            "concurrency_1": one, "concurrency_8": eight,
            "speedup_8_vs_1": eight["dialogues_per_minute"] / one["dialogues_per_minute"],
            "load_avg_1m": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=24, help="model and seeker tokens per turn")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args.cards, args.rounds, args.max_tokens, args.backend))
    path = write_result("eval_throughput", figures)
    print_table(f"ESC-Eval dialogues a minute (default model, {args.backend} engine, one engine for all roles)", [
        ("concurrency 1, dialogues/min", figures["concurrency_1"]["dialogues_per_minute"], ""),
        ("concurrency 8, dialogues/min", figures["concurrency_8"]["dialogues_per_minute"], ""),
        ("speedup_8_vs_1", figures["speedup_8_vs_1"], "> 1: concurrent dialogues batch in the engine"),
        ("generations (cache hits) per pass, 1 / 8",
         (f"{figures['concurrency_1']['generations']} ({figures['concurrency_1']['cache_hits']}) / "
         f"{figures['concurrency_8']['generations']} ({figures['concurrency_8']['cache_hits']})"), ""),
    ])
    print(f"\n-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
