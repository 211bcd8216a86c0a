#!/usr/bin/env bash
# The ESConv judge on a lent GPU machine (issue 11): build the data from the real ESConv splits, train the unified
# judge (+ the reply mode) and the PRM-only and ORM-only variants with the same rows and steps, and measure them on
# the valid split (Table 1 columns, then the reward AUC on contrast groups). No registry, no hub there; 64 MiB per
# call. Staging, here, after `make install`:
#   bash tools/gpu/stage.sh        # .gpu-policy/c1 (wheels), g1 .. gN (SmolLM2 GGUF parts), c6 .. (MiniLM parts)
#   bash tools/gpu/judge_esconv.sh pack     # .gpu-judge/esconv.tar.xz: the ESConv train and valid splits
# Then consecutive `run` calls (each within the warm window of the previous one; docs/reward_trainer.md has them):
#   install  carry .gpu-policy/c1                    wheels into /tmp/site
#   stage    carry one of .gpu-policy/g1 .. gN, c6 ..  the GGUF parts and MiniLM, one folder a call; .gpu-judge (the
#            or .gpu-judge                           ESConv splits) with any of them
#   start    (no carry)                              joins and checks the GGUF (device_evidence.sh prepare),
#                                                    converts the base model, builds the data, starts the
#                                                    pipeline in the background (setsid) and waits like `wait`
#   wait     (no carry)                              waits up to CALL_BUDGET_S (default 560) for the pipeline;
#                                                    copies what is finished to $OUT
# The pipeline (background, log in /tmp/judge-run/pipeline.log): train unified -> evaluate it (unified, reply;
# base and majority rows) -> contrast (trained on every group) and PHASES (default "base prm-orm grpo"): contrast
# of the base judge on the first 150 groups; train prm, orm and evaluate them; GRPO evidence with the trained judge
# (tools/gpu/device_evidence.sh run, GRPO_BUDGET_S) -> DONE. Steps: STEPS (default: the profile's).
set -uo pipefail
S=/tmp/cp-stage R=/tmp/judge-run
mkdir -p "$S" "$R"
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export COMPEER_CACHE=/tmp/compeer-cache COMPEER_GGUF_DIR=$S TQDM_DISABLE=1
W=$R/data
EVAL=(--device cuda --max-batch 128 --concurrency 128 --no-audit)

pipeline() {
  local D=$W/emit/judge_sft STEPS_ARG=()
  [ -n "${STEPS:-}" ] && STEPS_ARG=(--max-steps "$STEPS")
  python3 -m reward_trainer.cli judge --config gpu-esconv --variant unified --data "$D" --out $R/unified \
    "${STEPS_ARG[@]}" > $R/train-unified.log 2>&1 || return 1
  python3 -m reward_trainer.cli judge-eval --data "$D" --out $R/eval-unified --adapter $R/unified \
    --adapter reply=$R/unified "${EVAL[@]}" > $R/eval-unified.log 2>&1 || return 1
  python3 -m reward_trainer.cli judge-contrast --groups $W/contrast/groups.jsonl --out $R/contrast-trained \
    --adapter trained=$R/unified --no-base "${EVAL[@]}" > $R/contrast-trained.log 2>&1 || return 1
  case " ${PHASES:-base prm-orm grpo} " in *" base "*)
    python3 -m reward_trainer.cli judge-contrast --groups $W/contrast/groups.jsonl --out $R/contrast-base \
      --max-items 150 "${EVAL[@]}" > $R/contrast-base.log 2>&1 || return 1 ;; esac
  case " ${PHASES:-base prm-orm grpo} " in *" prm-orm "*)
    for v in prm orm; do
      python3 -m reward_trainer.cli judge --config gpu-esconv --variant $v --data "$D" --out $R/$v \
        "${STEPS_ARG[@]}" > $R/train-$v.log 2>&1 || return 1
    done
    python3 -m reward_trainer.cli judge-eval --data "$D" --out $R/eval-prm-orm --adapter $R/prm --adapter $R/orm \
      "${EVAL[@]}" > $R/eval-prm-orm.log 2>&1 || return 1 ;; esac
  case " ${PHASES:-base prm-orm grpo} " in *" grpo "*)
    # GRPO evidence with this judge: tools/gpu/device_evidence.sh run, the judge = base + this adapter
    # (transformers judge: this pipeline does not stage vLLM; tools/gpu/vllm_judge.sh does)
    mkdir -p $R/grpo && OUT=$R/grpo JUDGE_ADAPTER=$R/unified CALL_BUDGET_S=${GRPO_BUDGET_S:-600} \
      JUDGE_BACKEND=${JUDGE_BACKEND:-transformers} \
      bash tools/gpu/device_evidence.sh run > $R/grpo.log 2>&1 || return 1 ;; esac
}

build_data() { bash tools/gpu/esconv_data.sh $S/esconv.tar.xz $W; }

collect() {  # what is finished, to $OUT (8 files at most, 16 MiB each)
  cp $R/pipeline.log "$OUT"/ 2>/dev/null
  grep -hE "'loss'|train_runtime|\"adapter\"|summary|auc" $R/*.log > "$OUT"/results.txt 2>/dev/null
  [ -f $R/unified/adapter_model.safetensors ] && to_bf16 $R/unified
  [ -d $R/unified-bf16 ] && tar -cf "$OUT"/unified-adapter.tar -C $R unified-bf16
  [ -d $R/grpo ] && tar -cf "$OUT"/grpo.tar -C $R grpo  # logs too when the phase failed
  local d=(); for x in eval-unified contrast-trained contrast-base eval-prm-orm prm/compeer_judge.json orm/compeer_judge.json; do
    [ -e $R/$x ] && d+=("$x"); done
  [ ${#d[@]} -gt 0 ] && tar -cf "$OUT"/evals.tar -C $R --exclude=predictions.jsonl "${d[@]}"
  tail -n 5 $R/*.log > "$OUT"/tails.txt 2>/dev/null
}

to_bf16() { python3 tools/gpu/adapter_bf16.py "$1"; }  # $1 -> $1-bf16 (LoRA weights shipped in bfloat16)

judges() {  # $@: variants (default prm orm), trained one after the other with the shipped judge's profile and steps
  local D=$W/emit/judge_sft
  [ -d "$D" ] || build_data > $R/build.log 2>&1 || return 1
  for v in ${@:-prm orm}; do
    [ -f $R/$v-bf16/adapter_config.json ] && continue
    python3 -m reward_trainer.cli judge --config gpu-esconv --variant $v --data "$D" --out $R/$v \
      > $R/train-$v.log 2>&1 && to_bf16 $R/$v || return 1
  done
}

wait_pipeline() {
  local T0=${CALL_T0:-$(date +%s)} budget=${CALL_BUDGET_S:-560}  # CALL_T0: as in compeer_loop.sh
  while [ ! -f $R/DONE ] && [ $(( $(date +%s) - T0 )) -lt "$budget" ]; do sleep 10; done
  collect
  if [ -f $R/DONE ]; then echo "pipeline finished: $(cat $R/DONE)"; else echo "pipeline still running"; fi
  tail -n 3 $R/pipeline.log
}

case "${1:?pack|install|stage|start|wait|pipeline|judges}" in
pack)  # here, not on the device
  X=$(git rev-parse --git-path info/exclude) && mkdir -p .gpu-judge "$(dirname "$X")"
  grep -qx '/.gpu-judge/' "$X" 2>/dev/null || echo '/.gpu-judge/' >> "$X"
  tar -cJf .gpu-judge/esconv.tar.xz -C "${ESCONV_DIR:-../shared/data/esconv}" train.json valid.json
  ls -l .gpu-judge
  ;;
install)
  bash tools/gpu/device_evidence.sh install
  ;;
stage)
  bash tools/gpu/device_evidence.sh stage || exit 1
  if [ -f .gpu-judge/esconv.tar.xz ]; then cp .gpu-judge/esconv.tar.xz "$S"/ || exit 1; fi
  ;;
start)
  [ -f "$S"/esconv.tar.xz ] || { echo "carry .gpu-judge on a stage call first" >&2; exit 1; }
  bash tools/gpu/device_evidence.sh prepare || exit 1  # the GGUF joined and checked, MiniLM for the GRPO phase
  python3 -m judge.model_store bfloat16 --adapter none || exit 1
  build_data || exit 1
  setsid nohup bash tools/gpu/judge_esconv.sh pipeline > $R/pipeline.log 2>&1 < /dev/null &
  sleep 5
  wait_pipeline
  ;;
judges)  # for tools/gpu/compeer_loop.sh (arm f): ESConv in $S/esconv.tar.xz and the base converted beforehand;
  # trains the variants named (default prm orm) into $R/<variant> and their bfloat16 copies $R/<variant>-bf16
  shift
  T0=$(date +%s)
  if judges "$@"; then echo "ok after $(( $(date +%s) - T0 )) s" > $R/JUDGES_DONE
  else echo "FAILED after $(( $(date +%s) - T0 )) s (see $R/build.log, $R/train-*.log)" > $R/JUDGES_DONE; fi
  ;;
pipeline)
  T0=$(date +%s)
  if pipeline; then echo "ok after $(( $(date +%s) - T0 )) s" > $R/DONE; else echo "FAILED after $(( $(date +%s) - T0 )) s" > $R/DONE; fi
  ;;
wait)
  wait_pipeline
  ;;
esac
