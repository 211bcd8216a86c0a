"""Stage 3, sample: Eq.1 Gaussian sparse sampling of rounds → ``rounds.jsonl``.

A *round* is a supporter reply that follows a seeker turn: a maximal block of consecutive supporter turns
right after a seeker turn. Round ``i`` (1-based, ``i = 1..Nr``) has as ``history`` every turn before the
block (so it ends with a seeker turn) and as ``reference`` the block's first supporter turn, whose gold
strategy is the round's ``strategy``. For a dialogue of ``Nr`` rounds, ``Ns = min(--rounds, Nr)`` unique
rounds are drawn with

    p(i) = exp(-(i - mu)^2 / (2 sigma^2)) / sum_j exp(-(j - mu)^2 / (2 sigma^2)),  mu = Nr/2, sigma = Nr/4,

one at a time without replacement (each draw renormalises p over the rounds not yet drawn), then put back
in dialogue order. The generator of each dialogue is seeded from ``--seed`` and the dialogue id, so the
result does not depend on file order or ``--limit``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from data_builder.records import DIALOGUE, ROUND, Record, read_records, write_jsonl
from data_builder.stage import StageRun, add_common, limited, progress, stable_seed


def gaussian_weights(nr: int) -> np.ndarray:
    """Eq.1 probabilities p(i) for rounds i = 1..nr (mu = nr/2, sigma = nr/4)."""
    if nr < 1:
        raise ValueError("a dialogue needs at least one round")
    i = np.arange(1, nr + 1, dtype=np.float64)
    mu, sigma = nr / 2.0, nr / 4.0
    w = np.exp(-((i - mu) ** 2) / (2.0 * sigma**2))
    return w / w.sum()


def sample_rounds(nr: int, ns: int, rng: np.random.Generator) -> list[int]:
    """Eq.1: ``min(ns, nr)`` unique 1-based round indices, drawn without replacement, in dialogue order."""
    if ns < 1:
        raise ValueError("ns must be >= 1")
    k = min(ns, nr)
    picked = rng.choice(nr, size=k, replace=False, p=gaussian_weights(nr))
    return sorted(int(x) + 1 for x in picked)


def dialogue_rng(seed: int, dialogue_id: str) -> np.random.Generator:
    """The seeded generator of one dialogue (independent of the order dialogues come in)."""
    return np.random.default_rng(stable_seed("sample", seed, dialogue_id))


def rounds_of(turns: list[dict[str, Any]]) -> list[int]:
    """Turn indices that start a round: a supporter turn right after a seeker turn."""
    return [j for j in range(1, len(turns)) if turns[j]["role"] == "supporter" and turns[j - 1]["role"] == "seeker"]


def make_round(dialogue: Record, starts: list[int], index: int) -> Record:
    """The ``round`` record of 1-based round ``index`` of a dialogue."""
    j = starts[index - 1]
    turns = dialogue["turns"]
    return {
        "record": ROUND,
        "dialogue_id": dialogue["id"],
        "origin": dialogue.get("origin", "original"),
        "lang": dialogue.get("lang", "en"),
        "round_index": index,
        "num_rounds": len(starts),
        "turn_index": j,
        "history": [{"role": t["role"], "text": t["text"]} for t in turns[:j]],
        "reference": turns[j]["text"],
        "strategy": turns[j].get("strategy"),
        "meta": dialogue.get("meta", {}),
    }


def sample_dialogues(dialogues: list[Record], rounds_per_dialogue: int, seed: int) -> tuple[list[Record], Counter[str]]:
    """Sampled round records of all dialogues (in input order) and counts."""
    counts: Counter[str] = Counter()
    out: list[Record] = []
    for d in progress(dialogues, "sample"):
        counts["dialogues"] += 1
        starts = rounds_of(d["turns"])
        if not starts:
            counts["dialogues_without_rounds"] += 1
            continue
        counts["rounds_available"] += len(starts)
        for idx in sample_rounds(len(starts), rounds_per_dialogue, dialogue_rng(seed, d["id"])):
            out.append(make_round(d, starts, idx))
        counts["rounds_sampled"] = len(out)
    return out, counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data sample``."""
    p = sub.add_parser("sample", help="Eq.1 Gaussian round sampling", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--rounds", type=int, default=3, help="Ns, rounds sampled per dialogue (default 3)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the sample stage."""
    if args.rounds < 1:
        raise ValueError("--rounds must be >= 1")
    st = StageRun("sample", args.out, argv, list(args.inputs),
                  params={"rounds": args.rounds, "seed": args.seed, "limit": args.limit})
    dialogues = limited(read_records([Path(p) for p in args.inputs], (DIALOGUE,)), args.limit)
    rounds, counts = sample_dialogues(dialogues, args.rounds, args.seed)
    write_jsonl(st.path("rounds.jsonl"), rounds)
    counts["rounds_with_strategy"] = sum(1 for r in rounds if r["strategy"])
    st.counts = {"dialogues": counts["dialogues"], "dialogues_without_rounds": counts["dialogues_without_rounds"],
                 "rounds_available": counts["rounds_available"], "rounds_sampled": len(rounds),
                 "rounds_with_strategy": counts["rounds_with_strategy"]}
    st.finish(quiet=args.quiet)
    return 0
