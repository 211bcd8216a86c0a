"""What the decision rule reports either way (decision-rule.md, last paragraph), for the evidence-rationale judge
beside v3 on the same valid items: step-3 False recall per kind of False (no strategy named beside a hack / a
strategy the reply does not carry out / a strategy of another stage) and, from the new judge's saved step-3 outputs
(`judge-eval --save-texts`), how often the strategy its rationale names first is the reply's annotated strategy
(items whose reply has one), beside the majority strategy's share and Cohen's kappa.
    PYTHONPATH=. python docs/evaluations/judge-esconv/qwen15/evidence-rationales/evidence.py \
        SILVER_VALID/items.jsonl NEW/predictions.jsonl[.xz] V3/predictions.jsonl[.xz] [OUT.json]   # repository root"""
import json
import lzma
import sys
from collections import Counter

from sklearn.metrics import cohen_kappa_score

from cer.reasoning import parse
from cer.taxonomy import load_taxonomy, named_strategy
from reward_trainer.predict import item_key


def rows(path: str) -> list[dict]:
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def unified(path: str) -> dict[str, dict]:
    return {r["key"]: r for r in rows(path) if r.get("judge") == "trained" and r.get("variant") == "unified"}


items_path, new_path, old_path = sys.argv[1:4]
items = {item_key(it["dialogue_id"], it["candidate"]): it for it in rows(items_path)
         if "step3" in it.get("labels", {})}
new, old = unified(new_path), unified(old_path)
keys = [k for k in items if k in new and k in old]
print(f"valid unified items: {len(items)}; in both judges' predictions: {len(keys)}")


def kind_of(it: dict) -> str:
    if it["labels"]["step3"]:
        return "gold True"
    return it["construction"]["corrupted"].get("step3") or "no strategy named (beside a hack)"


out: dict = {"items": len(keys), "step3_by_kind": {}}
by_kind: dict[str, list[str]] = {}
for k in keys:
    by_kind.setdefault(kind_of(items[k]), []).append(k)
print("step 3, per kind of gold label: share of the judge's verdicts equal to gold (False recall for the False kinds)")
for kind, ks in sorted(by_kind.items()):
    gold = "True" if kind == "gold True" else "False"
    hit = {name: sum(1 for k in ks if p[k]["verdicts"].get("step3") == gold) for name, p in (("new", new), ("v3", old))}
    out["step3_by_kind"][kind] = {"n": len(ks), **hit}
    print(f"  {kind}: n {len(ks)}; new {hit['new']} ({hit['new'] / len(ks):.1%}), v3 {hit['v3']} ({hit['v3'] / len(ks):.1%})")

taxonomy = load_taxonomy()
said, truth, named_by_candidate, kinds = [], [], [], []
missing = 0
for k in keys:
    annotated = items[k]["construction"].get("reply_strategy")
    texts = new[k].get("texts") or []
    if not annotated:
        continue
    if len(texts) < 3:
        missing += 1
        continue
    said.append(named_strategy(texts[2], taxonomy) or "(none)")
    truth.append(annotated)
    parts = parse(items[k]["candidate"]).parts
    named_by_candidate.append(named_strategy(parts.get("strategy") or "", taxonomy) or "(none)")
    kinds.append(kind_of(items[k]))
n = len(truth)
if n:
    agree = sum(1 for s, t in zip(said, truth) if s == t)
    top, top_n = Counter(truth).most_common(1)[0]
    kappa = cohen_kappa_score(truth, said)
    out["rationale_names_reply_strategy"] = {"n": n, "agree": agree, "share": agree / n, "majority": top,
                                             "majority_share": top_n / n, "kappa": kappa, "no_text": missing,
                                             "names_none": said.count("(none)"), "by_kind": {}}
    print(f"step-3 rationale names the reply's annotated strategy first: {agree} of {n} ({agree / n:.1%}); majority "
          f"strategy {top} {top_n / n:.1%}; Cohen's kappa {kappa:.3f}; names none {said.count('(none)')}; "
          f"items without saved texts {missing}")
    # where the candidate names another strategy than its reply carries out, agreeing with the annotation is not
    # copying the named one: the figure that says whether the rationale reads the reply
    print("  per kind: the rationale names the reply's strategy / the candidate's named strategy")
    for kind in sorted(set(kinds)):
        idx = [i for i, x in enumerate(kinds) if x == kind]
        rs = sum(1 for i in idx if said[i] == truth[i])
        cs = sum(1 for i in idx if said[i] == named_by_candidate[i])
        differs = sum(1 for i in idx if truth[i] != named_by_candidate[i])
        out["rationale_names_reply_strategy"]["by_kind"][kind] = {
            "n": len(idx), "reply_strategy": rs, "named_strategy": cs, "named_differs_from_reply": differs}
        print(f"    {kind}: n {len(idx)} (named differs from the reply's: {differs}); reply's {rs} "
              f"({rs / len(idx):.1%}), named {cs} ({cs / len(idx):.1%})")
else:
    print(f"no item with an annotated reply strategy and saved step-3 text (without texts: {missing})")
if len(sys.argv) > 4:
    with open(sys.argv[4], "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
