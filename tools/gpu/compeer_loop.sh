#!/usr/bin/env bash
# The COMPEER loop (issue 17) on a lent GPU machine: every policy arm trained at once on one GPU, then evaluated.
# No registry, no hub there; 64 MiB per `run` call, 10 min per call. Here, after `make install`:
#   bash tools/gpu/stage.sh              # .gpu-policy/c1 (wheels + GGUF part 00), c2 (parts 01-02), c3 (MiniLM, part 03)
#   bash tools/gpu/compeer_loop.sh pack  # .gpu-loop/loop-data.tar.xz: prompt sets built from ../shared/data/esconv
# Then consecutive `run` calls (each within the warm window of the previous one; docs/compeer_loop.md has them):
#   install  carry .gpu-policy/c1                  wheels into /tmp/site, GGUF part 00
#   stage    carry .gpu-policy/c2 and .gpu-loop    GGUF parts 01-02, the prompt sets
#   start    carry .gpu-policy/c3                  MiniLM + GGUF part 03; GGUF -> HF folders (base, merged trained judge), MiniLM; writes the
#                                                  plan (STEPS, ARMS, LOOP_ARGS) and starts the driver in the
#                                                  background (setsid): reward servers, warm-up, all GRPO arms at
#                                                  once, evaluation; then waits like `wait`
#   wait     (no carry)                            waits until CALL_BUDGET_S (default 540) s into the call, prints
#                                                  the status, packs what is finished to $OUT
#   resume   (no carry)                            starts the driver again if it is not running (a killed driver or
#                                                  arm continues from its checkpoints), then waits like `wait`
#   stop     (no carry)                            stops the driver and the reward servers, packs to $OUT
# $OUT gets at most 4 files: status.txt, results.tar.xz (plan, state, every arm's metrics.jsonl and summary.json,
# every evaluation's records.jsonl and done.json, the prompt manifest), logs.tar.xz (log tails), driver.log.
set -uo pipefail
S=/tmp/cp-stage L=${LOOP_ROOT:-/tmp/loop} D=${LOOP_DATA:-/tmp/loop-data}
mkdir -p "$S" "$L"
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export COMPEER_CACHE=/tmp/compeer-cache COMPEER_DEFAULT_GGUF=$S/SmolLM2-135M-Instruct.Q4_1.gguf TQDM_DISABLE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
LOOP="${PY:-python3} -m compeer_loop.cli"
T_CALL=$(date +%s)  # CALL_BUDGET_S counts from here: the whole call, whatever its phase did before waiting

driver_alive() { [ -f $L/driver.pid ] && kill -0 "$(cat $L/driver.pid)" 2>/dev/null; }

start_driver() {
  driver_alive && { echo "driver already running (pid $(cat $L/driver.pid))"; return 0; }
  setsid nohup $LOOP run --root $L >> $L/driver.log 2>&1 < /dev/null &
  echo $! > $L/driver.pid
  echo "driver started (pid $!)"
}

collect() {  # what is finished, to $OUT
  [ -n "${OUT:-}" ] || return 0
  $LOOP status --root $L > "$OUT"/status.txt 2>&1
  local f=(plan.json state.json DONE)
  for x in $L/*/metrics.jsonl $L/*/summary.json $L/eval/*/records.jsonl $L/eval/*/done.json; do
    [ -f "$x" ] && f+=("${x#$L/}"); done
  cp $D/manifest.json $L/prompts-manifest.json 2>/dev/null && f+=(prompts-manifest.json)
  ( cd $L && ls "${f[@]}" 2>/dev/null | tar -cJf "$OUT"/results.tar.xz -T - )
  ( cd $L && for x in logs/*.log; do [ -f "$x" ] && { echo "== $x"; tail -n 60 "$x"; }; done ) > $L/log-tails.txt 2>/dev/null
  tar -cJf "$OUT"/logs.tar.xz -C $L log-tails.txt 2>/dev/null
  tail -n 200 $L/driver.log > "$OUT"/driver.log 2>/dev/null
  ls -l "$OUT"
}

wait_driver() {
  local budget=${CALL_BUDGET_S:-540}
  while [ ! -f $L/DONE ] && driver_alive && [ $(( $(date +%s) - T_CALL )) -lt "$budget" ]; do sleep 15; done
  $LOOP status --root $L
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
  collect
}

case "${1:?pack|install|stage|start|wait|resume|stop}" in
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
  bash tools/gpu/device_evidence.sh stage && mkdir -p $D && tar -xJf .gpu-loop/loop-data.tar.xz -C $D && ls -l $D
  ;;
start)
  bash tools/gpu/device_evidence.sh prepare || exit 1   # the GGUF (sha256 checked) and MiniLM (fp32) in $S
  python3 -m judge.model_store bfloat16 --adapter none || exit 1   # the base (policy, untrained judge)
  python3 -m judge.model_store bfloat16 || exit 1                  # the shipped trained judge, merged
  ARGS=(--root $L --prompts $D --steps "${STEPS:-30}" --embedding-model "$S"/minilm-q8)
  [ -n "${ARMS:-}" ] && ARGS+=(--arms $ARMS)
  [ -n "${PRM_ADAPTER:-}" ] && ARGS+=(--prm-adapter "$PRM_ADAPTER" --orm-adapter "${ORM_ADAPTER:?ORM_ADAPTER too}")
  $LOOP plan "${ARGS[@]}" ${LOOP_ARGS:-} > $L/plan.out || { cat $L/plan.out; exit 1; }
  start_driver
  sleep 5
  wait_driver
  ;;
wait)
  wait_driver
  ;;
resume)
  start_driver
  sleep 5
  wait_driver
  ;;
stop)
  driver_alive && kill -TERM "$(cat $L/driver.pid)"
  $LOOP stop --root $L
  collect
  ;;
esac
