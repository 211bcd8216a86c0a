"""Host cost of the judge's verdict grammar per decoding position: the masks of a batch of rows filled by xgrammar
(one row at a time, and its BatchGrammarMatcher on N threads, the transformers engine's default library) and by
llguidance (its LLExecutor on N threads), for the bounded rationale pattern the judge uses on vLLM (a counted repetition,
``[^\n]{1,100}``) and an unbounded one; then the transformers engine's form of the same bound (the unbounded pattern
filled by xgrammar plus its line-length table, ``max_line_chars``). Side by side in one run on this machine's CPU; the
mean and the worst position.

    python -m bench.grammar_fill [--model DIR] [--rows 32] [--threads 1,2,4,8]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from bench.common import print_table, write_result
from judge.engines.hf.grammar import guidance_tokenizer
from judge.engines.hf.line_bound import LineTable
from judge.model_store import resolve_model
from judge.protocol import JudgeSettings, round_constraint, round_regex

_ANSWER = ("Rationale: The analysis names the seeker's core issue and the right stage of support, so it fits here.\n"
           "Verdict: True")


def _time_positions(fill: Callable[[], None], accept: Callable[[int], bool], tokens: list[int]) -> tuple[float, float]:
    """Mean and worst milliseconds of ``fill`` per position, advancing every row by the sample's tokens (after one
    untimed fill: the first call pays one-off set-up, e.g. torch's first CPU op in the line table's restrict)."""
    fill()
    times = []
    for tok in tokens:
        t = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t)
        if not accept(tok):
            raise RuntimeError("the sample answer does not match the grammar")
    return 1000 * sum(times) / len(times), 1000 * max(times)


def fill_ms(xgr: Any, grammar: Any, tokens: list[int], rows: int, vocab: int, threads: int | None,
            lines: LineTable | None = None, max_line: int = 0) -> tuple[float, float]:
    """xgrammar: mean and worst milliseconds per position to fill ``rows`` masks (``threads`` None: row by row);
    with ``lines``, each mask is also held to ``max_line`` bytes per line, as the transformers engine does."""
    matchers = [xgr.GrammarMatcher(grammar) for _ in range(rows)]
    mask = xgr.allocate_token_bitmask(rows, vocab)
    batch = xgr.BatchGrammarMatcher(threads) if threads else None
    every = list(range(rows))
    line_len = [0] * rows

    def fill() -> None:
        if batch is None:
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(mask, i)
        else:
            batch.batch_fill_next_token_bitmask(matchers, mask)
        if lines is not None:
            lines.restrict(mask, every, [max_line - n for n in line_len])

    def accept(tok: int) -> bool:
        advanced = [m.accept_token(tok) for m in matchers]  # every row advances, none skipped
        if lines is not None:
            lines.advance(line_len, every, [tok] * rows)
        return all(advanced)

    return _time_positions(fill, accept, tokens)


def guidance_fill_ms(start: Any, tokens: list[int], rows: int, vocab: int, threads: int) -> tuple[float, float]:
    """llguidance: the same figures, ``rows`` copies of the start-state matcher filled on ``threads`` threads."""
    import llguidance
    import llguidance.torch

    matchers = [start.deep_copy() for _ in range(rows)]
    mask = llguidance.torch.allocate_token_bitmask(rows, vocab)
    executor = llguidance.LLExecutor(threads)
    indexed = [(m, i) for i, m in enumerate(matchers)]

    def accept(tok: int) -> bool:
        advanced = [m.consume_token(tok) for m in matchers]  # every row advances, none skipped
        return all(advanced)

    return _time_positions(lambda: llguidance.torch.fill_next_token_bitmask_par(executor, indexed, mask), accept,
                           tokens)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--threads", default="1,2,4,8")
    args = p.parse_args(argv)
    import llguidance
    import xgrammar as xgr
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model(args.model).path
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    vocab = int(AutoConfig.from_pretrained(path, local_files_only=True).vocab_size)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info)
    lltok = guidance_tokenizer(tok, info, vocab, [tok.eos_token_id])
    # llguidance holds forced text to its own canonical tokens: both libraries read that tokenization
    tokens = lltok.tokenize_str(_ANSWER)
    bounded = round_regex(("step1",), JudgeSettings().rationale_max_chars)
    patterns = {"bounded": bounded, "unbounded": round_regex(("step1",), None)}
    threads = [int(x) for x in args.threads.split(",")]
    results: dict[str, Any] = {"rows": args.rows, "positions": len(tokens), "cpus": len(os.sched_getaffinity(0))}
    rows = []
    for name, pattern in patterns.items():
        grammar = compiler.compile_regex(pattern)
        per_row, worst = fill_ms(xgr, grammar, tokens, args.rows, vocab, None)
        results[f"{name}_per_row_ms"] = per_row
        results[f"{name}_per_row_worst_ms"] = worst
        rows.append((f"{name}, xgrammar one row at a time (ms/position; worst)", per_row, f"{worst:.2f}"))
        start = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_regex(pattern))
        for n in threads:
            ms, worst = fill_ms(xgr, grammar, tokens, args.rows, vocab, n)
            results[f"{name}_batch_{n}_threads_ms"] = ms
            results[f"{name}_batch_{n}_threads_worst_ms"] = worst
            rows.append((f"{name}, xgrammar BatchGrammarMatcher {n} threads (ms/position; worst)", ms,
                         f"{worst:.2f}"))
            gms, gworst = guidance_fill_ms(start, tokens, args.rows, vocab, n)
            results[f"{name}_guidance_{n}_threads_ms"] = gms
            results[f"{name}_guidance_{n}_threads_worst_ms"] = gworst
            results[f"{name}_guidance_vs_xgrammar_{n}_threads"] = ms / gms
            rows.append((f"{name}, llguidance LLExecutor {n} threads (ms/position; worst)", gms, f"{gworst:.2f}"))
            rows.append((f"{name}, {n} threads: xgrammar / llguidance (ratio of ms)", ms / gms, ""))
    # the transformers engine's form of the bound: the unbounded pattern + the line table (max_line_chars)
    unbounded, max_line = round_constraint(("step1",), JudgeSettings().rationale_max_chars, line_bound=True)
    assert max_line is not None
    table = LineTable([bytes(t) for t in info.decoded_vocab], vocab, set(info.special_token_ids))
    grammar = compiler.compile_regex(unbounded)
    for n in threads:
        ms, worst = fill_ms(xgr, grammar, tokens, args.rows, vocab, n, table, max_line)
        results[f"line_bound_batch_{n}_threads_ms"] = ms
        results[f"line_bound_batch_{n}_threads_worst_ms"] = worst
        results[f"bounded_vs_line_bound_{n}_threads"] = results[f"bounded_batch_{n}_threads_ms"] / ms
        rows.append((f"line bound, xgrammar {n} threads + line table (ms/position; worst)", ms, f"{worst:.2f}"))
        rows.append((f"{n} threads: counted bound / line bound (ratio of ms)",
                     results[f"bounded_vs_line_bound_{n}_threads"], ""))
    print_table(f"grammar mask fill, {args.rows} rows, {results['cpus']} CPUs", rows)
    print("wrote", write_result("grammar_fill", results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
