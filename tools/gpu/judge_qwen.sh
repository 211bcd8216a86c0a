#!/usr/bin/env bash
# The 1.5B ESConv judge on a lent GPU machine (issue 23): build the judge data from the real ESConv splits (silver
# labels + rule-made + policy-made negatives, docs/data_builder.md), train the unified judge (+ reply mode) and the
# PRM-only and ORM-only variants on Qwen2.5-Coder-1.5B-Instruct side by side on one card (profile
# gpu-qwen15-esconv: same rows, same steps), and measure them on the valid split (Table 1 columns; trained, the bare
# 1.5B base zero-shot, majority). No registry, no hub there; 64 MiB per call with the tree. Staging, here:
#   make model MODEL=qwen2.5-coder-1.5b && bash tools/gpu/stage_qwen.sh   # .gpu-qwen/q01 .. qNN (~24)
#   bash tools/gpu/stage.sh                                               # .gpu-policy/c1 (TRL, gguf, xgrammar...)
#   bash tools/gpu/judge_esconv.sh pack                                   # .gpu-judge/esconv.tar.xz
# Then consecutive `run` calls, each within the warm window of the previous one (docs/reward_trainer.md has them):
#   tools/gpu/vllm_judge.sh install   carry ONE of .gpu-qwen/qNN, .gpu-policy/c1 a call (the parts are joined and
#                                     checked once all are there)
#   start   carry .gpu-judge: converts the base, builds the data, starts the pipeline in the background (setsid)
#           and waits like `wait`
#   wait    (no carry) waits up to CALL_BUDGET_S (default 560) for the pipeline; copies what is finished to $OUT
#   probe   (no carry, after start's prepare or with .gpu-judge) a few steps side by side with logging every step
# The pipeline (log /tmp/qwen-run/pipeline.log): train unified, prm, orm at once -> evaluate unified (+ reply, base,
# majority) and prm + orm at once -> DONE. STEPS overrides the profile's steps (a smoke run).
set -uo pipefail
S=/tmp/cp-stage R=/tmp/qwen-run
mkdir -p "$S" "$R"
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export COMPEER_CACHE=/tmp/compeer-cache COMPEER_GGUF_DIR=$S TQDM_DISABLE=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# .gpu-tf carried (transformers/peft/tokenizers as pinned in requirements/cpu.lock, --no-deps wheels): installed once
# into /tmp/tfsite and put first on the path of every later call (the machine's own transformers 5.17 is older)
if [ -d .gpu-tf ] && [ ! -f /tmp/tfsite/.ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfsite .gpu-tf/*.whl && touch /tmp/tfsite/.ok
fi
[ -f /tmp/tfsite/.ok ] && export PYTHONPATH=/tmp/tfsite:$PYTHONPATH
W=$R/data D=$R/data/emit/judge_sft
PROFILE=${PROFILE:-gpu-qwen15-esconv} MODEL=${JUDGE_MODEL:-qwen2.5-coder-1.5b}
EVAL=(--model "$MODEL" --device cuda --max-batch 128 --concurrency 128 --no-audit)

train() {  # $1: variant
  local steps=(); [ -n "${STEPS:-}" ] && steps=(--max-steps "$STEPS")
  python3 -m reward_trainer.cli judge --config "$PROFILE" --variant "$1" --data "$D" --out $R/"$1" "${steps[@]}" \
    > $R/train-"$1".log 2>&1 && to_bf16 $R/"$1"
}

pipeline() {  # VARIANTS (default "unified prm orm") trained side by side, then evaluated; CONTRAST_GROUPS groups scored
  local pids=() v
  for v in ${VARIANTS:-unified prm orm}; do train $v & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  pids=()
  python3 -m reward_trainer.cli judge-eval --data "$D" --out $R/eval-unified --adapter $R/unified \
    --adapter reply=$R/unified ${EVAL_ITEMS:+--max-items "$EVAL_ITEMS"} "${EVAL[@]}" > $R/eval-unified.log 2>&1 & pids+=($!)
  if [ -d $R/prm ] && [ -d $R/orm ]; then
    python3 -m reward_trainer.cli judge-eval --data "$D" --out $R/eval-prm-orm --adapter $R/prm --adapter $R/orm \
      --no-base "${EVAL[@]}" > $R/eval-prm-orm.log 2>&1 & pids+=($!)
  fi
  # the reward AUC per kind of negative: the trained judge and the bare base, discrete and graded totals
  python3 -m reward_trainer.cli judge-contrast --groups $W/contrast/groups.jsonl --out $R/contrast-trained \
    --adapter trained=$R/unified --no-base --max-items "${CONTRAST_GROUPS:-585}" "${EVAL[@]}" \
    > $R/contrast-trained.log 2>&1 & pids+=($!)
  [ "${CONTRAST_BASE:-1}" = 1 ] && { python3 -m reward_trainer.cli judge-contrast --groups $W/contrast/groups.jsonl \
    --out $R/contrast-base --max-items "${CONTRAST_GROUPS:-585}" "${EVAL[@]}" > $R/contrast-base.log 2>&1 & pids+=($!); }
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

probe() {  # PROBE_STEPS (default 12) of the profile side by side, a log line a step: as it is, eager attention,
  # float32 weights (tf32 matmuls); where a run goes non-finite, the guard names the tensors (numerics check)
  local pids=() a
  for a in ${PROBE_ARMS:-sdpa eager fp32}; do
    python3 - "$PROFILE" "$a" $R/probe-"$a".yaml <<'PY' || return 1
import sys, yaml
from reward_trainer.config import read_profile
d = read_profile(sys.argv[1])
d.update(logging_steps=1, save_strategy="no", max_nonfinite_grad_steps=1000)
d.update({"sdpa": {}, "eager": {"attn_implementation": "eager"},
          "fp32": {"model_dtype": "float32", "bf16": False, "tf32": True}}[sys.argv[2]])
yaml.safe_dump(d, open(sys.argv[3], "w"))
PY
    python3 -m reward_trainer.cli judge --config $R/probe-"$a".yaml --data "$D" --out $R/probe-"$a" \
      --max-steps "${PROBE_STEPS:-12}" > $R/probe-"$a".log 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for a in ${PROBE_ARMS:-sdpa eager fp32}; do
    echo "== $a"; grep -hE "'loss'|non-finite|Error|train_runtime" $R/probe-"$a".log | cut -c1-220 | tail -n 30
  done
}

to_bf16() { python3 tools/gpu/adapter_bf16.py "$1"; }  # $1 -> $1-bf16 (LoRA weights shipped in bfloat16)

collect() {  # what is finished, to $OUT (8 files at most, 16 MiB each): logs, metrics, the unified adapter in parts
  cp $R/pipeline.log "$OUT"/ 2>/dev/null
  grep -hE "'loss'|train_runtime|resuming" $R/train-*.log > "$OUT"/train.txt 2>/dev/null
  tail -n 5 $R/*.log > "$OUT"/tails.txt 2>/dev/null
  local d=(); for x in eval-unified eval-prm-orm contrast-trained contrast-base unified/compeer_judge.json prm/compeer_judge.json \
      orm/compeer_judge.json data/counts.txt; do [ -e $R/$x ] && d+=("$x"); done
  [ ${#d[@]} -gt 0 ] && tar -cf "$OUT"/evals.tar -C $R --exclude=predictions.jsonl "${d[@]}"
  if [ -d $R/"${ADAPTER:-unified}"-bf16 ]; then  # one adapter a call: ADAPTER=prm / orm for the others
    tar -cf - -C $R "${ADAPTER:-unified}"-bf16 | split -b 15M -d - "$OUT"/"${ADAPTER:-unified}"-adapter.tar.part-
  fi
}

wait_pipeline() {
  local T0=$(date +%s) budget=${CALL_BUDGET_S:-560}
  while [ ! -f $R/DONE ] && [ $(( $(date +%s) - T0 )) -lt "$budget" ]; do sleep 10; done
  collect
  if [ -f $R/DONE ]; then echo "pipeline finished: $(cat $R/DONE)"; else echo "pipeline still running"; fi
  tail -n 3 $R/pipeline.log; grep -h "'loss'" $R/train-*.log 2>/dev/null | tail -n 3; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
}

prepare() {  # the base converted once (bf16), the data built once
  [ -f "$S"/esconv.tar.xz ] || cp .gpu-judge/esconv.tar.xz "$S"/ || { echo "carry .gpu-judge" >&2; return 1; }
  python3 -c 'import transformers, peft; print("transformers", transformers.__version__, "peft", peft.__version__)'
  python3 -m judge.model_store bfloat16 --model "$MODEL" --adapter none || return 1
  [ -d "$D" ] && return 0
  bash tools/gpu/esconv_data.sh "$S"/esconv.tar.xz $W > $R/build.log 2>&1 || { tail -20 $R/build.log; return 1; }
  tail -n 3 $R/build.log
}

case "${1:?prepare|probe|start|wait|pipeline|collect}" in
prepare)
  prepare || exit 1
  ;;
probe)
  prepare && probe
  ;;
start)
  prepare || exit 1
  setsid nohup bash tools/gpu/judge_qwen.sh pipeline > $R/pipeline.log 2>&1 < /dev/null &
  sleep 5
  wait_pipeline
  ;;
pipeline)
  T0=$(date +%s)
  if pipeline; then echo "ok after $(( $(date +%s) - T0 )) s" > $R/DONE; else echo "FAILED after $(( $(date +%s) - T0 )) s" > $R/DONE; fi
  ;;
wait)
  wait_pipeline
  ;;
collect)
  collect; ls -l "$OUT"
  ;;
esac
