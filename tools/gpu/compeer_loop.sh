#!/usr/bin/env bash
# The COMPEER loop (issue 17) on a lent GPU machine: the policy arms trained (max_concurrent_arms at once), then
# evaluated. One GPU: everything shares it. Several (e.g. kind nvidia-h100-x4): the driver puts the judge servers and
# the evaluations on the first card and one arm on each other card (CUDA_VISIBLE_DEVICES per process; the phases
# below are the same). Before each GRPO arm trains, the driver checks its judge server's Info against the plan and
# probes it (ROOT/<arm>/judge.json); each arm records the machine and card it ran on (ROOT/<arm>/machine.json).
# No registry, no hub there; 64 MiB per `run` call, 10 min per call. Here, after `make install`:
#   bash tools/gpu/stage.sh              # .gpu-policy/c1 (wheels), g1 .. gN (SmolLM2 GGUF parts), c6 .. (MiniLM parts)
#   bash tools/gpu/compeer_loop.sh pack  # .gpu-loop/loop-data.tar.xz: prompt sets built from ../shared/data/esconv
# Then consecutive `run` calls (each within the warm window of the previous one; docs/compeer_loop.md has them):
#   install  carry .gpu-policy/c1                  wheels into /tmp/site (then tools/gpu/vllm_judge.sh install with
#                                                  each of g1 .. gN, c6 .. and, for the 1.5B judge, .gpu-qwen/qNN)
#   stage    carry .gpu-loop                       the prompt sets
#   start    (carry compeer_proto)                 GGUF -> HF folders (base, merged trained judge), MiniLM; writes the
#                                                  plan (STEPS, ARMS, LOOP_ARGS; VLLM=1: the arms generate with
#                                                  TRL's colocated vLLM and the judges serve on vLLM, after
#                                                  tools/gpu/vllm_judge.sh install with every .gpu-vllm part) and starts the driver in the
#                                                  background (setsid): reward servers, warm-up, the GRPO arms
#                                                  (max_concurrent_arms at once), evaluation; then waits like `wait`
#            SEEDS='0 1 2' on start: seed replicates, one loop folder each ($L/seedK, planned --seed K; `base` is
#                                                  evaluated in the first only), run by one driver on the same judge
#                                                  servers: in turn on one arm card (each folder's evaluations overlap
#                                                  the next one's training), side by side with several arm cards (one
#                                                  each; --cards in LOOP_ARGS); wait/resume/stop and $OUT cover every folder
#                                                  (seedK/ in results.tar.xz); export/import move one folder (no SEEDS)
#            SEED_ARGS_K='...' on start (with SEEDS): plan arguments for seed K's folder only, after LOOP_ARGS (what
#                                                  seed replicates may differ in: --max-concurrent-arms, --cards,
#                                                  --eval-policies ...; e.g. on 2 cards `--cards 0 1 0` trains the
#                                                  second seed beside the judges on card 0, one arm at a time there:
#                                                  SEED_ARGS_2='--max-concurrent-arms 1')
#   wait     (no carry)                            waits until CALL_BUDGET_S (default 540) s into the call, prints
#                                                  the status, packs what is finished to $OUT
#   resume   (no carry)                            starts the driver again if it is not running (a killed driver or
#                                                  arm continues from its checkpoints), then waits like `wait`
#   stop     (no carry)                            stops the driver and the reward servers, packs to $OUT
#   probe    (carry compeer_proto, after install    arm (a)'s warm-up alone, no judge, then the base and warm-up
#            and stage)                            policies' answers to the eval prompts (format, strategy) in the
#                                                  background; waits like probe-wait, which packs probe.tar.xz to $OUT
# Across machines (one is held 30 min at most; /tmp is lost with it):
#   TRAIN_JUDGES='prm orm' on `start` (with ARMS=a) also trains the PRM and ORM judges for arm (f) in the background
#     (tools/gpu/judge_esconv.sh judges: the shipped judge's profile and steps; needs .gpu-judge carried on `stage`,
#     from `bash tools/gpu/judge_esconv.sh pack`)
#   export   (no carry)                            packs arm (a)'s warm-up adapter (float32, exact), the PRM/ORM
#                                                  judges (bfloat16) and each GRPO arm's final adapter or newest
#                                                  complete checkpoint with its metrics and completions (the arm is
#                                                  marked EXPORTED here) in 15 MiB parts + export.sha256; each call
#                                                  sends the next 56 MiB of parts to $OUT: repeat until it says done
#   import   carry .gpu-import/iN                  here the parts go in .gpu-import/i1, i2, ... (48 MB each at most);
#                                                  copies them to the device; once all are there (checked against
#                                                  export.sha256) restores the warm-up (arm a is done, never
#                                                  retrained) and the arms (the driver resumes one from its
#                                                  checkpoint); `start` sets PRM_ADAPTER/ORM_ADAPTER
# $OUT gets at most 4 files: status.txt, results.tar.xz (plan, state, the RESTORED and EXPORTED marks, every arm's
# metrics.jsonl, summary.json,
# judge.json and machine.json, completions.jsonl where LOOP_ARGS has --grpo-sets log_completions_file=true, every
# evaluation's records.jsonl, esc.json and done.json, the prompt manifest),
# logs.tar.xz (log tails), driver.log.
set -uo pipefail
. "$(dirname "$0")/vsite.sh"  # vsite_check / vsite_path / vsite_use: the staged vLLM
S=/tmp/cp-stage L=${LOOP_ROOT:-/tmp/loop} D=${LOOP_DATA:-/tmp/loop-data}
X=${EXPORT_DIR:-/tmp/cp-export} I=${IMPORT_DIR:-/tmp/cp-import} J=/tmp/judge-run
mkdir -p "$S" "$L"
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export COMPEER_CACHE=/tmp/compeer-cache COMPEER_GGUF_DIR=$S TQDM_DISABLE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
LOOP="${PY:-python3} -m compeer_loop.cli"
# CALL_BUDGET_S counts from here (the whole call, whatever its phase did before waiting), or from CALL_T0 when set:
# `export CALL_T0=$(date +%s)` first when one call runs several scripts, so they share the call's budget
T_CALL=${CALL_T0:-$(date +%s)}

driver_alive() { [ -f $L/driver.pid ] && kill -0 "$(cat $L/driver.pid)" 2>/dev/null; }

# the loop folders one driver runs: $L itself, or with SEEDS on `start` one folder per seed, $L/seedK (seed
# replicates on the same judge servers, compeer_loop/replicates.py), listed in $L/roots.txt for the later phases
roots() { if [ -f $L/roots.txt ]; then cat $L/roots.txt; else echo $L; fi; }
all_done() { local r; for r in $(roots); do [ -f "$r"/DONE ] || return 1; done; }

vllm_path() {  # a plan with `generation` or `judge_backend` vllm (VLLM=1 on `start`): vLLM from /tmp/vsite first
  grep -q '"vllm"' "$(roots | head -n 1)"/plan.json 2>/dev/null || return 0
  vsite_use "the plan (it generates or judges on vLLM)"
}

start_driver() {
  driver_alive && { echo "driver already running (pid $(cat $L/driver.pid))"; return 0; }
  vllm_path || return 1
  local r a=(); for r in $(roots); do a+=(--root "$r"); done
  setsid nohup $LOOP run "${a[@]}" >> $L/driver.log 2>&1 < /dev/null &
  echo $! > $L/driver.pid
  echo "driver started (pid $!)"
}

collect() {  # what is finished, to $OUT (with SEEDS: each seed's folder seedK/ in the same archives)
  [ -n "${OUT:-}" ] || return 0
  local r x rel f=()
  : > "$OUT"/status.txt; : > $L/log-tails.txt
  for r in $(roots); do
    rel=${r#$L}; rel=${rel#/}; rel=${rel:+$rel/}
    { [ -n "$rel" ] && echo "== $rel"; $LOOP status --root "$r"; } >> "$OUT"/status.txt 2>&1
    for x in plan.json state.json DONE; do [ -f "$r/$x" ] && f+=("$rel$x"); done
    for x in $r/a/RESTORED $r/*/EXPORTED $r/a/warmup/adapter/adapter_config.json $r/*/metrics.jsonl $r/*/completions.jsonl $r/*/summary.json $r/*/judge.json $r/*/machine.json $r/eval/*/records.jsonl $r/eval/*/esc.json $r/eval/*/done.json; do
      [ -f "$x" ] && f+=("$rel${x#$r/}"); done
    cp $D/manifest.json $r/prompts-manifest.json 2>/dev/null && f+=("${rel}prompts-manifest.json")
    ( cd $r && for x in logs/*.log; do [ -f "$x" ] && { echo "== $rel$x"; tail -n 60 "$x"; }; done ) >> $L/log-tails.txt 2>/dev/null
  done
  ( cd $L && ls "${f[@]}" 2>/dev/null | tar -cJf "$OUT"/results.tar.xz -T - )
  tar -cJf "$OUT"/logs.tar.xz -C $L log-tails.txt 2>/dev/null
  tail -n 200 $L/driver.log > "$OUT"/driver.log 2>/dev/null
  ls -l "$OUT"
}

wait_driver() {
  local budget=${CALL_BUDGET_S:-540}
  while ! all_done && driver_alive && [ $(( $(date +%s) - T_CALL )) -lt "$budget" ]; do sleep "${POLL_S:-15}"; done
  local r; for r in $(roots); do echo "== $r"; $LOOP status --root "$r"; done
  nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
  if [ -f $L/judges.log ]; then  # TRAIN_JUDGES
    echo "judges: $(cat $J/JUDGES_DONE 2>/dev/null || echo running)"
    for f in $J/train-*.log; do [ -f "$f" ] && echo "$f: $(grep -oE "'loss': [0-9.]+|'epoch': [0-9.]+|train_runtime[^,]*" "$f" | tail -n 3 | tr '\n' ' ')"; done
  fi
  collect
}

export_parts() {  # what a later machine needs, in parts of at most 15 MiB, then up to 56 MiB of them per call
  if [ ! -f $X/export.sha256 ]; then
    [ -f $L/a/warmup/adapter/adapter_config.json ] || { echo "export: arm (a) has no warm-up adapter yet"; return 1; }
    if [ -f $L/judges.log ] && [ ! -f $J/JUDGES_DONE ]; then echo "export: the judges are still training"; return 1; fi
    mkdir -p $X/tmp && tar -cf $X/tmp/warmup.tar -C $L a/warmup/adapter || return 1
    for v in prm orm; do [ -f $J/$v-bf16/adapter_config.json ] && { tar -cf $X/tmp/$v-bf16.tar -C $J $v-bf16 || return 1; }; done
    export_arms || return 1
    ( cd $X/tmp && sha256sum *.tar > ../export.sha256 && for t in *.tar; do split -b 15M -d "$t" "../$t.part-"; done ) || return 1
    rm -rf $X/tmp; touch $X/sent.txt
  fi
  local n=0 bytes=0 f sz
  for f in $X/export.sha256 $X/*.part-*; do
    grep -qx "$(basename "$f")" $X/sent.txt && continue
    sz=$(stat -c %s "$f")
    [ $n -ge 7 ] || [ $(( bytes + sz )) -gt $(( 56 * 1048576 )) ] && break
    cp "$f" "$OUT"/ && echo "$(basename "$f")" >> $X/sent.txt && n=$((n + 1)) bytes=$((bytes + sz))
  done
  local left=$(( $(ls $X/export.sha256 $X/*.part-* | wc -l) - $(wc -l < $X/sent.txt) ))
  echo "export: sent $n files ($bytes bytes) this call; $left left$([ $left -eq 0 ] && echo ': done')"
}

export_arms() {  # each GRPO arm that trained here: its final adapter, or else its latest complete checkpoint, with its
  # metrics, completions and launch record (arm-<name>.tar); the arm is then marked EXPORTED here: the machine that
  # imports it continues it (--resume from that checkpoint) and `compeer-loop merge` takes the arm from there
  local arm dir ck
  for dir in $L/[b-f]; do
    [ -d "$dir" ] || continue
    arm=$(basename "$dir") ck=
    if [ -f "$dir"/final/adapter_config.json ]; then ck=final
    else  # the newest checkpoint whose trainer state was written (a checkpoint being saved is skipped)
      ck=$(cd "$dir" && ls -d checkpoint-* 2>/dev/null | sort -t- -k2 -n | while read -r c; do
        [ -f "$c"/trainer_state.json ] && echo "$c"; done | tail -n 1)
    fi
    [ -n "$ck" ] || continue
    ( cd $L && { ls -d "$arm/$ck" $arm/metrics.jsonl $arm/completions*.jsonl $arm/machine.json 2>/dev/null || true; } \
      | tar -cf $X/tmp/arm-$arm.tar -T - ) || return 1  # (ls fails on the files an arm does not have)
    touch "$dir"/EXPORTED && echo "export: arm $arm ($ck)"
  done
}

join_parts() {  # the exported files joined from their parts and checked against export.sha256 (1: some missing)
  [ -f $I/export.sha256 ] && ( cd $I && for t in $(awk '{print $2}' export.sha256); do
    cat "$t".part-* > "$t" 2>/dev/null || exit 1; done && sha256sum --quiet -c export.sha256 >/dev/null 2>&1 )
}

import_parts() {  # restore what an earlier machine exported (checked against its export.sha256)
  [ -f $I/export.sha256 ] || return 0
  join_parts || { echo "import: parts missing or damaged"; return 1; }
  if [ ! -f $L/a/warmup/adapter/adapter_config.json ]; then  # RESTORED: compeer-loop merge knows a was not trained here
    tar -xf $I/warmup.tar -C $L && grep warmup.tar $I/export.sha256 > $L/a/RESTORED || return 1
  fi
  local t arm
  for t in $(awk '{print $2}' $I/export.sha256 | grep '^arm-'); do  # GRPO arms to continue here (or evaluate)
    arm=${t#arm-} && arm=${arm%.tar}
    if [ ! -d $L/$arm ]; then tar -xf $I/$t -C $L && echo "import: arm $arm restored" || return 1; fi
  done
  mkdir -p $S/judges && for v in prm orm; do [ -f $I/$v-bf16.tar ] && { tar -xf $I/$v-bf16.tar -C $S/judges || return 1; }; done
  [ -d $S/judges/prm-bf16 ] && [ -d $S/judges/orm-bf16 ] && PRM_ADAPTER=${PRM_ADAPTER:-$S/judges/prm-bf16} \
    ORM_ADAPTER=${ORM_ADAPTER:-$S/judges/orm-bf16}
  echo "import: warm-up restored in $L/a/warmup/adapter${PRM_ADAPTER:+; PRM $PRM_ADAPTER, ORM ${ORM_ADAPTER:-}}"
}

warmup_probe() {  # arm (a) alone, no judge: the warm-up (issue 26 item 2), then the base policy's and the warm-up
  # policy's greedy answers to the eval prompts (evaluator harness: format, named strategy), in $L/eval/NAME/answers.jsonl
  $LOOP plan --root $L --prompts $D --arms a --eval-policies base a --independent-scorer none --esc-cards 0 \
    --embedding-model "$S"/minilm-q8 ${LOOP_ARGS:-} || return 1
  [ -f $L/a/warmup/adapter/adapter_config.json ] || $LOOP warmup --root $L || return 1
  python3 - $L "${PROBE_POLICIES:-a base}" <<'PY'
import asyncio, json, sys, time
from pathlib import Path
from compeer_loop.evaluate import generate
from compeer_loop.runner import load_settings
root = Path(sys.argv[1]); s = load_settings(root)
for name in sys.argv[2].split():  # PROBE_POLICIES (default "a base"): the policies answering
    out = root / "eval" / name; out.mkdir(parents=True, exist_ok=True); t0 = time.time()
    records = asyncio.run(generate(root, s, name, out))
    with (out / "answers.jsonl").open("w") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    print(f"{name}: {len(records)} answers in {time.time() - t0:.0f} s", flush=True)
PY
}

probe_collect() {
  ( cd $L && ls plan.json a/warmup/stats.json a/*.log eval/*/answers.jsonl probe.log 2>/dev/null \
    | tar -cJf "$OUT"/probe.tar.xz -T - ); tail -n 15 $L/probe.log; ls -l "$OUT"
}

case "${1:?pack|install|stage|start|wait|resume|stop|export|import|probe|probe-wait}" in
probe)  # the warm-up probe in the background (setsid), then waits like probe-wait
  prepare_policy() { bash tools/gpu/device_evidence.sh prepare && python3 -m judge.model_store bfloat16 --model smollm2-135m --adapter none; }
  rm -f $L/PROBE_DONE  # a failed try's outcome, not this one's
  prepare_policy > $L/probe.log 2>&1 || { tail $L/probe.log; exit 1; }
  T=$(declare -f warmup_probe); setsid nohup bash -c "$(declare -p L D S LOOP); $T; T0=\$(date +%s); \
    if warmup_probe; then r=ok; else r=FAILED; fi; echo \"\$r after \$(( \$(date +%s) - T0 )) s\" > $L/PROBE_DONE" \
    >> $L/probe.log 2>&1 < /dev/null &
  ;&
probe-wait)
  while [ ! -f $L/PROBE_DONE ] && [ $(( $(date +%s) - T_CALL )) -lt "${CALL_BUDGET_S:-540}" ]; do sleep 10; done
  cat $L/PROBE_DONE 2>/dev/null; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
  probe_collect
  ;;
pack)  # here, not on the device
  X=$(git rev-parse --git-path info/exclude) && mkdir -p .gpu-loop "$(dirname "$X")" || exit 1
  grep -qx '/.gpu-loop/' "$X" 2>/dev/null || echo '/.gpu-loop/' >> "$X"   # a worktree shares the main exclude file
  E=${ESCONV_DIR:-../shared/data/esconv}
  rm -rf .gpu-loop/data && .venv/bin/python -m compeer_loop.cli prompts --train "$E"/train.json \
    --valid "$E"/valid.json --out .gpu-loop/data ${PROMPT_ARGS:-} || exit 1
  tar -cJf .gpu-loop/loop-data.tar.xz -C .gpu-loop/data . && rm -rf .gpu-loop/data
  ls -l .gpu-loop
  ;;
install)  # wheels into /tmp/site and the GGUF part carried, as for the GRPO evidence run
  bash tools/gpu/device_evidence.sh install
  ;;
stage)
  bash tools/gpu/device_evidence.sh stage && mkdir -p $D && tar -xJf .gpu-loop/loop-data.tar.xz -C $D && ls -l $D \
    || exit 1
  if [ -f .gpu-judge/esconv.tar.xz ]; then cp .gpu-judge/esconv.tar.xz "$S"/ || exit 1; fi  # for TRAIN_JUDGES
  ;;
import)  # the parts carried; once all are here (export.sha256 checks them) the warm-up and the arms are restored
  mkdir -p $I && cp .gpu-import/*/* $I/ && ls -l $I
  if join_parts; then import_parts || exit 1; else echo "import: not all parts here yet"; fi
  ;;
export)
  [ -n "${OUT:-}" ] || { echo "export: no \$OUT"; exit 1; }
  export_parts
  ;;
start)
  if [ -n "${TRAIN_JUDGES:-}" ]; then
    [ -f "$S"/esconv.tar.xz ] || { echo "TRAIN_JUDGES needs .gpu-judge carried on stage"; exit 1; }
    # the PRM judge's training held 64.5 GB of the H200: beside a GRPO arm (up to 74 GB) it runs the arm out of memory
    [ "${ARMS:-}" = a ] || { echo "TRAIN_JUDGES runs with ARMS=a only (the warm-up): no GRPO arm beside it"; exit 1; }
  fi
  bash tools/gpu/device_evidence.sh prepare || exit 1   # the GGUF (sha256 checked) and MiniLM (fp32) in $S
  python3 -m judge.model_store bfloat16 --model smollm2-135m --adapter none || exit 1   # the policy's base
  # the judges: the GPU default judge base (qwen2.5-coder-1.5b since issue 23: its parts staged first with
  # `vllm_judge.sh install` and .gpu-qwen/qNN, one a call) bare (arm b) and with its shipped adapter merged
  python3 -m judge.model_store bfloat16 --device cuda --adapter none || exit 1
  python3 -m judge.model_store bfloat16 --device cuda || exit 1
  import_parts || exit 1
  if [ -n "${TRAIN_JUDGES:-}" ]; then
    setsid nohup bash tools/gpu/judge_esconv.sh judges $TRAIN_JUDGES > $L/judges.log 2>&1 < /dev/null &
    echo "judges $TRAIN_JUDGES: training in the background (log $J/train-*.log, outcome $J/JUDGES_DONE)"
  fi
  ARGS=(--prompts $D --steps "${STEPS:-30}" --embedding-model "$S"/minilm-q8)
  [ -n "${ARMS:-}" ] && ARGS+=(--arms $ARMS)
  [ "${VLLM:-0}" = 1 ] && ARGS+=(--generation vllm --judge-backend vllm)  # TRL's colocated vLLM, vLLM judges
  [ -n "${PRM_ADAPTER:-}" ] && ARGS+=(--prm-adapter "$PRM_ADAPTER" --orm-adapter "${ORM_ADAPTER:?ORM_ADAPTER too}")
  if [ -n "${SEEDS:-}" ]; then  # seed replicates: $L/seedK each, planned --seed K; `base` (greedy, no training:
    # the same answers under every seed) is evaluated in the first folder only
    : > $L/roots.txt; first=1
    for k in $SEEDS; do
      mkdir -p $L/seed$k && echo $L/seed$k >> $L/roots.txt
      extra=(); [ $first = 1 ] || extra=(--eval-policies ${ARMS:-a b c d e f})
      per=SEED_ARGS_$k
      $LOOP plan --root $L/seed$k "${ARGS[@]}" ${LOOP_ARGS:-} --seed "$k" "${extra[@]}" ${!per:-} > $L/seed$k/plan.out \
        || { cat $L/seed$k/plan.out; exit 1; }
      first=0
    done
  else
    rm -f $L/roots.txt
    $LOOP plan --root $L "${ARGS[@]}" ${LOOP_ARGS:-} > $L/plan.out || { cat $L/plan.out; exit 1; }
  fi
  start_driver || exit 1
  sleep 5
  wait_driver
  ;;
wait)
  wait_driver
  ;;
resume)
  start_driver || exit 1
  sleep 5
  wait_driver
  ;;
stop)
  driver_alive && kill -TERM "$(cat $L/driver.pid)"
  $LOOP stop --root "$(roots | head -n 1)"  # the servers' pid files are in the first folder
  collect
  ;;
esac
