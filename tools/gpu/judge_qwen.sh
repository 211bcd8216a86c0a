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
#   finish  carry .gpu-judge .gpu-loop compeer_proto, after tools/gpu/vllm_judge.sh stage: the serving benchmark
#           alone on the card (BENCH=0 skips it), then the judges' pipeline (TRAIN_JUDGES=0 skips it; e.g.
#           VARIANTS='prm orm' STEPS=200) beside a GRPO run of GRPO_STEPS against the served default judge; `wait`
#   adversarial  same carry as finish: the adversarial round (adversarial() below); `wait`, then `collect` and
#           `ADAPTER=unified-adv collect` for the retrained adapter; SHIPPED_CARD=N (several cards) measures the
#           shipped judge on card N while the new one trains; SHIPPED_EVAL=0 (one card) skips its Table 1 (the
#           shipped judge's is committed: docs/evaluations/judge-esconv/qwen15/steps-500); both judges'
#           per-item verdicts come back in predictions.tar.xz; each judge's contrast is its own process and folder
#   calibrate  carry .gpu-judge compeer_proto, the adapters' weights (slim.sh weights): the shipped judge's verdict
#           temperature (calibrate() below); $R/CALIBRATED once $R/shipped-cal has it; `wait` brings the rest
#   contrast  carry .gpu-judge: the shipped judge's reward AUC on CONTRAST_GROUPS (120) valid groups, both
#           references, in the background (~5 minutes of an H200); `wait` brings contrast-shipped in evals.tar
#           (CONTRAST_ADAPTER=NAME=.gpu-judge/<folder> and CONTRAST_GROUPS_FILE=.gpu-judge/groups.jsonl: a candidate
#           judge's adapter on groups built here; `wait` brings contrast-candidate)
# The pipeline (log /tmp/qwen-run/pipeline.log): train unified, prm, orm at once -> evaluate unified (+ reply, base,
# majority) and prm + orm at once -> DONE. STEPS overrides the profile's steps (a smoke run).
set -uo pipefail
. "$(dirname "$0")/vsite.sh"  # vsite_check / vsite_path / vsite_use: the staged vLLM
S=${STAGE_DIR:-/tmp/cp-stage} R=${QWEN_RUN:-/tmp/qwen-run}  # the staged parts; the run's folder (overridable for the tests)
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
# the shipped judge of the base trained here (its adapter in judge/bases.py, the one place that names it: the 1.5B
# base's by default; JUDGE_MODEL=smollm2-135m with PROFILE=gpu-esconv retrains the CPU default's), measured beside
# every retrained one
SHIPPED=judge/adapters/$(PYTHONPATH="$(dirname "$0")/../.." python3 -c \
  'import sys; from judge.bases import BASES; print(BASES[sys.argv[1]].adapter)' "$MODEL") || exit 1

train() {  # $1: variant, $2: its folder under $R (default: the variant's name); data: $D; TRAIN_SET: config fields
  # (KEY=VALUE, space-separated), e.g. "per_device_train_batch_size=8 gradient_accumulation_steps=4": the same 32
  # rows a step in fewer, larger micro-batches
  local steps=() name=${2:-$1} kv; [ -n "${STEPS:-}" ] && steps=(--max-steps "$STEPS")
  for kv in ${TRAIN_SET:-}; do steps+=(--set "$kv"); done
  python3 -m reward_trainer.cli judge --config "$PROFILE" --variant "$1" --data "$D" --out $R/"$name" "${steps[@]}" \
    > $R/train-"$name".log 2>&1 && to_bf16 $R/"$name"
}

pipeline() {  # VARIANTS (default "unified prm orm") trained side by side, then evaluated; CONTRAST_GROUPS groups scored
  local pids=() v
  for v in ${VARIANTS:-unified prm orm}; do train $v & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  pids=()
  # PRM + ORM beside a unified judge: the one trained here, else the shipped one (its steps: compeer_judge.json)
  local unified=$R/unified; [ -d $unified ] || unified=$SHIPPED
  if [ -d $R/unified ]; then
    python3 -m reward_trainer.cli judge-eval --data "$D" --out $R/eval-unified --adapter $R/unified \
      --adapter reply=$R/unified ${EVAL_ITEMS:+--max-items "$EVAL_ITEMS"} "${EVAL[@]}" > $R/eval-unified.log 2>&1 & pids+=($!)
  fi
  if [ -d $R/prm ] && [ -d $R/orm ]; then
    python3 -m reward_trainer.cli judge-eval --data "$D" --out $R/eval-prm-orm --adapter $R/prm --adapter $R/orm \
      --adapter unified=$unified --no-base ${EVAL_ITEMS:+--max-items "$EVAL_ITEMS"} "${EVAL[@]}" \
      > $R/eval-prm-orm.log 2>&1 & pids+=($!)
  fi
  # the reward AUC per kind of negative: the trained judge and the bare base, discrete and graded totals
  [ -d $R/unified ] && { python3 -m reward_trainer.cli judge-contrast --groups $W/contrast/groups.jsonl \
    --out $R/contrast-trained --adapter trained=$R/unified --no-base --max-items "${CONTRAST_GROUPS:-585}" "${EVAL[@]}" \
    > $R/contrast-trained.log 2>&1 & pids+=($!); }
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

finish() {  # issue 23's last figures, one card: (1) the serving benchmark alone on the card: one GRPO step of real
  # ESConv groups judged by the 135M judge and by the trained 1.5B judge on vLLM, one after the other; then side by
  # side (2) PRM + ORM judges trained (VARIANTS, STEPS) and evaluated beside the unified one, and (3) a GRPO run
  # (GRPO_STEPS) of the 135M policy against `compeer-reward serve` with no judge flags (the GPU default judge), the
  # loop's prompts and warm-up; the README example scored by that server first (device_evidence.sh run)
  vsite_path
  [ "${BENCH:-1}" = 1 ] && python3 -m bench.judge_bases_cpu --device cuda --judges 135m,1.5b-judge --dtype 135m=bfloat16,1.5b-judge=bfloat16 \
    --sets "${BENCH_SETS:-5}" --data $W/esconv/valid.json --note "$(nvidia-smi -L | head -n 1)" \
    > $R/bench.log 2>&1 && echo "bench ok" >> $R/bench.log  # BENCH=0: skipped
  cp bench/results/judge_bases_cuda.json $R/ 2>/dev/null
  local judges=""  # TRAIN_JUDGES=0: the serving benchmark and the GRPO run alone
  [ "${TRAIN_JUDGES:-1}" = 1 ] && { pipeline > $R/pipeline-judges.log 2>&1 & judges=$!; }
  mkdir -p $R/grpo
  # a fixed KV cache for the judge server: with the judges training beside it, vLLM's memory profiling counts their
  # growth against its --gpu-memory-utilization share and refuses to start ("Available KV cache memory: -17 GiB")
  OUT=$R/grpo JUDGE_MODEL=default STEPS=${GRPO_STEPS:-40} CALL_BUDGET_S=${GRPO_BUDGET_S:-1500} \
    COMPEER_KV_CACHE_GIB=${JUDGE_KV_CACHE_GIB:-8} \
    TRAIN_ARGS="--prompt-set /tmp/loop-data/grpo_train.jsonl --set sft_warmup_dataset=/tmp/loop-data/warmup.jsonl
      --set log_completions_file=true" \
    bash tools/gpu/device_evidence.sh run > $R/grpo/run.log 2>&1
  local rc=$?
  [ -z "$judges" ] || wait $judges || rc=1
  return $rc
}

grpo() {  # $1: name under $R; the loop's prompts and warm-up, completions logged, against `compeer-reward serve`
  # with no judge flags (the GPU default judge) or --adapter $JUDGE_ADAPTER; WARMUP_FROM: reuse a run's warm-up
  mkdir -p $R/"$1"
  OUT=$R/"$1" RUN_DIR=$R/"$1"-run JUDGE_MODEL=default STEPS=${GRPO_STEPS:-30} CALL_BUDGET_S=${GRPO_BUDGET_S:-1500} \
    COMPEER_KV_CACHE_GIB=${JUDGE_KV_CACHE_GIB:-8} \
    TRAIN_ARGS="--prompt-set /tmp/loop-data/grpo_train.jsonl --set sft_warmup_dataset=/tmp/loop-data/warmup.jsonl
      --set log_completions_file=true" \
    bash tools/gpu/device_evidence.sh run > $R/"$1"/run.log 2>&1
}

adversarial() {  # issue 23's adversarial round, one card: (1) GRPO against the shipped judge, every completion
  # logged; (2) its hacks labelled by rule (compeer-data policy-negatives) and added to the committed policy-made
  # negatives; (3) the judge data rebuilt with them and the unified judge retrained (same profile and steps);
  # (4) side by side: the retrained and the shipped judge evaluated on the same valid items and contrast groups, and
  # a second GRPO run against the retrained judge from the first run's warm-up (only the judge differs)
  # ADV_NEGATIVES: the labelled negatives of (1)-(2), e.g. data_builder/data/policy_negatives_grpo_round2.jsonl (the
  # round of 2026-11-27): (1)-(2) are skipped
  vsite_path
  local new=${ADV_NEGATIVES:-$R/adv-pn/policy_negatives.jsonl}
  if [ -z "${ADV_NEGATIVES:-}" ]; then
    [ -f $R/grpo1-run/completions.jsonl ] || grpo grpo1 || return 1
    python3 -m data_builder.cli policy-negatives --quiet --from $R/grpo1-run \
      --dialogues train=$W/ingest-train/dialogues.jsonl --dialogues valid=$W/ingest-valid/dialogues.jsonl \
      --out $R/adv-pn || return 1
  fi
  [ -d $R/data2/emit/judge_sft ] || POLICY_NEGATIVES="data_builder/data/policy_negatives.jsonl $new" \
    bash tools/gpu/esconv_data.sh "$S"/esconv.tar.xz $R/data2 > $R/build2.log 2>&1 || { tail $R/build2.log; return 1; }
  local D2=$R/data2/emit/judge_sft shipped=$SHIPPED pids=() rc=0
  # the shipped judge measured beside the new one needs its weights in this call's tree (2026-11-30: a call made with
  # the slim tree of tools/gpu/slim.sh trained, but both of the shipped judge's measurements failed at once)
  if [ -n "${SHIPPED_CARD:-}" ] || [ "${SHIPPED_EVAL:-1}" = 1 ]; then
    has_weights adversarial $shipped ", or SHIPPED_EVAL=0 without SHIPPED_CARD" || return 1
  fi
  # the shipped judge's steps (its compeer_judge.json), so that only the training data differs
  local steps; steps=$(python3 -c 'import json; print(json.load(open("'$shipped'/compeer_judge.json"))["steps"])')
  # both judges as they ship (LoRA weights in bfloat16) on the same valid items and contrast groups; SHIPPED_CARD (a
  # card index): the shipped judge's two measurements run there at once, beside the training (a multi-GPU machine)
  local contrast=(--groups $R/data2/contrast/groups.jsonl --no-base --max-items "${CONTRAST_GROUPS:-120}")
  if [ -n "${SHIPPED_CARD:-}" ]; then
    CUDA_VISIBLE_DEVICES=$SHIPPED_CARD python3 -m reward_trainer.cli judge-eval --data "$D2" --out $R/eval-shipped \
      --adapter $shipped --adapter reply=$shipped --no-base "${EVAL[@]}" > $R/eval-shipped.log 2>&1 & pids+=($!)
    CUDA_VISIBLE_DEVICES=$SHIPPED_CARD python3 -m reward_trainer.cli judge-contrast "${contrast[@]}" \
      --out $R/contrast-shipped --adapter shipped=$shipped "${EVAL[@]}" > $R/contrast-shipped.log 2>&1 & pids+=($!)
  fi
  [ -d $R/unified-adv-bf16 ] || STEPS=${STEPS:-$steps} D=$D2 train unified unified-adv || return 1
  sha256sum $R/unified-adv-bf16/adapter_model.safetensors
  # ADV_EVAL=0: the retrained judge is neither measured again nor GRPO-trained against here (a rerun of a round
  # already measured, e.g. for a device_evidence.sh run against it: its committed figures hold if the sha256 above
  # matches theirs)
  if [ "${ADV_EVAL:-1}" != 1 ]; then for p in "${pids[@]}"; do wait "$p" || rc=1; done; return $rc; fi
  # SAVE_TEXTS=1: the retrained judge's outputs (rationales) in its predictions.jsonl too (judge-eval --save-texts)
  local texts=(); [ "${SAVE_TEXTS:-0}" = 1 ] && texts=(--save-texts)
  python3 -m reward_trainer.cli judge-eval --data "$D2" --out $R/eval-adv --adapter $R/unified-adv-bf16 \
    --adapter reply=$R/unified-adv-bf16 --no-base "${EVAL[@]}" "${texts[@]}" > $R/eval-adv.log 2>&1 & pids+=($!)
  if [ -n "${SHIPPED_CARD:-}" ]; then
    python3 -m reward_trainer.cli judge-contrast "${contrast[@]}" --out $R/contrast-adv \
      --adapter adversarial=$R/unified-adv-bf16 "${EVAL[@]}" > $R/contrast-adv.log 2>&1 & pids+=($!)
  else
    # SHIPPED_EVAL=0: the shipped judge's Table 1 is not measured again here (its per-item verdicts on the same
    # rebuilt valid items: docs/evaluations/judge-esconv/qwen15/steps-500/gpu-eval-adv); saves the card
    [ "${SHIPPED_EVAL:-1}" = 1 ] && { python3 -m reward_trainer.cli judge-eval --data "$D2" --out $R/eval-shipped \
      --adapter $shipped --adapter reply=$shipped --no-base "${EVAL[@]}" > $R/eval-shipped.log 2>&1 & pids+=($!); }
    # one process a judge, so that each judge's result is written (and collected) as soon as it is done; SHIPPED_EVAL=0
    # skips the shipped judge's contrast too (committed on the same 120 groups:
    # docs/evaluations/judge-esconv/qwen15/steps-500/gpu-contrast-120)
    python3 -m reward_trainer.cli judge-contrast "${contrast[@]}" --out $R/contrast-adv \
      --adapter adversarial=$R/unified-adv-bf16 "${EVAL[@]}" > $R/contrast-adv.log 2>&1 & pids+=($!)
    [ "${SHIPPED_EVAL:-1}" = 1 ] && { python3 -m reward_trainer.cli judge-contrast "${contrast[@]}" \
      --out $R/contrast-shipped --adapter shipped=$shipped "${EVAL[@]}" > $R/contrast-shipped.log 2>&1 & pids+=($!); }
  fi
  # the same warm-up as (1) where it is on this machine, else retrained with the same settings and seed
  local warm=""; [ -d $R/grpo1-run/warmup/adapter ] && warm=$R/grpo1-run
  # ADV_GRPO2=0 skips it (it needs the vLLM and SmolLM2 staging parts and ~9 min of the card)
  [ "${ADV_GRPO2:-1}" = 1 ] && { JUDGE_ADAPTER=$R/unified-adv-bf16 WARMUP_FROM=$warm grpo grpo2 & pids+=($!); }
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

calibrate() {  # issue 23's verdict temperature, one card: the shipped judge's raw label probabilities
  # (--verdict-temperature 1) on all valid items (Table 1, unified + reply) and on CONTRAST_GROUPS (120) contrast
  # groups, at once; `reward_trainer judge-calibrate` then fits a temperature per verdict kind on the Table 1 items
  # (cross-fitted by dialogue), recomputes the contrast under it, and writes it into a copy of the adapter
  # ($R/shipped-cal, e.g. for a GRPO run: JUDGE_ADAPTER). The data: the fourth round's (CAL_NEGATIVES; same sha256)
  local shipped=$SHIPPED pids=() rc=0
  has_weights calibrate $shipped || return 1
  [ -d $R/data2/emit/judge_sft ] || POLICY_NEGATIVES="data_builder/data/policy_negatives.jsonl ${CAL_NEGATIVES:-\
data_builder/data/policy_negatives_grpo_round2.jsonl data_builder/data/policy_negatives_grpo_round3.jsonl \
data_builder/data/policy_negatives_grpo_round5.jsonl.xz data_builder/data/policy_negatives_loop_valid_misfit.jsonl.xz}" \
    bash tools/gpu/esconv_data.sh "$S"/esconv.tar.xz $R/data2 > $R/build2.log 2>&1 || { tail $R/build2.log; return 1; }
  tail -n 3 $R/build2.log
  python3 -m reward_trainer.cli judge-eval --data $R/data2/emit/judge_sft --out $R/eval-raw --adapter $shipped \
    --adapter reply=$shipped --no-base --verdict-temperature 1 "${EVAL[@]}" > $R/eval-raw.log 2>&1 & pids+=($!)
  python3 -m reward_trainer.cli judge-contrast --groups $R/data2/contrast/groups.jsonl --no-base \
    --max-items "${CONTRAST_GROUPS:-120}" --out $R/contrast-raw --adapter shipped=$shipped --verdict-temperature 1 \
    "${EVAL[@]}" > $R/contrast-raw.log 2>&1 & pids+=($!)
  wait "${pids[0]}" || return 1
  rm -rf $R/shipped-cal && cp -r $shipped $R/shipped-cal
  python3 -m reward_trainer.cli judge-calibrate --predictions $R/eval-raw/predictions.jsonl --out $R/calibration \
    --write-adapter $R/shipped-cal > $R/calibration.log 2>&1 || { tail $R/calibration.log; return 1; }
  touch $R/CALIBRATED  # the adapter copy is ready (a GRPO call may start against it)
  wait "${pids[1]}" || rc=1
  python3 -m reward_trainer.cli judge-calibrate --predictions $R/eval-raw/predictions.jsonl --out $R/calibration \
    --contrast $R/contrast-raw/contrast.json --groups $R/data2/contrast/groups.jsonl >> $R/calibration.log 2>&1 || rc=1
  return $rc
}

contrast_shipped() {  # the shipped judge's reward AUC on the first CONTRAST_GROUPS (120) valid contrast groups, both
  # references (the figure the 400-step judge has on 40 groups from a CPU only; docs/evaluations/judge-esconv/qwen15).
  # CONTRAST_ADAPTER=NAME=PATH: a candidate judge's adapter instead (e.g. one committed under its results, copied into
  # .gpu-judge), into contrast-candidate; CONTRAST_GROUPS_FILE: groups built elsewhere (e.g. with the policy-made
  # negatives of a round, as the committed contrasts were: tools/gpu/esconv_data.sh with POLICY_NEGATIVES), carried
  local spec=${CONTRAST_ADAPTER:-shipped=$SHIPPED} out=contrast-shipped
  [ -z "${CONTRAST_ADAPTER:-}" ] || out=contrast-candidate
  has_weights contrast "${spec#*=}" "; a candidate's: carry them" || return 1
  python3 -m reward_trainer.cli judge-contrast --groups "${CONTRAST_GROUPS_FILE:-$W/contrast/groups.jsonl}" --no-base \
    --max-items "${CONTRAST_GROUPS:-120}" --out $R/$out --adapter "$spec" "${EVAL[@]}" > $R/$out.log 2>&1
}

has_weights() {  # $1: who asks, $2: an adapter folder, $3: more of the fix; fails naming the fix when the folder's
  # weights are not in this call's tree (tools/gpu/slim.sh hide sets the shipped ones aside)
  [ -f "$2"/adapter_model.safetensors ] && return 0
  echo "$1: $2 has no weights in this tree (bash tools/gpu/slim.sh weights, or slim.sh restore, before this call${3:-})" >&2
  return 1
}

to_bf16() { python3 tools/gpu/adapter_bf16.py "$1"; }  # $1 -> $1-bf16 (LoRA weights shipped in bfloat16)

collect() {  # what is finished, to $OUT (8 files at most, 16 MiB each): logs, metrics, the unified adapter in parts
  cp $R/pipeline.log "$OUT"/ 2>/dev/null
  grep -hE "'loss'|train_runtime|resuming" $R/train-*.log > "$OUT"/train.txt 2>/dev/null
  tail -n 5 $R/*.log > "$OUT"/tails.txt 2>/dev/null
  local d=(); for x in eval-unified eval-prm-orm contrast-trained contrast-base unified/compeer_judge.json prm/compeer_judge.json \
      orm/compeer_judge.json data/counts.txt data/cues.txt bench.log judge_bases_cuda.json pipeline-judges.log grpo \
      grpo1 grpo2 adv-pn data2/counts.txt data2/cues.txt build2.log eval-adv eval-shipped contrast-adv contrast-shipped \
      unified-adv/compeer_judge.json eval-raw contrast-raw contrast-candidate calibration shipped-cal/compeer_judge.json; do
    [ -e $R/$x ] && d+=("$x"); done
  [ ${#d[@]} -gt 0 ] && tar -cf "$OUT"/evals.tar -C $R --exclude=predictions.jsonl "${d[@]}"
  # the two judges' per-item verdicts on the same valid items (for a paired comparison), xz-compressed
  local p=(); for x in eval-adv eval-shipped eval-raw; do [ -f $R/$x/predictions.jsonl ] && p+=("$x/predictions.jsonl"); done
  [ ${#p[@]} -gt 0 ] && tar -cJf "$OUT"/predictions.tar.xz -C $R "${p[@]}"
  if [ -d $R/"${ADAPTER:-unified}"-bf16 ]; then  # one adapter a call: ADAPTER=prm / orm for the others
    tar -cf - -C $R "${ADAPTER:-unified}"-bf16 | split -b 15M -d - "$OUT"/"${ADAPTER:-unified}"-adapter.tar.part-
  fi
}

wait_pipeline() {
  local T0=${CALL_T0:-$(date +%s)} budget=${CALL_BUDGET_S:-560}  # CALL_T0: as in compeer_loop.sh
  while [ ! -f $R/DONE ] && [ $(( $(date +%s) - T0 )) -lt "$budget" ]; do sleep 10; done
  collect
  if [ -f $R/DONE ]; then echo "pipeline finished: $(cat $R/DONE)"; else echo "pipeline still running"; fi
  tail -n 3 $R/pipeline.log $R/adversarial.log 2>/dev/null; ls $R; grep -h "step [0-9]*/" $R/grpo*/train.log 2>/dev/null | tail -n 2
  grep -h "'loss'" $R/train-*.log 2>/dev/null | tail -n 3; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
}

prepare() {  # the base converted once (bf16), the data built once ($1 = nodata: not the data, e.g. an adversarial
  # round from labelled negatives, which builds its own)
  [ -f "$S"/esconv.tar.xz ] || cp .gpu-judge/esconv.tar.xz "$S"/ || { echo "carry .gpu-judge" >&2; return 1; }
  python3 -c 'import transformers, peft; print("transformers", transformers.__version__, "peft", peft.__version__)'
  python3 -m judge.model_store bfloat16 --model "$MODEL" --adapter none || return 1
  [ -d "$D" ] || [ "${1:-}" = nodata ] && return 0
  bash tools/gpu/esconv_data.sh "$S"/esconv.tar.xz $W > $R/build.log 2>&1 || { tail -20 $R/build.log; return 1; }
  tail -n 3 $R/build.log
}

case "${1:?prepare|probe|start|finish|adversarial|contrast|calibrate|wait|pipeline|collect}" in
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
finish|adversarial|contrast|calibrate)  # prepare, then finish() / adversarial() / contrast_shipped() in the background
  # (`$1-run`, log $R/$1.log); waits like `wait` (carry .gpu-judge, .gpu-loop, compeer_proto; contrast: .gpu-judge
  # alone; adversarial after tools/gpu/vllm_judge.sh stage, and `ADAPTER=unified-adv collect` brings its retrained
  # adapter)
  # an adversarial round from labelled negatives (ADV_NEGATIVES) needs only its rebuilt data (~60 s less)
  if { [ "$1" = adversarial ] && [ -n "${ADV_NEGATIVES:-}" ]; } || [ "$1" = calibrate ] \
    || { [ "$1" = contrast ] && [ -n "${CONTRAST_GROUPS_FILE:-}" ]; }; then prepare nodata || exit 1
  else prepare || exit 1; fi
  # the generated gRPC code (carry compeer_proto) kept where the background run finds it whatever later calls carry
  [ -f compeer_proto/reward/v1/reward_pb2.py ] && cp -r compeer_proto /tmp/site/
  [ "$1" = contrast ] || [ "$1" = calibrate ] || [ -f /tmp/loop-data/grpo_train.jsonl ] || { mkdir -p /tmp/loop-data && tar -xJf \
    .gpu-loop/loop-data.tar.xz -C /tmp/loop-data; } || { echo "carry .gpu-loop (tools/gpu/compeer_loop.sh pack)" >&2; exit 1; }
  setsid nohup bash -c 'T0=$(date +%s); if bash tools/gpu/judge_qwen.sh '"$1"'-run; then r=ok; else r=FAILED; fi
    echo "$r after $(( $(date +%s) - T0 )) s" > '$R'/DONE' > $R/"$1".log 2>&1 < /dev/null &
  sleep 5
  wait_pipeline
  ;;
finish-run)
  finish
  ;;
adversarial-run)
  adversarial
  ;;
contrast-run)
  contrast_shipped
  ;;
calibrate-run)
  calibrate
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
