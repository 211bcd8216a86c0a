"""What the trained judge pays for, per named strategy, and how GRPO moved the named strategies (issue 26's run of
2026-11-30; numbers quoted in report.md's written notes).

    .venv/bin/python docs/evaluations/compeer-loop/qwen15-2026-11-30/strategies.py > docs/evaluations/compeer-loop/qwen15-2026-11-30/strategies.txt

Reads ``inputs/results.tar.xz`` (parts 1 and 3: seed 0's evaluation records; part 2: every seed's training
completions). Part 1: for each policy's
format-valid, judged replies, grouped by the strategy the reply names and whether that is the round's annotated
strategy, the trained judge's preference reward against the real supporter reply (+1 the candidate better, -1 the real
reply better), its mean step reward and the reply's length in words. Part 2: the strategy each GRPO training
completion names (:func:`named`: the project's rule), per quarter of the 60 steps. Part 3: the
independent scorer's win share against the real reply by the reply's length relative to the real reply's (words):
shorter than 0.67x, within 0.67-1.5x ("matched"), longer than 1.5x.
"""

from __future__ import annotations

import io
import json
import statistics
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

from cer.reasoning import parse
from cer.taxonomy import load_taxonomy, named_strategy

HERE = Path(__file__).resolve().parent
TAXONOMY = load_taxonomy()


def read(tar: tarfile.TarFile, name: str) -> list[dict]:
    member = tar.extractfile(name)
    assert member is not None, name
    return [json.loads(line) for line in io.TextIOWrapper(member, encoding="utf-8") if line.strip()]


def named(text: str) -> str:
    """The strategy a completion names, by the project's one rule (as the loop's evaluation records it:
    :func:`cer.taxonomy.named_strategy` on the parsed ``<strategy>`` part); ``none`` when it names none."""
    part = parse(text).parts["strategy"]
    return (named_strategy(part, TAXONOMY) if part else None) or "none"


def main() -> None:
    with tarfile.open(HERE / "inputs" / "results.tar.xz") as tar:
        print("policy | named strategy | annotated? | replies | preference (mean) | steps (mean) | words (mean)")
        for policy in ("a", "b", "c"):
            groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
            for r in read(tar, f"seed0/eval/{policy}/records.jsonl"):
                if r.get("judge_status") == "ok" and r.get("format_ok"):
                    s = r.get("strategy") or "none"
                    groups[(s, "annotated" if s == r.get("gold_strategy") else "other")].append(r)
            for (s, gold), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                if len(rs) < 5:
                    continue
                print(f"({policy}) | {s} | {gold} | {len(rs)} | "
                      f"{statistics.mean(r['reward_preference'] for r in rs):.2f} | "
                      f"{statistics.mean(r.get('reward_steps_mean') or 0.0 for r in rs):.2f} | "
                      f"{statistics.mean(len(r['text'].split()) for r in rs):.1f}")
        print()
        for seed in (0, 1, 2):
            for arm in ("b", "c"):
                by: dict[int, Counter] = defaultdict(Counter)
                for r in read(tar, f"seed{seed}/{arm}/completions.jsonl"):
                    by[min(3, (int(r.get("step", 1)) - 1) * 4 // 60)][named(r["text"])] += 1
                for q in sorted(by):
                    n = sum(by[q].values())
                    top = ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in by[q].most_common(3))
                    print(f"seed {seed} ({arm}) steps quarter {q + 1}: {n} completions; {top}")
        print()
        by_length(tar)


def by_length(tar: tarfile.TarFile) -> None:
    print("policy | replies scored | win share | matched length (0.67-1.5x): n, win | shorter: n, win | longer: n, win")
    for policy in ("base", "a", "b", "c"):
        rs = [r for r in read(tar, f"seed0/eval/{policy}/records.jsonl") if r.get("independent_status") == "ok"]
        bands: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            ratio = len(r["text"].split()) / max(1, len(r["reference"].split()))
            band = "shorter" if ratio < 0.67 else "longer" if ratio > 1.5 else "matched"
            bands[band].append(float(r["independent_win"]))
        cells = " | ".join(f"{len(bands[b])}, {statistics.mean(bands[b]):.2f}" if bands[b] else "0, n/a"
                           for b in ("matched", "shorter", "longer"))
        print(f"({policy}) | {len(rs)} | {statistics.mean(float(r['independent_win']) for r in rs):.2f} | {cells}")


if __name__ == "__main__":
    main()
