"""Does the training judge (v3) pay more for a reply that names *Question*, on valid prompts, off the GRPO groups?
Paired by prompt: the prompts where exactly one of (a) and (c) names Question (both format-valid, both judged, both
scored by the independent scorer); the Question reply's preference reward, total and independent win against the
other reply's, with the loop report's ``compeer_loop.stats.paired_difference`` (paired bootstrap 95% interval over
prompts, sign-flip permutation p); split by whether the annotated strategy is Question.
    PYTHONPATH=. python docs/evaluations/compeer-loop/qwen15-v3-2026-12-01/question_pay.py SEED0
    # a loop folder with eval/a and eval/c (inputs/results.tar.xz)"""
import statistics as st
import sys
from pathlib import Path

from compeer_loop.prompts import read_jsonl
from compeer_loop.stats import paired_difference

SCORES = {"preference": "reward_preference", "total": "reward_total", "independent win": "independent_win"}


def records(root: Path, arm: str) -> dict[str, dict]:
    return {r["id"]: r for r in read_jsonl(root / "eval" / arm / "records.jsonl")}


def usable(r: dict) -> bool:
    return r.get("judge_status") == "ok" and bool(r.get("format_ok")) and r.get("independent_status") == "ok"


root = Path(sys.argv[1])
A, C = records(root, "a"), records(root, "c")
pairs = {}  # prompt id -> (the reply naming Question, the other)
for k, a in A.items():
    c = C.get(k)
    if c is not None and usable(a) and usable(c) and (a.get("strategy") == "Question") != (c.get("strategy") == "Question"):
        pairs[k] = (a, c) if a.get("strategy") == "Question" else (c, a)
for name, keep in (("all", lambda q: True), ("annotated not Question", lambda q: q.get("gold_strategy") != "Question"),
                   ("annotated Question", lambda q: q.get("gold_strategy") == "Question")):
    sel = {k: p for k, p in pairs.items() if keep(p[0])}
    parts = []
    for label, field in SCORES.items():
        d = paired_difference({k: q[field] for k, (q, _) in sel.items()}, {k: o[field] for k, (_, o) in sel.items()})
        parts.append(f"{label} {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] (p {d['p']:.4f})")
    words = st.mean(len(q["text"].split()) - len(o["text"].split()) for q, o in sel.values())
    print(f"{name} (n {len(sel)}): Question reply minus the other, {', '.join(parts)}, words {words:+.1f}")
