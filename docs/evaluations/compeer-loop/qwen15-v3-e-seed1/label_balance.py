"""How v3's training items label a candidate, by the strategy the candidate names (found after the twenty-fourth GPU
session: v3 pays for naming *Question* out of place; do its labels?).

Build v3's judge data here first (the silver train items' sha256 must be d3bb9350..., as in
docs/evaluations/judge-esconv/qwen15/report.md, "The 500-step judge"):
  POLICY_NEGATIVES="data_builder/data/policy_negatives.jsonl data_builder/data/policy_negatives_grpo_round2.jsonl
  data_builder/data/policy_negatives_grpo_round3.jsonl data_builder/data/policy_negatives_grpo_round5.jsonl.xz
  data_builder/data/policy_negatives_loop_valid_misfit.jsonl.xz" bash tools/gpu/esconv_data.sh ../shared/data/esconv DATA
then: python docs/evaluations/compeer-loop/qwen15-v3-e-seed1/label_balance.py DATA > .../label_balance.txt
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from data_builder.policy_negatives import strategy_at
from evaluator.prompts import cer_reply

V3_SILVER_TRAIN = "d3bb93501dd77c6224b7b69ce43a45ea83d8b50a5b2ed6ca142019fc5a45ad01"


def main(data: Path) -> None:
    items = data / "silver-train" / "items.jsonl"
    digest = hashlib.sha256(items.read_bytes()).hexdigest()
    if digest != V3_SILVER_TRAIN:
        sys.exit(f"{items}: sha256 {digest}, not v3's {V3_SILVER_TRAIN}")
    turns = {d["id"]: d["turns"] for d in map(json.loads, (data / "ingest-train" / "dialogues.jsonl").open())}
    by_named: dict[str, Counter[str]] = defaultdict(Counter)
    for item in map(json.loads, items.open()):
        named = cer_reply(item["candidate"])["strategy"]
        if named is None:
            continue
        gold = strategy_at(turns.get(item["dialogue_id"], []), item["round_index"])
        c, labels = by_named[named], item["labels"]
        c["n"] += 1
        c["step3 True"] += labels.get("step3") is True
        c["candidate preferred"] += labels.get("preference") == "second"  # reference first, candidate second
        c["named = annotated"] += named == gold
    print(f"silver train items {digest[:12]}: candidates naming a strategy, by the strategy named")
    print("| named strategy | items | step 3 True % | candidate preferred % | named = annotated at the round % |")
    print("|---|---|---|---|---|")
    for named, c in sorted(by_named.items(), key=lambda kv: -kv[1]["n"]):
        n = c["n"]
        print(f"| {named} | {n} | {100 * c['step3 True'] / n:.1f} | {100 * c['candidate preferred'] / n:.1f} | "
              f"{100 * c['named = annotated'] / n:.1f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
