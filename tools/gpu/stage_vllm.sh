#!/usr/bin/env bash
# Builds the carry folders that bring vLLM 0.26.0 to a lent GPU machine (run here; needs PyPI through pip).
# The GPU machines have torch 2.11.0+cu130 and transformers but no vLLM and no registry; vllm==0.26.0 pins exactly
# that torch (../shared/GPU.md). Its wheel (304 MB) and the --no-deps wheels of what the machines lack (~45 MB,
# pinned below; openai 2.x, not 3.x which imports httpx2 everywhere; apache-tvm-ffi 0.1.15.post2, not vLLM's pin
# 0.1.10 which breaks xgrammar 0.2.8) are checked against the committed tools/gpu/vllm-manifest.txt (sha256),
# packed in one tar and split into parts that travel with the tree (64 MiB a call), one carry folder each: .gpu-vllm/p1 .. .gpu-vllm/pN (ignored by
# git through info/exclude, added here). A `run` call carries at most 64 MiB with the tree (~36 MB on 2026-11-27).
#   bash tools/gpu/stage_vllm.sh            # download (cached in .gpu-vllm/whl), check, pack
#   bash tools/gpu/stage_vllm.sh manifest   # download the pins below and rewrite the manifest (a pin changed)
# The device side is tools/gpu/vllm_judge.sh install (docs/gpu.md has the calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=.gpu-vllm
MANIFEST=tools/gpu/vllm-manifest.txt
# a part and the tracked tree travel together in one call (64 MiB): a part is 64 MiB less the tree and 2 MiB
. tools/gpu/carry.sh  # tree_bytes / part_bytes: one rule for every carry folder
PART_BYTES=$(part_bytes)
PINS=(
  vllm==0.26.0
  blake3==1.0.11 openai==2.54.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 anthropic==2.14.0
  docstring_parser==0.18.0 fastapi==0.136.3 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5
  pydantic-extra-types==2.11.1 pycountry==26.2.16 annotated-types==0.8.0 typing-inspection==0.4.5 uvicorn==0.54.0
  prometheus-fastapi-instrumentator==8.1.0 lm-format-enforcer==0.11.3 interegular==0.3.3 outlines_core==0.2.14
  lark==1.2.2 llguidance==1.7.6 xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 partial-json-parser==0.2.1.1.post7
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 pyzmq==27.3.0
  msgspec==0.22.0 mistral_common==1.13.1 compressed-tensors==0.17.0 depyf==0.20.0 astor==0.8.1 dill==0.4.1
  loguru==0.7.3 watchfiles==1.3.0 python-json-logger==4.2.0 pybase64==1.5.1 cbor2==6.3.0 ijson==3.6.0
  setproctitle==1.3.8 openai-harmony==0.0.8 model-hosting-container-standards==0.1.16 mcp==2.3.0
  mcp-types==2.3.0 sse-starlette==3.7.0 python-multipart==0.0.34 PyJWT==2.15.1 httpx2==2.16.2
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-semantic-conventions-ai==0.5.1
  googleapis-common-protos==1.76.0 nvtx==0.2.15 fastsafetensors==0.5.0 cffi==2.1.1 pycparser==3.12
  torch-c-dlpack-ext==0.1.5
)
mkdir -p "$OUT/whl"
ignore_here .gpu-vllm

download() {  # Python 3.12, manylinux x86_64 (the GPU machines), binary wheels only, no dependencies
  # the machine-wide pip constraints cap torch only; no pin here touches it
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform any -d "$OUT/whl" "${PINS[@]}" \
    2> >(grep -v "is ignored: it is neither" >&2)
}

case "${1:-stage}" in
manifest)
  download  # pip skips a wheel already in the cache folder
  n=$(ls "$OUT"/whl/*.whl | wc -l)
  [ "$n" -eq "${#PINS[@]}" ] || { echo "stage_vllm: $n wheels for ${#PINS[@]} pins" >&2; exit 1; }
  { echo "# sha256 of the wheels tools/gpu/stage_vllm.sh brings to the GPU machines (regenerate: stage_vllm.sh manifest)"
    (cd "$OUT/whl" && sha256sum -- *.whl | sort -k2); } > "$MANIFEST"
  echo "wrote $MANIFEST ($n wheels)"
  ;;
stage)
  # download what the cache lacks, then every wheel of the manifest must be there with its sha256
  missing=$(cd "$OUT/whl" && grep -v '^#' "../../$MANIFEST" | awk '{print $2}' | while read -r f; do [ -f "$f" ] || echo "$f"; done)
  [ -z "$missing" ] || download
  (cd "$OUT/whl" && grep -v '^#' "../../$MANIFEST" | sha256sum -c --quiet -) || { echo "stage_vllm: sha256 mismatch" >&2; exit 1; }
  rm -rf "$OUT"/p[0-9]* "$OUT/vllm.tar"
  # exactly the manifest's wheels, in its order
  tar -C "$OUT/whl" -cf "$OUT/vllm.tar" $(grep -v '^#' "$MANIFEST" | awk '{print $2}')
  total=$(stat -c %s "$OUT/vllm.tar")
  sum=$(sha256sum "$OUT/vllm.tar" | awk '{print $1}')
  (cd "$OUT" && split -b "$PART_BYTES" -d -a 2 vllm.tar vllm.part-)
  parts=("$OUT"/vllm.part-*)
  k=0
  for f in "${parts[@]}"; do
    k=$((k + 1)); mkdir -p "$OUT/p$k"; mv "$f" "$OUT/p$k/"
    echo "${#parts[@]} $total $sum" > "$OUT/p$k/parts.txt"
  done
  rm -f "$OUT/vllm.tar"
  du -sb "$OUT"/p[0-9]*
  echo "carry: $(for i in $(seq 1 ${#parts[@]}); do printf '.gpu-vllm/p%s ' "$i"; done)"
  ;;
*) echo "usage: stage_vllm.sh [stage|manifest]" >&2; exit 2 ;;
esac
