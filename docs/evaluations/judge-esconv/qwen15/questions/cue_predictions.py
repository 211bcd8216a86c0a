"""Do the trained judges follow the question cue of their training items, and by how much? (issue 23, 2026-12-08; no
GPU: the committed Table-1 predictions of each judge on the 585 valid items, read against those items.)

The valid items every judge below was measured on are v3's (`a9af36de...`), built with the hack pools of commit
a3bf9df:
  git show a3bf9df:data_builder/data/silver.yaml > /tmp/silver.yaml
  SILVER_CONFIG=/tmp/silver.yaml POLICY_NEGATIVES="data_builder/data/policy_negatives.jsonl
  data_builder/data/policy_negatives_grpo_round2.jsonl data_builder/data/policy_negatives_grpo_round3.jsonl
  data_builder/data/policy_negatives_grpo_round5.jsonl.xz data_builder/data/policy_negatives_loop_valid_misfit.jsonl.xz"
  bash tools/gpu/esconv_data.sh ../shared/data/esconv DATA
then, from the repository root:
  PYTHONPATH=. python docs/evaluations/judge-esconv/qwen15/questions/cue_predictions.py DATA > \
      docs/evaluations/judge-esconv/qwen15/questions/cue_predictions.txt

Per judge and cell of `data_builder.cues` (asks a question x at most 10 words), over the preference items: how often
the label prefers the candidate (reply 2) and how often the judge does (`data_builder.cues.judged_cue_table`, the
table `compeer-train judge-eval` now writes for every judge). A judge that only learned the labels predicts
"preferred" about as often as the labels say in every cell; one that learned the cue over-predicts it where the cue is
present.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import sys
from pathlib import Path

from scipy.stats import binomtest

from cer.reasoning import reply_text
from data_builder.cues import CELLS, judged_cue_table
from reward_trainer.predict import item_key

VALID = "a9af36ded4749163db8c911f8d1f10ce458f5f6f52ac3e9b9eaedbbb1473a784"
HERE = Path(__file__).resolve().parents[1]  # docs/evaluations/judge-esconv/qwen15
JUDGES = {  # name: its committed predictions on the valid items above
    "v2 (1.5B, 400 steps; GPU default 2026-11-29..30)": HERE / "adversarial-400/gpu-eval-adv/predictions.jsonl.xz",
    "round-5 judge (1.5B, not shipped)": HERE / "adversarial-round5/gpu-eval-adv/predictions.jsonl.xz",
    "v3 (1.5B, 500 steps; the GPU default)": HERE / "steps-500/gpu-eval-adv/predictions.jsonl.xz",
    "evidence-rationale judge (1.5B, not shipped)": HERE / "evidence-rationales/gpu-eval-adv/predictions.jsonl.xz",
    "135M v2 (the CPU default)": HERE.parent / "smollm2-round5/gpu-eval-new/predictions.jsonl.xz",
    "135M v1 (CPU default until 2026-12-01)": HERE.parent / "smollm2-round5/gpu-eval-shipped/predictions.jsonl.xz",
}


def main(data: Path) -> None:
    path = data / "silver-valid" / "items.jsonl"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != VALID:
        sys.exit(f"{path}: sha256 {digest}, not the valid items the judges were measured on ({VALID[:12]})")
    items: dict[str, dict] = {}
    for item in map(json.loads, path.open()):
        if "preference" in item["labels"]:
            key = item_key(item["dialogue_id"], item["candidate"])
            assert key not in items, key
            items[key] = item
    print(f"valid items {digest[:12]}: {len(items)} preference items; per cell: items: label prefers the candidate % "
          "/ judge prefers it %")
    print("\n| judge | " + " | ".join(", ".join(c) for c in CELLS) + " | gap short: label / judge | short questions: "
          "judge prefers, label not / the reverse (McNemar exact p) |")
    print("|---|" + "---|" * (len(CELLS) + 2))
    for name, preds in JUDGES.items():
        with lzma.open(preds, "rt") as fh:
            said = {p["key"]: (p.get("verdicts") or {}).get("preference") for p in map(json.loads, fh)
                    if p["variant"] == "unified"}
        t = judged_cue_table((reply_text(item["candidate"])[0], item["labels"]["preference"] == "second",
                              said[key] == "second") for key, item in items.items())
        row = [f"{c['items']}: {c['label_pct']} / **{c['judge_pct']}**" for c in t["cells"].values()]
        g, q = t["gap_question_minus_not"]["short"], t["cells"]["question, short"]
        disc = f"{q['over']} / {q['under']} (p {binomtest(q['over'], q['over'] + q['under']).pvalue:.2g})"
        print(f"| {name} | " + " | ".join(row) + f" | {g['label_pct']:+.1f} / **{g['judge_pct']:+.1f}** | {disc} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
