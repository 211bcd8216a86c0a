#!/usr/bin/env bash
# The judge data from the real ESConv splits, as docs/reward_trainer.md ("Data") builds it here: ingest, Gaussian
# round sampling, silver labels with the rule-made negatives (train's template list for train, the disjoint eval list
# for valid) and the policy-made ones (data_builder/data/policy_negatives.jsonl, or the files listed in $POLICY_NEGATIVES), the contrast groups of the valid split, the judge SFT
# sets (train = ESConv train, held out = exactly the valid dialogues). Used by tools/gpu/judge_esconv.sh and
# tools/gpu/judge_qwen.sh on a lent GPU machine (no registry there), and runnable here.
# Writes OUT_DIR/counts.txt (the sha256 of the silver items and contrast groups) and OUT_DIR/cues.txt (compeer-data cues).
#   bash tools/gpu/esconv_data.sh ESCONV.tar.xz|ESCONV_DIR OUT_DIR
set -euo pipefail
SRC=${1:?ESConv tarball or folder (train.json, valid.json)} W=${2:?output folder}
C="python3 -m data_builder.cli" PN=()
for f in ${POLICY_NEGATIVES:-data_builder/data/policy_negatives.jsonl}; do PN+=(--policy-negatives "$f"); done
# SILVER_RATIONALES: a YAML of rationale phrasings replacing silver.yaml's (compeer-data silver --rationales)
SR=(); [ -z "${SILVER_RATIONALES:-}" ] || SR=(--rationales "$SILVER_RATIONALES")
# SILVER_CONFIG: a construction YAML replacing the packaged silver.yaml, for silver and contrast (e.g. an earlier
# commit's, to rebuild the data of a judge trained before its hack pools changed: docs/data_builder.md)
CF=(); [ -z "${SILVER_CONFIG:-}" ] || CF=(--config "$SILVER_CONFIG")
if [ -d "$SRC" ]; then E=$SRC; else E=$W/esconv; mkdir -p "$E" && tar -xJf "$SRC" -C "$E"; fi
$C ingest --quiet --format esconv --out $W/ingest-train $E/train.json
$C ingest --quiet --format esconv --out $W/ingest-valid $E/valid.json
$C sample --quiet --rounds 8 --out $W/sample-train $W/ingest-train/dialogues.jsonl
$C sample --quiet --rounds 3 --out $W/sample-valid $W/ingest-valid/dialogues.jsonl
$C silver --quiet --out $W/silver-train --pool train "${PN[@]}" "${SR[@]}" "${CF[@]}" --dialogues $W/ingest-train/dialogues.jsonl $W/sample-train/rounds.jsonl
$C silver --quiet --out $W/silver-valid --pool eval "${SR[@]}" "${CF[@]}" --dialogues $W/ingest-valid/dialogues.jsonl $W/sample-valid/rounds.jsonl
$C contrast --quiet --out $W/contrast --pool eval "${PN[@]}" "${CF[@]}" --dialogues $W/ingest-valid/dialogues.jsonl $W/sample-valid/rounds.jsonl
$C emit --quiet --out $W/emit --heldout-from $W/ingest-valid/dialogues.jsonl $W/silver-train/items.jsonl \
  $W/silver-valid/items.jsonl $W/sample-train/rounds.jsonl $W/sample-valid/rounds.jsonl
sha256sum $W/silver-train/items.jsonl $W/silver-valid/items.jsonl $W/contrast/groups.jsonl | tee $W/counts.txt
# whether a question or a short reply tells the label in these items (docs/data_builder.md; no judge, ~2 s)
$C cues $W/silver-train/items.jsonl $W/silver-valid/items.jsonl > $W/cues.txt
