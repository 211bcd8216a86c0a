"""What the GRPO training reward paid for inside each rollout group (issue 26's run of 2026-11-30 and the 1.5B
policy's earlier GRPO runs; numbers quoted in report.md's written notes and in the judge report's "fourth adversarial
round").

    PYTHONPATH=. python docs/evaluations/compeer-loop/qwen15-2026-11-30/within_group.py ../shared/data/esconv/train.json \
        > docs/evaluations/compeer-loop/qwen15-2026-11-30/within_group.txt

Reads the training completions (every completion with its group and reward as GRPO saw them): arms b and c of seeds 0,
1 and 2 in ``inputs/results.tar.xz`` (60 steps each), and the five runs of ``docs/runs/grpo-gpu-2026-11-30-h200-qwen15-policy*/``
(against the shipped judge, seeds 0-2, and against the round-3 and round-4 judges), and since 2026-12-01 the three of
``docs/runs/grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/`` (the same command against the 500-step default, v3). A completion *fits* when the
strategy its ``<strategy>`` part names is of the support stage (``silver.yaml`` ``strategy_stage``) of the strategy
annotated at its round, and is a *misfit* when of another stage (``Others`` and unparsed completions are neither). Per
run, over the pairs of completions of one group with one fit and one misfit: the share where the fitting one got
the higher value (ties half) of the judge's discrete total, its graded total and the reward GRPO used (after
redundancy reweighting); likewise for the named strategy the run collapsed onto against any other; and the share of
groups whose four discrete totals are all equal (nothing but the graded tie-breaks and the reweighting to learn from).
Then, per run and named strategy (30 completions or more), the mean divisor the redundancy reweighting applied to a
positive total (total / reward: (1 + tau s_in)(1 + tau s_hi), paper Eq. 5-7): the higher, the more of the judge's
reward it took away. Last, per run, the share of completions that fit, by quarter of the run's steps.
"""

from __future__ import annotations

import io
import itertools
import json
import lzma
import sys
import tarfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from cer.reasoning import parse
from cer.taxonomy import load_taxonomy, named_strategy
from data_builder.ingest import ingest_files
from data_builder.policy_negatives import strategy_at
from data_builder.silver_text import load_config

HERE = Path(__file__).resolve().parent
RUNS = HERE.parents[2] / "runs"
KEYS = ("total", "graded_total", "reward")


def runs() -> Iterable[tuple[str, str, list[dict]]]:
    """(name, the judge it trained against, completions) of every run."""
    with tarfile.open(HERE / "inputs" / "results.tar.xz") as tar:
        for seed, arm in itertools.product((0, 1, 2), ("b", "c")):
            member = tar.extractfile(f"seed{seed}/{arm}/completions.jsonl")
            assert member is not None
            lines = [json.loads(x) for x in io.TextIOWrapper(member, encoding="utf-8") if x.strip()]
            yield f"loop seed {seed} arm {arm}", "bare base" if arm == "b" else "shipped (v2)", lines
    for folder, judge in (("grpo-gpu-2026-11-30-h200-qwen15-policy/seed0", "shipped (v2)"),
                          ("grpo-gpu-2026-11-30-h200-qwen15-policy/seed1", "shipped (v2)"),
                          ("grpo-gpu-2026-11-30-h200-qwen15-policy/seed2", "shipped (v2)"),
                          ("grpo-gpu-2026-11-30-h200-qwen15-policy-round3-judge/seed0", "round 3"),
                          ("grpo-gpu-2026-11-30-h200-qwen15-policy-round4-judge/seed0", "round 4"),
                          ("grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/seed0", "default (v3)"),
                          ("grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/seed1", "default (v3)"),
                          ("grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/seed2", "default (v3)")):
        with lzma.open(RUNS / folder / "completions-next_step.jsonl.xz", "rt", encoding="utf-8") as fh:
            name = folder.removeprefix("grpo-gpu-2026-11-30-h200-").removeprefix("grpo-gpu-2026-12-01-h200-")
            yield name, judge, [json.loads(x) for x in fh if x.strip()]


def share(pairs: list[tuple[float, float]]) -> str:
    """Share of (a, b) pairs with a > b, ties half."""
    if not pairs:
        return "n/a"
    return f"{sum((a > b) + 0.5 * (a == b) for a, b in pairs) / len(pairs):.3f}"


def main() -> None:
    tax, stage = load_taxonomy(None), load_config().strategy_stage
    dialogues, _ = ingest_files([Path(sys.argv[1])], "esconv")
    turns = {d["id"]: d["turns"] for d in dialogues}

    def annotated(c: dict) -> str | None:
        s = strategy_at(turns[c["dialogue_id"]], c["round_index"])
        return tax.normalise(s) if s else None

    divisors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    fit_by_quarter: dict[str, list[list[bool]]] = {}
    print("run | judge | groups | all four totals equal % | fit-vs-misfit pairs | fit higher: total / graded / "
          "reward | dominant strategy | its pairs | dominant higher: total / reward")
    for name, judge, lines in runs():
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for c in lines:
            groups[(c["call"], c["step"], c["group"], c["dialogue_id"], c["round_index"])].append(c)
        named: dict[int, str | None] = {}
        for c in lines:
            p = parse(c["text"])
            named[id(c)] = named_strategy(p.parts["strategy"] or "", tax) if p.ok else None
        counts = defaultdict(int)
        for c in lines:
            counts[named[id(c)]] += 1
        dominant = max((k for k in counts if k), key=lambda k: counts[k])
        fit_pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in KEYS}
        dom_pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in ("total", "reward")}
        equal = 0
        for g in groups.values():
            totals = {c["total"] for c in g}
            equal += None not in totals and len(totals) == 1
            for a, b in itertools.combinations(g, 2):
                fits = []
                for c in (a, b):
                    n, gold = named[id(c)], annotated(c)
                    fits.append(None if not (n in stage and gold in stage) else stage[n] == stage[gold])
                if None not in fits and fits[0] != fits[1]:
                    good, bad = (a, b) if fits[0] else (b, a)
                    for k in KEYS:
                        if good.get(k) is not None and bad.get(k) is not None:
                            fit_pairs[k].append((good[k], bad[k]))
                na, nb = named[id(a)], named[id(b)]
                if na and nb and (na == dominant) != (nb == dominant):
                    dom, other = (a, b) if na == dominant else (b, a)
                    for k, kept in dom_pairs.items():
                        if dom.get(k) is not None and other.get(k) is not None:
                            kept.append((dom[k], other[k]))
        print(f"{name} | {judge} | {len(groups)} | {100 * equal / len(groups):.0f} | {len(fit_pairs['total'])} | "
              f"{share(fit_pairs['total'])} / {share(fit_pairs['graded_total'])} / {share(fit_pairs['reward'])} | "
              f"{dominant} ({100 * counts[dominant] / len(lines):.0f}%) | {len(dom_pairs['total'])} | "
              f"{share(dom_pairs['total'])} / {share(dom_pairs['reward'])}")
        last = max(int(c["step"]) for c in lines)
        fit_by_quarter[name] = [[], [], [], []]
        for c in lines:
            n, gold = named[id(c)], annotated(c)
            if n in stage and gold in stage:
                fit_by_quarter[name][min(3, (int(c["step"]) - 1) * 4 // last)].append(stage[n] == stage[gold])
        for c in lines:
            if c.get("total") and c["total"] > 0 and c.get("reward"):
                divisors[name][named[id(c)] or "none"].append(c["total"] / c["reward"])
    print("\nrun | completions that fit the annotated moment's stage, % of those that name a staged strategy, "
          "by quarter of the steps")
    for name, shares in fit_by_quarter.items():
        print(f"{name} | " + " / ".join(f"{100 * sum(v) / len(v):.0f}" if v else "n/a" for v in shares))
    print("\nrun | mean reweighting divisor of a positive total, by named strategy (completions), lightest first")
    for name, by in divisors.items():
        cells = sorted((sum(v) / len(v), k, len(v)) for k, v in by.items() if len(v) >= 30)
        print(f"{name} | " + ", ".join(f"{k} {d:.3f} ({n})" for d, k, n in cells))


if __name__ == "__main__":
    main()
