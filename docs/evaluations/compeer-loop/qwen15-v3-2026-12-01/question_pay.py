"""Does the training judge (v3) pay more for a reply that names *Question*, on valid prompts, off the GRPO groups?
Paired by prompt: the prompts where exactly one of (a) and (c) names Question (both format-valid, both judged, both
scored by the independent scorer); per pair the Question reply's preference reward, total and independent win minus
the other reply's, with a bootstrap 95% interval over pairs; split by whether the annotated strategy is Question.
    python question_pay.py SEED0      # a loop folder with eval/a and eval/c (inputs/results.tar.xz)"""
import json
import random
import statistics as st
import sys
from pathlib import Path


def records(root: Path, arm: str) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (root / "eval" / arm / "records.jsonl").open())}


def usable(r: dict) -> bool:
    return r.get("judge_status") == "ok" and bool(r.get("format_ok")) and r.get("independent_status") == "ok"


def ci(d: list[float]) -> str:
    rng = random.Random(0)
    boots = sorted(st.mean(rng.choice(d) for _ in d) for _ in range(2000))
    return f"{st.mean(d):+.3f} [{boots[50]:+.3f}, {boots[1949]:+.3f}]"


root = Path(sys.argv[1])
A, C = records(root, "a"), records(root, "c")
pairs = []
for k, a in A.items():
    c = C.get(k)
    if c is None or not (usable(a) and usable(c)):
        continue
    qa, qc = a.get("strategy") == "Question", c.get("strategy") == "Question"
    if qa == qc:
        continue
    q, o = (a, c) if qa else (c, a)
    pairs.append({"pref": q["reward_preference"] - o["reward_preference"], "total": q["reward_total"] - o["reward_total"],
                  "indep": q["independent_win"] - o["independent_win"],
                  "words": len(q["text"].split()) - len(o["text"].split()),
                  "gold_question": q.get("gold_strategy") == "Question"})
for name, keep in (("all", lambda p: True), ("annotated not Question", lambda p: not p["gold_question"]),
                   ("annotated Question", lambda p: p["gold_question"])):
    s = [p for p in pairs if keep(p)]
    print(f"{name} (n {len(s)}): Question reply minus the other, preference {ci([p['pref'] for p in s])}, "
          f"total {ci([p['total'] for p in s])}, independent win {ci([p['indep'] for p in s])}, "
          f"words {st.mean(p['words'] for p in s):+.1f}")
