#!/usr/bin/env bash
# The judge on vLLM on a lent GPU machine (issue 16): install vLLM 0.26.0, prepare the default judge, benchmark both
# engines in one run on one card (bench/judge_engines_gpu.py), serve a ScoreBatch on vLLM. No registry, no hub there;
# 64 MiB per call with the tree (~13 MB). Staging, here, after `make install`:
#   bash tools/gpu/stage.sh        # .gpu-policy/c1 (wheels), g1..gN (SmolLM2 GGUF parts), c6.. (MiniLM parts)
#   bash tools/gpu/stage_vllm.sh   # .gpu-vllm/p1 .. p7: vLLM 0.26.0 + its --no-deps wheels, checked by sha256
# Then consecutive `run` calls (each within the warm window of the previous one; docs/gpu.md has them):
#   install  carry ONE staging folder a call (.gpu-vllm/pK, .gpu-policy/c1, g1..gN, c6.., .gpu-qwen/qNN or another
#            base's .gpu-qwen05/qNN from tools/gpu/stage_qwen.sh, or .gpu-adapter/aNN from stage_adapter.sh): copies or
#            installs what it carries;
#            the qwen parts are joined once all are there, an adapter's too (into /tmp/cp-stage/adapters/<name>);
#            once every vLLM part is there: joins them, checks the tar and every wheel (tools/gpu/vllm-manifest.txt)
#            and installs them into /tmp/vsite (pip --no-index --no-deps --target); prints what is still missing
#   stage    (no carry) the default GGUF joined and checked, the default judge (shipped adapter merged, bfloat16),
#            the bare base for the policy (/tmp/smollm2) and MiniLM (device_evidence.sh prepare); `import vllm`
#   bench    (no carry) starts bench.judge_engines_gpu in the background (setsid; BENCH_ARGS appended) and waits
#            up to CALL_BUDGET_S (default 540) for it; copies its JSON and log to $OUT
#   wait     (no carry) waits again for a bench still running; copies what is there
#   rounds   carry .gpu-esconv: bench.judge_rounds on ESConv valid rounds once per rationale bound (BOUNDS), one engine
#            each (issue 27: the bound whose grammar masks cost least at the 1.5B judge's vocabulary, docs/reward_server.md)
#   rejudge  carry "compeer_proto": the judges ADAPTERS (default "none default": the bare base, then the shipped one;
#            or names of $S/adapters from .gpu-adapter, or folders) served one after another on this card, each judging
#            again, with `compeer-loop rejudge`, the evaluation records of POLICIES (default a: the warm-ups) of every
#            loop run in RUNS (default the six v3 runs under docs/evaluations/compeer-loop/, from their committed
#            inputs/results.tar.xz); each judge's folders to $OUT/rejudge-<name>.tar.xz and kept in $S/rejudge, so a
#            judge done in an earlier call is not judged again (plan: docs/evaluations/judge-esconv/qwen15/questions/);
#            a judge is started only with JUDGE_S (default 330) of the call's CALL_BUDGET_S (560, from CALL_T0) left
#   serve    (no carry) compeer-reward serve --backend vllm --device cuda (the default judge, prefix caching,
#            --rationale-bound $RATIONALE_BOUND, default line, the CUDA image's) and one
#            ScoreBatch of examples/group.json x SCORE_GROUPS (default 64) over HTTP, twice (cold, warm); the server
#            log and the replies' summary to $OUT. Carry "compeer_proto" (the generated gRPC code the server imports); a
#            server that exits before it is ready fails the call at once with its log's tail
set -uo pipefail
S=${STAGE_DIR:-/tmp/cp-stage} V=/tmp/cp-vllm B=/tmp/vllm-bench
mkdir -p "$S" "$V" "$B"
export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 COMPEER_CACHE=/tmp/compeer-cache TQDM_DISABLE=1
export COMPEER_GGUF_DIR=$S

install_vllm() {  # every part here: join, check, install (once)
  [ -f /tmp/vsite/.compeer-vllm ] && { echo "vLLM already installed in /tmp/vsite"; return 0; }
  local n total sum have
  [ -f $V/parts.txt ] || { echo "no vLLM part carried yet"; return 0; }
  read -r n total sum < $V/parts.txt
  have=$(ls $V/vllm.part-* 2>/dev/null | wc -l)
  if [ "$have" -lt "$n" ]; then
    echo "vLLM parts: $have of $n here; missing: $(for i in $(seq 0 $((n - 1))); do f=$(printf 'vllm.part-%02d' "$i");
      [ -f $V/$f ] || printf '.gpu-vllm/p%s ' $((i + 1)); done)"
    return 0
  fi
  cat $V/vllm.part-* > $V/vllm.tar && [ "$(stat -c %s $V/vllm.tar)" = "$total" ] \
    && echo "$sum  $V/vllm.tar" | sha256sum -c --quiet - || { echo "vLLM tar: size or sha256 mismatch" >&2; return 1; }
  rm -rf $V/whl && mkdir -p $V/whl && tar -xf $V/vllm.tar -C $V/whl && rm -f $V/vllm.tar $V/vllm.part-* || return 1
  (cd $V/whl && grep -v '^#' "$OLDPWD/tools/gpu/vllm-manifest.txt" | sha256sum -c --quiet -) \
    || { echo "a vLLM wheel does not match tools/gpu/vllm-manifest.txt" >&2; return 1; }
  local t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vsite $V/whl/*.whl \
    || return 1
  rm -rf $V/whl && touch /tmp/vsite/.compeer-vllm
  echo "vLLM and $(grep -vc '^#' tools/gpu/vllm-manifest.txt) wheels installed in /tmp/vsite in $(( $(date +%s) - t0 )) s"
}

take_split_parts() {  # take_split_parts PREFIX: the carried folders PREFIX01 .. PREFIXNN (tools/gpu/stage_qwen.sh's
  # .gpu-qwen/q or OUT=.gpu-qwen05's .gpu-qwen05/q, stage_adapter.sh's .gpu-adapter/a), each one part and parts.txt
  # (count, size, sha256 of the whole file, its name): copy, into a folder per prefix and file name (a second base
  # staged under the same prefix never mixes its parts with the first's); once all are here, join into $S/<name>
  local pre=$1 base="$S/parts-${1//[\/.]/_}" tmp d f n size sum name have
  for d in "$pre"[0-9]*; do
    [ -f "$d"/parts.txt ] || continue
    read -r n size sum name < "$d"/parts.txt
    [ -f "$S/$name" ] && continue  # joined by an earlier call
    tmp="$base-$name"
    mkdir -p "$tmp" && for f in "$d"/*.part-*; do
      [ -f "$tmp/$(basename "$f")" ] || { cp "$f" "$d"/parts.txt "$tmp"/ && echo "copied $f"; }
    done
  done
  for tmp in "$base"-*/; do
    tmp=${tmp%/}
    [ -f "$tmp"/parts.txt ] || continue
    read -r n size sum name < "$tmp"/parts.txt
    [ -f "$S/$name" ] && { echo "$name already joined"; continue; }
    have=$(ls "$tmp"/*.part-* | wc -l)
    if [ "$have" -lt "$n" ]; then
      echo "$name parts: $have of $n here; missing: $(for i in $(seq 0 $((n - 1))); do
        ls "$tmp"/*.part-"$(printf %02d "$i")" >/dev/null 2>&1 || printf '%s%02d ' "$pre" $((i + 1)); done)"
      continue
    fi
    cat "$tmp"/*.part-* > "$S/$name.tmp" && [ "$(stat -c %s "$S/$name.tmp")" = "$size" ] \
      && echo "$sum  $S/$name.tmp" | sha256sum -c --quiet - || { echo "$name: size or sha256 mismatch" >&2; return 1; }
    mv "$S/$name.tmp" "$S/$name" && rm -rf "$tmp" && echo "$name joined and checked"
  done
}
take_adapters() {  # tools/gpu/stage_adapter.sh's adapters, joined: unpacked once into $S/adapters/<name>
  local t name
  take_split_parts .gpu-adapter/a || return 1
  for t in "$S"/*.adapter.tar; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .adapter.tar)
    [ -d "$S/adapters/$name" ] && continue
    mkdir -p "$S"/adapters && tar -xf "$t" -C "$S"/adapters && echo "adapter $name in $S/adapters/$name" || return 1
  done
}

wait_bench() {
  local T0=$(date +%s) budget=${CALL_BUDGET_S:-540}
  while [ ! -f $B/DONE ] && [ $(( $(date +%s) - T0 )) -lt "$budget" ]; do sleep 5; done
  cp $B/bench.log "$OUT"/ 2>/dev/null
  cp bench/results/judge_engines_gpu.json "$OUT"/ 2>/dev/null
  if [ -f $B/DONE ]; then echo "bench finished: $(cat $B/DONE)"; else echo "bench still running (run: wait)"; fi
  tail -n 60 $B/bench.log
}

V3_RUNS="qwen15-v3-2026-12-01 qwen15-v3-seed1-2026-12-01 qwen15-v3-seed2 qwen15-v3-arms-de qwen15-v3-ace-seed1 qwen15-v3-e-seed1"

case "${1:?install|stage|bench|wait|serve|rounds|rejudge}" in
install)
  # a folder carried earlier may still be in this copy of the tree: each is taken once
  if [ ! -f /tmp/vsite/.compeer-vllm ]; then
    for d in .gpu-vllm/p[0-9]*; do
      [ -d "$d" ] || continue
      for f in "$d"/vllm.part-*; do [ -f $V/"$(basename "$f")" ] || { cp "$f" "$d"/parts.txt $V/ && echo "copied $f"; }; done
    done
  fi
  ls -d .gpu-policy/c*/whl >/dev/null 2>&1 && [ ! -f "$S"/.wheels ] && { bash tools/gpu/device_evidence.sh install || exit 1; }
  install_vllm || exit 1
  for d in .gpu-qwen*/; do [ -d "$d" ] && { take_split_parts "${d}q" || exit 1; }; done  # each base's OUT of stage_qwen.sh
  take_adapters || exit 1
  [ -f "$S"/.wheels ] || echo "still missing: .gpu-policy/c1 (and c2, if staged: TRL & co wheels)"
  # stage.sh's g1 .. gN and c6 .. carried: copied by device_evidence.sh's take_parts, which then names what is missing
  missing=$(bash tools/gpu/device_evidence.sh gguf-missing) || exit 1
  [ -z "$missing" ] || echo "still missing: $missing(SmolLM2 GGUF parts)"
  missing=$(bash tools/gpu/device_evidence.sh minilm-missing) || exit 1
  [ -z "$missing" ] || echo "still missing: $missing(MiniLM parts)"
  true
  ;;
stage)
  # the shipped adapters are merged below: a tree slimmed for the carry calls (tools/gpu/slim.sh) lacks their weights
  ls judge/adapters/*/adapter_model.safetensors > /dev/null 2>&1 \
    || { echo "the shipped adapters' weights are not in this tree: run 'bash tools/gpu/slim.sh weights' (or slim.sh restore) here first" >&2; exit 1; }
  [ -f /tmp/vsite/.compeer-vllm ] || { echo "vLLM is not installed yet (install with every .gpu-vllm part)" >&2; exit 1; }
  # the SmolLM2 GGUF joined and checked (from stage.sh's g1 .. gN), /tmp/smollm2 (the policy's base) and MiniLM
  bash tools/gpu/device_evidence.sh prepare || exit 1
  # the GPU default judge (qwen2.5-coder-1.5b + its shipped adapter since issue 23; its .gpu-qwen parts installed
  # first), merged once; the 135M judge too (the figures before issue 23 are for it: --model smollm2-135m)
  python3 -m judge.model_store bfloat16 --device cuda || exit 1
  python3 -m judge.model_store bfloat16 --model smollm2-135m || exit 1
  nvidia-smi -L
  # versions from the installed metadata: xgrammar has no __version__
  python3 -c 'import time, importlib.metadata as md; t = time.time(); import vllm, torch, transformers, xgrammar
print(" ".join(f"{n} {md.version(n)}" for n in ("vllm", "torch", "transformers", "xgrammar")),
      f"; import {time.time() - t:.1f} s")' || exit 1
  ;;
bench)
  rm -f $B/DONE
  setsid nohup bash -c "python3 -m bench.judge_engines_gpu --device cuda ${BENCH_ARGS:-} > $B/bench.log 2>&1;
    echo \"exit \$? at \$(date -u +%H:%M:%S)\" > $B/DONE" < /dev/null > /dev/null 2>&1 &
  sleep 2
  wait_bench
  ;;
wait)
  wait_bench
  ;;
rounds)  # issue 27: bench.judge_rounds on ESConv valid rounds (.gpu-esconv, from tools/gpu/stage_qwen.sh) with the GPU
  # default judge, once per rationale bound (BOUNDS, default "counted max_tokens line"; the bound is the engine's, so
  # one engine each, one after another), each beside the paths of COMPARE (default prefix,discrete,top5: the answer
  # prefix, today's path without the graded reward's logprobs, and with 5 alternatives a token instead of 20); SETS
  # GRPO steps each (default 5). Each run's JSON and log go to $OUT as judge_rounds-<bound>.{json,log} and the JSON is also kept in
  # $S/rounds (while the machine stays warm), so that every other bound's run, in this call or a later one, is
  # compared with the BASELINE run's verdicts (default counted, vLLM's auto: --baseline). SO_BACKEND (auto,
  # xgrammar, guidance) picks vLLM's mask library for this call's runs; a run's name is then <bound>-<backend>; MNBT
  # (tokens) sets vLLM's max_num_batched_tokens for this call's runs, named <bound>[-<backend>]-mnbt<MNBT>
  T0=${CALL_T0:-$(date +%s)} R="$S"/rounds base=${BASELINE:-counted}
  mkdir -p "$R"
  [ -f .gpu-esconv/valid.json.xz ] || [ -f "$S"/esconv-valid.json ] \
    || { echo "no ESConv valid split here: carry .gpu-esconv (tools/gpu/stage_qwen.sh builds it)" >&2; exit 1; }
  [ -f "$S"/esconv-valid.json ] || xz -dc .gpu-esconv/valid.json.xz > "$S"/esconv-valid.json || exit 1
  bounds=(${BOUNDS:-counted max_tokens line})
  for i in "${!bounds[@]}"; do
    b=${bounds[$i]} left=$(( ${CALL_BUDGET_S:-580} - ($(date +%s) - T0) ))
    name=$b${SO_BACKEND:+-$SO_BACKEND}${MNBT:+-mnbt$MNBT} against=() more=()
    [ -n "${MNBT:-}" ] && more=(--max-num-batched-tokens "$MNBT")
    [ "$name" != "$base" ] && [ -f "$R"/judge_rounds-"$base".json ] && against=(--baseline "$R"/judge_rounds-"$base".json)
    rm -f bench/results/judge_rounds*_cuda.json
    timeout $(( left / (${#bounds[@]} - i) )) python3 -m bench.judge_rounds --compare "${COMPARE:-prefix,discrete,top5}" --device cuda \
      --dtype bfloat16 --sets "${SETS:-5}" --data "$S"/esconv-valid.json --rationale-bound "$b" \
      --structured-outputs-backend "${SO_BACKEND:-auto}" "${more[@]}" "${against[@]}" > "$OUT"/judge_rounds-"$name".log 2>&1
    echo "$name: exit $?${against:+ (against the $base run)}"
    for f in bench/results/judge_rounds*_cuda.json; do
      [ -f "$f" ] && cp "$f" "$R"/judge_rounds-"$name".json && mv "$f" "$OUT"/judge_rounds-"$name".json
    done
    grep -E "step_s|step_positions|ms_per_position|floor_multiple|agreement|launch floor" "$OUT"/judge_rounds-"$name".log \
      || tail -n 5 "$OUT"/judge_rounds-"$name".log
  done
  ;;
rejudge)
  [ -f compeer_proto/reward/v1/reward_pb2.py ] || { echo "no generated gRPC code here: carry \"compeer_proto\"" >&2; exit 1; }
  R="$S"/rejudge rc=0
  for run in ${RUNS:-$V3_RUNS}; do
    [ -d "$R/src/$run" ] && continue
    mkdir -p "$R/src/$run" && tar -xJf docs/evaluations/compeer-loop/"$run"/inputs/results.tar.xz -C "$R/src/$run" || exit 1
  done
  T0=${CALL_T0:-$(date +%s)}
  for a in ${ADAPTERS:-none default}; do
    tag=$(basename "$a") spec=$a
    if [ -f "$R/$tag.tar.xz" ]; then echo "judge $tag: judged in an earlier call"; cp "$R/$tag.tar.xz" "$OUT/rejudge-$tag.tar.xz"; continue; fi
    left=$(( ${CALL_BUDGET_S:-560} - ($(date +%s) - T0) ))
    # a judge started is finished in this call or lost with it (a killed call would leave its server on the card)
    if [ "$left" -lt "${JUDGE_S:-330}" ]; then echo "judge $tag: not started, ${left} s left in this call (JUDGE_S ${JUDGE_S:-330}): run rejudge again"; rc=1; break; fi
    [ -d "$S/adapters/$a" ] && spec="$S/adapters/$a"
    python3 -m reward_server.cli serve --backend vllm --device cuda --model default --adapter "$spec" \
      --rationale-bound "${RATIONALE_BOUND:-line}" --embedding-model "$S"/minilm-q8 --cache off \
      --host 127.0.0.1 --grpc-port 50052 --http-port 8002 > "$OUT/server-$tag.log" 2>&1 &
    SERVER=$! failed=0
    if python3 tools/gpu/wait_ready.py http://127.0.0.1:8002/readyz "$SERVER" "$OUT/server-$tag.log" 300; then
      rm -rf "${R:?}/$tag" && mkdir -p "$R/$tag"
      for d in "$R"/src/*/seed*; do
        timeout $(( ${CALL_BUDGET_S:-560} - ($(date +%s) - T0) )) python3 -m compeer_loop.cli rejudge --root "$d" --out "$R/$tag/$(basename "$(dirname "$d")")-$(basename "$d")" \
          --address 127.0.0.1:50052 --policies ${POLICIES:-a} || { echo "judge $tag: rejudge of $d failed" >&2; failed=1; }
      done
      { [ $failed = 0 ] && tar -cJf "$R/$tag.tar.xz" -C "$R" "$tag" && cp "$R/$tag.tar.xz" "$OUT/rejudge-$tag.tar.xz" \
        && echo "judge $tag: $(ls "$R/$tag" | wc -l) folders judged again"; } || rc=1
    else
      echo "judge $tag: the server did not start (its log: server-$tag.log)" >&2; rc=1
    fi
    kill -TERM "$SERVER" 2>/dev/null; wait "$SERVER"
  done
  exit $rc
  ;;
serve)
  [ -f compeer_proto/reward/v1/reward_pb2.py ] || { echo "no generated gRPC code here: carry \"compeer_proto\"" >&2; exit 1; }
  python3 -m reward_server.cli serve --backend vllm --device cuda --model default \
    --rationale-bound "${RATIONALE_BOUND:-line}" --embedding-model "$S"/minilm-q8 --cache off \
    --host 127.0.0.1 --grpc-port 50051 --http-port 8000 > "$OUT"/server.log 2>&1 &
  SERVER=$!
  # fails fast, with the log's tail, when the server exits before it is ready
  python3 tools/gpu/wait_ready.py http://127.0.0.1:8000/readyz "$SERVER" "$OUT"/server.log 300 > "$OUT"/score_batch.txt 2>&1 \
  && python3 - "${SCORE_GROUPS:-64}" <<'PY' >> "$OUT"/score_batch.txt 2>&1
import json, sys, time, httpx
print(httpx.get("http://127.0.0.1:8000/v1/info").text)
group = json.load(open("examples/group.json"))
n = int(sys.argv[1])
for name in ("cold", "warm"):  # warm: the same groups again (prefix cache; no result cache: --cache off)
    body = {"groups": [dict(group, history=[dict(t) for t in group["history"][:-1]]
                            + [dict(group["history"][-1], text=group["history"][-1]["text"] + f" ({i})")])
                       for i in range(n)]}
    t = time.time()
    r = httpx.post("http://127.0.0.1:8000/v1/score:batch", json=body, timeout=600)
    r.raise_for_status()
    groups = r.json()["groups"]
    errors = sum(1 for g in groups if "error" in g)
    print(f"{name}: ScoreBatch of {n} groups x {len(group['candidates'])} in {time.time() - t:.2f} s, {errors} errors;"
          f" first group: {json.dumps(groups[0])[:600]}")
PY
  rc=$?
  kill -TERM "$SERVER" 2>/dev/null; wait "$SERVER"
  cat "$OUT"/score_batch.txt; grep -E "ERROR|Traceback|ready" "$OUT"/server.log | tail -20
  exit $rc
  ;;
esac
