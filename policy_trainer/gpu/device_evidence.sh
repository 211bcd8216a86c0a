#!/usr/bin/env bash
# GPU evidence for issue 3 on a lent device machine (no registry, no hub, no vLLM/trl there).
# Three consecutive calls of the `run` tool, each carrying one staging folder (see docs/policy_trainer.md):
#   install  (carry .gpu-policy/c1: wheels + first part of the xz'd default GGUF)
#   model    (carry .gpu-policy/c2: second GGUF part) -> /tmp/smollm2, a bf16 HF folder
#   run      (carry .gpu-policy/c3 + compeer: fp16 all-MiniLM-L6-v2) -> reward server (transformers backend)
#            + SFT warm-up + GRPO, results copied to $OUT
set -uo pipefail
S=/tmp/cp-stage
mkdir -p "$S"
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
case "${1:?install|model|run}" in
install)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu-policy/c1/whl/*.whl || exit 1
  cp .gpu-policy/c1/gguf.part-* "$S"/
  nvidia-smi -L
  python3 -c 'import torch, transformers, peft, trl, datasets, grpc, google.protobuf as pb; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "trl", trl.__version__, "datasets", datasets.__version__, "grpcio", grpc.__version__, "protobuf", pb.__version__)'
  ;;
model)
  cp .gpu-policy/c2/gguf.part-* "$S"/
  cat "$S"/gguf.part-* | xz -d > "$S"/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
  sha256sum "$S"/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 - <<'PY'
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, f = "/tmp/cp-stage", "SmolLM2-135M-Instruct.Q4_1.gguf"
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
if getattr(m, "hf_quantizer", None) is not None:
    m.hf_quantizer.remove_quantization_config(m)
m.save_pretrained("/tmp/smollm2")
AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained("/tmp/smollm2")
print("converted to /tmp/smollm2")
PY
  ;;
run)
  tar -xJf .gpu-policy/c3/minilm.tar.xz -C "$S" || exit 1
  python3 -m reward_server.cli serve --backend transformers --model /tmp/smollm2 --device cuda \
    --embedding-model "$S"/minilm --cache memory --host 127.0.0.1 --grpc-port 50051 --http-port 8000 \
    > "$OUT"/server.log 2>&1 &
  SERVER=$!
  python3 - <<'PY' || { kill "$SERVER"; exit 1; }
import time, httpx
t0 = time.time()
while time.time() - t0 < 240:
    try:
        if httpx.get("http://127.0.0.1:8000/readyz", timeout=2).status_code == 200:
            print(f"reward server ready after {time.time() - t0:.0f} s"); break
    except httpx.HTTPError:
        pass
    time.sleep(1)
else:
    raise SystemExit("reward server not ready after 240 s")
PY
  timeout "${TRAIN_BUDGET_S:-430}" python3 -m policy_trainer.cli grpo --config gpu-paper \
    --policy-model /tmp/smollm2 --reward-server 127.0.0.1:50051 --out /tmp/run --max-steps "${STEPS:-24}" \
    --set learning_rate=2.0e-5 --set gradient_checkpointing=false --set max_completion_length=160 \
    --set sft_warmup_steps=40 --set save_steps=12 --set disable_tqdm=true > "$OUT"/train.log 2>&1
  echo "train exit $?"
  cp /tmp/run/metrics.jsonl "$OUT"/ 2>/dev/null
  cp /tmp/run/summary.json "$OUT"/ 2>/dev/null
  tar -cf "$OUT"/plots.tar -C /tmp/run plots 2>/dev/null
  kill -TERM "$SERVER"; wait "$SERVER"
  grep -E "step [0-9]+/|WARNING|Error" "$OUT"/train.log | tail -40
  ;;
esac
