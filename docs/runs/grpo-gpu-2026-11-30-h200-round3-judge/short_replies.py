"""Which reward component pays for short contentless replies (mark ``generic/short_no_content``)?

Samples, from the two seeds of ``grpo-gpu-2026-11-29-h200-one-epoch-256``, rollout groups where a short reply has a
higher logged ``reward`` than an unmarked completion of its group (random with ``--seed``, alternating the seeds),
re-scores each whole group (4 candidates, as the trainer sent them: ``{history, reference, candidates}``, default
options) through ``POST /v1/score`` of a running reward server, writes one compact line per group, then a summary:
CPU-vs-GPU agreement of the discrete total order of the (short, unmarked) pairs, and per component how the short
reply compares where the CPU judge scores it >= the unmarked one. Groups are scored in the sampled order, so a run
cut short is still a random sample; ``--from-jsonl`` re-analyses a written file without a server.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/runs/grpo-gpu-2026-11-30-h200-round3-judge/short_replies.py \\
        http://localhost:8077 --groups 24 --data /tmp/loop-data/grpo_train.jsonl > short_replies.txt
"""
from __future__ import annotations

import argparse
import json
import lzma
import random
import re
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from data_builder.policy_negatives import round_index_of

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "grpo-gpu-2026-11-29-h200-one-epoch-256"
SHORT = "generic/short_no_content"
COMPONENTS = ("step1", "step2", "step3", "preference", "format")


def eligible_groups(seed_dir: Path) -> list[list[dict[str, Any]]]:
    """Groups (lines with one (step, call, group)) where a short reply outscores an unmarked completion."""
    groups: dict[tuple[int, int, int], list[dict[str, Any]]] = defaultdict(list)
    with lzma.open(seed_dir / "completions-next_step.jsonl.xz", "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                c = json.loads(line)
                groups[(c["step"], c["call"], c["group"])].append(c)  # a resumed run counts its calls from 1 again
    out = []
    for g in groups.values():
        plain = [c["reward"] for c in g if c["mark"] is None and c["reward"] is not None]
        if any(c["mark"] == SHORT and c["reward"] is not None and any(c["reward"] > r for r in plain) for c in g):
            out.append(sorted(g, key=lambda c: c["index"]))
    return out


def sample(n: int, seed: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """Up to ``n`` eligible groups, each seed's shuffled with ``seed``, taken alternately from seed0 and seed1."""
    rng = random.Random(seed)
    pools = []
    for name in ("seed0", "seed1"):
        groups = eligible_groups(RUNS / name)
        rng.shuffle(groups)
        pools.append([(name, g) for g in groups])
    mixed = [x for pair in zip(*pools) for x in pair] + [x for p in pools for x in p[min(map(len, pools)):]]
    return mixed[:n]


def post(url: str, body: dict[str, Any], timeout: float = 900.0) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def compact(res: dict[str, Any]) -> dict[str, Any]:
    """A candidate's result: status, discrete/graded components and total, and the verdicts."""
    def comps(rw: dict[str, Any] | None) -> dict[str, float | None]:
        rw = rw or {}
        steps = [s if not isinstance(s, dict) else s.get("value") for s in (rw.get("steps") or [])]
        steps += [None] * (3 - len(steps))
        return {"step1": steps[0], "step2": steps[1], "step3": steps[2], "preference": rw.get("preference"),
                "format": rw.get("format"), "total": rw.get("total")}
    pref = res.get("preference") or {}
    return {"status": res.get("status"), "cpu": comps(res.get("rewards")), "cpu_graded": comps(res.get("graded_rewards")),
            "steps": [s.get("verdict") for s in res.get("steps") or []], "pref": pref.get("verdict"),
            "pref_probs": pref.get("probs"), "format_missing": (res.get("format") or {}).get("missing")}


def score(url: str, n: int, seed: int, data: Path, out: Path, concurrency: int, budget_s: float) -> float:
    rows = {}
    for line in data.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        key = (r["dialogue_id"], round_index_of(r["history"]))
        if key in rows:
            raise SystemExit(f"two prompt rows for {key}")
        rows[key] = r
    print(f"prompt rows: {len(rows)} (unique (dialogue_id, round_index))", file=sys.stderr)
    picked = sample(n, seed)
    t_all = time.perf_counter()

    def one(name: str, g: list[dict[str, Any]]) -> dict[str, Any] | None:
        if time.perf_counter() - t_all > budget_s:  # not started: past the time budget
            return None
        row = rows[(g[0]["dialogue_id"], g[0]["round_index"])]  # KeyError: a completion without its prompt row
        t0 = time.perf_counter()
        resp = post(url.rstrip("/") + "/v1/score", {"history": row["history"], "reference": row["reference"],
                                                  "candidates": [c["text"] for c in g]})
        done = time.perf_counter()
        print(f"{name} call {g[0]['call']} group {g[0]['group']}: {done - t0:.1f} s", file=sys.stderr)
        return {"seed": name, "call": g[0]["call"], "group": g[0]["group"], "dialogue_id": g[0]["dialogue_id"],
                "round_index": g[0]["round_index"], "seconds": round(done - t0, 1), "done_at": round(done - t_all, 1),
                "meta_adapter": resp["meta"].get("adapter"),
                "candidates": [{"index": c["index"], "mark": c["mark"], "gpu_reward": c["reward"],
                                "gpu_total": c["total"], "gpu_graded_total": c["graded_total"],
                                "response": reply_of(c["text"]), **compact(res)} for c, res in zip(g, resp["results"])]}

    with out.open("w", encoding="utf-8") as f, ThreadPoolExecutor(concurrency) as pool:
        for record in pool.map(lambda p: one(*p), picked):  # in sampled order, `concurrency` groups in flight
            if record is not None:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
    return time.perf_counter() - t_all


def reply_of(text: str) -> str:
    m = re.search(r"<response>(.*?)(</response>|$)", text, re.DOTALL)
    return (m.group(1) if m else text).strip()


def sign(x: float) -> str:
    return ">" if x > 0 else "=" if x == 0 else "<"


def analyse(lines: list[dict[str, Any]], info: dict[str, Any], head: str) -> str:
    out = [head, (f"groups scored: {len(lines)} ({dict(Counter(ln['seed'] for ln in lines))}); scoring wall time "
           f"{max([ln.get('done_at', 0) for ln in lines], default=0):.0f} s; latency a group "
           f"{mean([ln['seconds'] for ln in lines])} s (mean)"),
           f"info: {json.dumps(info)}", f"statuses: {Counter(c['status'] for ln in lines for c in ln['candidates'])}"]
    pairs = [(s, u) for ln in lines for s in ln["candidates"] if s["mark"] == SHORT
             for u in ln["candidates"] if u["mark"] is None]
    pairs = [(s, u) for s, u in pairs if s["cpu"]["total"] is not None and u["cpu"]["total"] is not None]
    agree = Counter((sign(s["gpu_total"] - u["gpu_total"]), sign(s["cpu"]["total"] - u["cpu"]["total"])) for s, u in pairs)
    won = [(s, u) for s, u in pairs if s["gpu_reward"] > u["gpu_reward"]]
    out += ["", f"(a) short vs unmarked pairs: {len(pairs)} ({len(won)} where the short one had the higher GPU reward)",
            f"  discrete total order GPU -> CPU (short vs unmarked): {dict(sorted(agree.items()))}",
            (f"  same order: {sum(v for (g, c), v in agree.items() if g == c)}/{len(pairs)}; among the GPU-reward wins: "
            f"{sum(sign(s['gpu_total'] - u['gpu_total']) == sign(s['cpu']['total'] - u['cpu']['total']) for s, u in won)}"
            f"/{len(won)}; GPU total short>=unmarked {sum(s['gpu_total'] >= u['gpu_total'] for s, u in pairs)}, CPU "
            f"{sum(s['cpu']['total'] >= u['cpu']['total'] for s, u in pairs)}"),
            (f"  mean totals short/unmarked: GPU {mean([s['gpu_total'] for s, _ in pairs])}/{mean([u['gpu_total'] for _, u in pairs])}"
            f", CPU {mean([s['cpu']['total'] for s, _ in pairs])}/{mean([u['cpu']['total'] for _, u in pairs])}")]
    ge = [(s, u) for s, u in pairs if s["cpu"]["total"] >= u["cpu"]["total"]]
    out += ["", f"(b) pairs where the CPU judge scores the short reply >= the unmarked one: {len(ge)}",
            "  component: short >, =, < unmarked (discrete) | mean short, mean unmarked | graded mean short, unmarked"]
    for k in COMPONENTS:
        c = Counter(sign(s["cpu"][k] - u["cpu"][k]) for s, u in ge if s["cpu"][k] is not None and u["cpu"][k] is not None)
        out.append(f"  {k:10s} >{c['>']:3d} ={c['=']:3d} <{c['<']:3d} | {mean([s['cpu'][k] for s, _ in ge])}, "
                   f"{mean([u['cpu'][k] for _, u in ge])} | {mean([s['cpu_graded'][k] for s, _ in ge])}, "
                   f"{mean([u['cpu_graded'][k] for _, u in ge])}")
    for label, side in (("short", 0), ("unmarked", 1)):
        uniq = {id(p[side]): p[side] for p in ge}.values()
        out.append(f"  {label} candidates in these pairs ({len(uniq)}): step-3 verdict "
                   f"{dict(Counter(str(c['steps'][2] if len(c['steps']) > 2 else None) for c in uniq))}, preference "
                   f"{dict(Counter(str(c['pref']) for c in uniq))}, steps 1/2 True "
                   f"{sum(c['steps'][:1] == [True] for c in uniq)}/{sum(c['steps'][1:2] == [True] for c in uniq)}")
    shorts = [c for ln in lines for c in ln["candidates"] if c["mark"] == SHORT]
    plains = [c for ln in lines for c in ln["candidates"] if c["mark"] is None]
    for label, cs in (("all short", shorts), ("all unmarked", plains)):
        out.append(f"  {label} ({len(cs)}): mean " + ", ".join(f"{k} {mean([c['cpu'][k] for c in cs])}" for k in COMPONENTS)
                   + f"; preference {dict(Counter(str(c['pref']) for c in cs))}")
    out += ["", "(c) examples (short | unmarked; CPU discrete s1 s2 s3 pref fmt = total; GPU total)"]
    for s, u in random.Random(0).sample(ge, min(5, len(ge))):
        for tag, c in (("short", s), ("unmarked", u)):
            v = c["cpu"]
            out.append(f"  {tag:8s} {v['step1']} {v['step2']} {v['step3']} {v['preference']} {v['format']} = {v['total']}"
                       f" (GPU {c['gpu_total']}, pref {c['pref']}): {c['response'][:150]!r}")
        out.append("")
    return "\n".join(out)


def mean(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 2) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", nargs="?", help="the running reward server, e.g. http://localhost:8077")
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=Path("/tmp/loop-data/grpo_train.jsonl"))
    ap.add_argument("--out", type=Path, default=HERE / "short_replies.jsonl")
    ap.add_argument("--concurrency", type=int, default=2, help="groups in flight (each its own request)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no group after this many seconds")
    ap.add_argument("--from-jsonl", action="store_true", help="only analyse --out (no server)")
    ap.add_argument("--server-cmd", default="", help="the server's command line, for the summary's header")
    a = ap.parse_args()
    info: dict[str, Any] = {}
    if not a.from_jsonl:
        if not a.url:
            ap.error("a server URL is needed unless --from-jsonl")
        with urllib.request.urlopen(a.url.rstrip("/") + "/v1/info", timeout=30) as r:
            info = json.loads(r.read())
        wall = score(a.url, a.groups, a.seed, a.data, a.out, a.concurrency, a.budget_s)
        print(f"scoring wall time {wall:.0f} s", file=sys.stderr)
    lines = [json.loads(x) for x in a.out.read_text(encoding="utf-8").splitlines() if x.strip()]
    if not info:
        info = {"adapter (from meta)": lines[0]["meta_adapter"] if lines else None}
    print(analyse(lines, info, f"server: {a.server_cmd}" if a.server_cmd else "short_replies.py"))


if __name__ == "__main__":
    main()
