"""Host cost of the judge's verdict grammar per decoding position: xgrammar mask fills for a batch of rows, one row
at a time vs xgrammar's BatchGrammarMatcher on N threads, for the bounded rationale pattern the judge uses and an
unbounded one. Side by side in one run on this machine's CPU.

    python -m bench.grammar_fill [--model DIR] [--rows 32] [--threads 1,2,4,8]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.common import print_table, write_result
from reward_server.judge import JudgeSettings, round_regex
from reward_server.model_store import resolve_model

_ANSWER = ("Rationale: The analysis names the seeker's core issue and the right stage of support, so it fits here.\n"
           "Verdict: True")


def fill_ms(xgr: Any, grammar: Any, tokens: list[int], rows: int, vocab: int, threads: int | None) -> float:
    """Mean milliseconds per position to fill ``rows`` masks (``threads`` None: one matcher call per row)."""
    matchers = [xgr.GrammarMatcher(grammar) for _ in range(rows)]
    mask = xgr.allocate_token_bitmask(rows, vocab)
    batch = xgr.BatchGrammarMatcher(threads) if threads else None
    total = 0.0
    for tok in tokens:
        t = time.perf_counter()
        if batch is None:
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(mask, i)
        else:
            batch.batch_fill_next_token_bitmask(matchers, mask)
        total += time.perf_counter() - t
        for m in matchers:
            if not m.accept_token(tok):
                raise RuntimeError("the sample answer does not match the grammar")
    return 1000 * total / len(tokens)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--threads", default="1,2,4,8")
    args = p.parse_args(argv)
    import xgrammar as xgr
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model(args.model).path
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    vocab = int(AutoConfig.from_pretrained(path, local_files_only=True).vocab_size)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab,
                                                                      stop_token_ids=[tok.eos_token_id]))
    tokens = tok(_ANSWER, add_special_tokens=False)["input_ids"]
    bounded = round_regex(("step1",), JudgeSettings().rationale_max_chars)
    patterns = {"bounded": bounded, "unbounded": bounded.replace(
        f"{{1,{JudgeSettings().rationale_max_chars}}}", "+")}
    results: dict[str, Any] = {"rows": args.rows, "positions": len(tokens), "cpus": len(os.sched_getaffinity(0))}
    rows = []
    for name, pattern in patterns.items():
        grammar = compiler.compile_regex(pattern)
        per_row = fill_ms(xgr, grammar, tokens, args.rows, vocab, None)
        results[f"{name}_per_row_ms"] = per_row
        rows.append((f"{name}: one call per row (ms/position)", per_row, ""))
        for n in [int(x) for x in args.threads.split(",")]:
            ms = fill_ms(xgr, grammar, tokens, args.rows, vocab, n)
            results[f"{name}_batch_{n}_threads_ms"] = ms
            rows.append((f"{name}: BatchGrammarMatcher, {n} threads (ms/position)", ms, f"x{per_row / ms:.2f}"))
    print_table(f"xgrammar mask fill, {args.rows} rows, {results['cpus']} CPUs", rows)
    print("wrote", write_result("grammar_fill", results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
