"""Paired comparison of two judge-eval runs on the same items: per component the accuracy of each, the difference
with a paired bootstrap 95% interval over items, the exact McNemar p (binomial test on discordant items), the
share of items where the two runs gave the same verdict (agreement, whatever the gold label), and for the step
components the same paired test on the gold-False items alone (False recall, the issue's step-3 goal).
    PYTHONPATH=. python docs/evaluations/judge-esconv/qwen15/adversarial-200/paired.py JUDGE_SFT_DIR/unified \
        A/predictions.jsonl B/predictions.jsonl [OUT.json]      # from the repository root"""
import json
import random
import sys

from datasets import load_from_disk
from scipy.stats import binomtest

from reward_trainer.predict import gold_of, item_key

data, a_path, b_path = sys.argv[1:4]
dsd = load_from_disk(data)
gold = {}
for row in dsd["heldout"]:
    g = gold_of(row["labels"])
    gold[item_key(row["dialogue_id"], row["candidate"])] = {k: str(getattr(v, "value", v)) for k, v in g.items()}
def preds(p):
    return {r["key"]: r["verdicts"] for r in map(json.loads, open(p)) if r.get("variant") == "unified"}
A, B = preds(a_path), preds(b_path)
keys = [k for k in A if k in B]
print(f"items in both: {len(keys)}")
rng = random.Random(0)
out = {}
for comp in ("step1", "step2", "step3", "preference"):
    ks = [k for k in keys if comp in gold.get(k, {})]
    ca = [A[k].get(comp) == gold[k][comp] for k in ks]
    cb = [B[k].get(comp) == gold[k][comp] for k in ks]
    n = len(ks); d = [x - y for x, y in zip(ca, cb)]
    boots = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(5000))
    b10 = sum(1 for x, y in zip(ca, cb) if x and not y); b01 = sum(1 for x, y in zip(ca, cb) if y and not x)
    p = binomtest(b10, b10 + b01).pvalue if b10 + b01 else 1.0
    same = sum(1 for k in ks if A[k].get(comp) is not None and A[k].get(comp) == B[k].get(comp))
    out[comp] = {"n": n, "acc_a": sum(ca) / n, "acc_b": sum(cb) / n, "diff": sum(d) / n,
                 "ci95": [boots[124], boots[4874]], "a_only": b10, "b_only": b01, "mcnemar_p": p,
                 "same_verdict": same, "agreement": same / n}
    if comp.startswith("step"):  # False recall: the gold-False items alone, paired the same way
        f = [(x, y) for k, x, y in zip(ks, ca, cb) if gold[k][comp] == "False"]
        f10, f01 = sum(1 for x, y in f if x and not y), sum(1 for x, y in f if y and not x)
        out[comp]["false_recall"] = {"n": len(f), "a": sum(x for x, _ in f) / len(f), "b": sum(y for _, y in f) / len(f),
                                     "a_only": f10, "b_only": f01,
                                     "mcnemar_p": binomtest(f10, f10 + f01).pvalue if f10 + f01 else 1.0}
    print(f"{comp}: n {n}  A {100*sum(ca)/n:.1f}  B {100*sum(cb)/n:.1f}  diff {100*sum(d)/n:+.1f} "
          f"[{100*boots[124]:+.1f}, {100*boots[4874]:+.1f}]  A-only {b10} B-only {b01}  McNemar p {p:.3g}  "
          f"same verdict {same}/{n}")
    if "false_recall" in out[comp]:
        fr = out[comp]["false_recall"]
        print(f"  {comp} False recall: n {fr['n']}  A {100*fr['a']:.1f}  B {100*fr['b']:.1f}  A-only {fr['a_only']} "
              f"B-only {fr['b_only']}  McNemar p {fr['mcnemar_p']:.3g}")
if len(sys.argv) > 4:
    with open(sys.argv[4], "w") as fh:
        json.dump(out, fh, indent=1)
