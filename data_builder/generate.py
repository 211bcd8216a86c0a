"""Stage 4, generate: for each sampled round an LLM writes the three reasoning steps and a reply (CER format).

The prompt is exactly the policy's (:func:`cer.policy_prompt.policy_messages` of the round's history), so the
generated data matches what the policy is later trained to write. An output is accepted when
:func:`cer.reasoning.parse` finds all four parts; otherwise it is re-generated up to ``--max-retries`` times
and then written to ``failed.jsonl`` with its status: a failed generation is never patched or invented.
Outputs: ``generations.jsonl`` (``record: generation``: the round plus ``candidate``, the CER text re-rendered
by :func:`cer.reasoning.render`, and ``strategy_named``, the taxonomy strategy step 3 names, if any).
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from cer.policy_prompt import policy_messages
from cer.reasoning import PARTS, parse, render
from cer.taxonomy import Taxonomy, load_taxonomy, named_strategy
from data_builder.llm import LLM, add_llm_options, default_llm_factory, map_bounded, settings_from_args
from data_builder.records import GENERATION, ROUND, Record, read_records, turns_of, write_jsonl
from data_builder.stage import StageRun, add_common, limited
from judge.engines.base import GenParams

#: Structured-output pattern of a CER output; sent with ``--constrain`` (engines without regex support ignore it).
CER_REGEX = (r"<analysis>[^<>]{1,600}</analysis>\n<emotion>[^<>]{1,300}</emotion>\n"
             r"<strategy>[^<>]{1,400}</strategy>\n<response>[^<>]{1,800}</response>")


def valid_cer(text: str) -> str | None:
    """The canonical CER text when ``text`` has all four parts well formed, else None."""
    parsed = parse(text)
    if not parsed.ok:
        return None
    return render({p: parsed.parts[p] or "" for p in PARTS})


async def generate_rounds(llm: LLM, rounds: list[Record], taxonomy: Taxonomy, max_tokens: int,
                          temperature: float, concurrency: int, constrain: bool = False) -> list[Record]:
    """One generation record per round; ``status`` is ``ok`` (with ``candidate``) or ``failed``."""
    params = GenParams(max_tokens=max_tokens, temperature=temperature, regex=CER_REGEX if constrain else None)

    async def one(r: Record) -> Record:
        c = await llm.complete(policy_messages(turns_of(r["history"]), taxonomy), params, valid_cer,
                               request_id=f"gen-{r['dialogue_id']}-{r['round_index']}")
        out = {**r, "record": GENERATION, "candidate": c.value, "attempts": c.attempts,
               "status": "ok" if c.ok else "failed"}
        if c.value is not None:
            out["strategy_named"] = named_strategy(parse(c.value).parts["strategy"] or "", taxonomy)
        else:
            out["error"] = c.error
        return out

    try:
        return await map_bounded(rounds, one, concurrency, "generate")
    finally:
        await llm.aclose()


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data generate``."""
    p = sub.add_parser("generate", help="LLM-written 3-step reasoning + reply per sampled round",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    add_llm_options(p)
    p.add_argument("--max-tokens", type=int, default=320, help="generation budget per round")
    p.add_argument("--temperature", type=float, default=0.0, help="first-attempt temperature (retries go higher)")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.add_argument("--constrain", action="store_true",
                   help="send CER_REGEX as a structured-output constraint (vllm, or openai with regex support); "
                        "the output is still parsed and retried like any other")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, llm_factory: Any = None, **_: Any) -> int:
    """Execute the generate stage."""
    settings = settings_from_args(args)
    st = StageRun("generate", args.out, argv, list(args.inputs),
                  params={"backend": settings.backend, "model": settings.model, "max_tokens": args.max_tokens,
                          "temperature": args.temperature, "max_retries": settings.max_retries, "limit": args.limit,
                          "constrain": args.constrain})
    rounds = limited(read_records([Path(p) for p in args.inputs], (ROUND,)), args.limit)
    llm = (llm_factory or default_llm_factory)(settings)
    gens = asyncio.run(generate_rounds(llm, rounds, load_taxonomy(args.taxonomy), args.max_tokens, args.temperature,
                                       settings.concurrency, args.constrain))
    ok = [g for g in gens if g["status"] == "ok"]
    failed = [g for g in gens if g["status"] != "ok"]
    write_jsonl(st.path("generations.jsonl"), ok)
    write_jsonl(st.path("failed.jsonl"), failed)
    named = Counter(g.get("strategy_named") or "none" for g in ok)
    st.counts = {"rounds": len(rounds), "generated": len(ok), "failed": len(failed),
                 "strategy_named": dict(sorted(named.items())),
                 "strategy_matches_gold": sum(1 for g in ok if g.get("strategy") and g.get("strategy_named") == g["strategy"]),
                 "llm": llm.stats.as_dict()}
    st.finish(quiet=args.quiet)
    return 0
