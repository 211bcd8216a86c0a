#!/usr/bin/env bash
# Builds the carry folders that bring a judge adapter to a lent GPU machine: one kept in this repository's history
# (an adapter measured but not shipped cannot stay in the tree: the tree travels with every call, 64 MiB at most) or
# any folder here.
#   bash tools/gpu/stage_adapter.sh SOURCE NAME
#     SOURCE  REV:PATH (a folder of a commit, e.g. the round-3 judge of issue 23: docs/gpu.md says which) or a folder
#     NAME    the adapter's folder name on the device
# Writes .gpu-adapter/a01 .. aNN (ignored by git through info/exclude, added here), each a part of NAME.adapter.tar (a
# folder NAME/) in parts of PART_BYTES (tools/gpu/carry.sh) and parts.txt (count, size, sha256 of the whole, its
# name). The device side is `tools/gpu/vllm_judge.sh install`, one folder a call: it joins the parts once all are there,
# checks them and unpacks the adapter into /tmp/cp-stage/adapters/NAME (JUDGE_ADAPTER= that folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:?REV:PATH or a folder} NAME=${2:?the adapter folder name on the device}
OUT=.gpu-adapter
. tools/gpu/carry.sh  # tree_bytes / part_bytes: one rule for every carry folder
PART_BYTES=$(part_bytes)
ignore_here .gpu-adapter
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/$NAME"
if [ -d "$SRC" ]; then cp -r "$SRC"/. "$W/$NAME"/; else git archive --format=tar "$SRC" | tar -x -C "$W/$NAME"; fi
[ -f "$W/$NAME"/adapter_model.safetensors ] || { echo "stage_adapter: no adapter_model.safetensors in $SRC" >&2; exit 1; }
( cd "$W/$NAME" && sha256sum adapter_model.safetensors )
tar -cf "$W/$NAME.adapter.tar" -C "$W" "$NAME"
SIZE=$(stat -c %s "$W/$NAME.adapter.tar") SHA=$(sha256sum "$W/$NAME.adapter.tar" | cut -d' ' -f1)
rm -rf "$OUT"/a[0-9]* && mkdir -p "$OUT"
split -b "$PART_BYTES" -d -a 2 "$W/$NAME.adapter.tar" "$W"/adapter.part-
N=$(ls "$W"/adapter.part-* | wc -l)
for f in "$W"/adapter.part-*; do
  d=$(printf '%s/a%02d' "$OUT" $(( 10#${f##*-} + 1 )))
  mkdir -p "$d" && mv "$f" "$d"/ && echo "$N $SIZE $SHA $NAME.adapter.tar" > "$d"/parts.txt
done
echo "$N carry folders: $OUT/a01 .. $(printf 'a%02d' "$N") ($NAME, $SIZE bytes)"
