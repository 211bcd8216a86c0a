"""Paired comparison of two judges' reward AUCs on the same contrast groups: the groups both judged (one reference),
per kind of negative the AUC of each (real turn vs negative, ties half) on those groups only, the
difference with a paired bootstrap 95% interval over groups (groups resampled, both judges' totals kept together),
and the within-group win share of each.
    python docs/evaluations/judge-esconv/qwen15/adversarial-400/paired_contrast.py A/contrast.json LABEL_A \
        B/contrast.json LABEL_B [--reward discrete|graded] [--reference gold|other_round] [--out OUT.json]"""
import argparse
import json
import random

ap = argparse.ArgumentParser()
ap.add_argument("a_path"), ap.add_argument("a_label"), ap.add_argument("b_path"), ap.add_argument("b_label")
ap.add_argument("--reward", default="discrete"), ap.add_argument("--reference", default="gold"), ap.add_argument("--out")
args = ap.parse_args()
a_label, b_label, kind_of_reward = args.a_label, args.b_label, args.reward


def groups(path, label):
    with open(path) as fh:
        totals = json.load(fh)["totals"][label][args.reference]
    return [{k: t[kind_of_reward] for k, t in g.items()} for g in totals]


A, B = groups(args.a_path, a_label), groups(args.b_path, b_label)
n = min(len(A), len(B))  # both files judge the groups file in order: the first n are the same groups
A, B = A[:n], B[:n]


def auc(gs, kind):
    pos = [g["positive"] for g in gs if g.get("positive") is not None]
    neg = [g[kind] for g in gs if g.get(kind) is not None]
    if not pos or not neg:
        return None
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def win(gs, kind):
    pairs = [(g["positive"], g[kind]) for g in gs if g.get("positive") is not None and g.get(kind) is not None]
    return sum(p > q for p, q in pairs) / len(pairs) if pairs else None


rng = random.Random(0)
out = {"groups": n, "reward": kind_of_reward, "reference": args.reference, "a": a_label, "b": b_label, "kinds": {}}
kinds = [k for k in A[0] if k != "positive"]
print(f"groups in both: {n} ({kind_of_reward} total, reference {args.reference})")
for kind in kinds:
    aa, ab = auc(A, kind), auc(B, kind)
    boots = []
    for _ in range(2000):
        idx = [rng.randrange(n) for _ in range(n)]
        x, y = auc([A[i] for i in idx], kind), auc([B[i] for i in idx], kind)
        if x is not None and y is not None:
            boots.append(x - y)
    boots.sort()
    lo, hi = boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]
    out["kinds"][kind] = {"auc_a": aa, "auc_b": ab, "diff": aa - ab, "ci95": [lo, hi],
                          "win_a": win(A, kind), "win_b": win(B, kind)}
    print(f"{kind:18s} {a_label} {aa:.3f}  {b_label} {ab:.3f}  diff {aa - ab:+.3f} [{lo:+.3f}, {hi:+.3f}]  "
          f"win {win(A, kind):.2f} / {win(B, kind):.2f}")
if args.out:
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
