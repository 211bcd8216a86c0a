"""The GPU staging scripts: valid bash, and the vLLM pins of ``tools/gpu/stage_vllm.sh`` exactly the wheels whose
sha256 ``tools/gpu/vllm-manifest.txt`` records (a pin changed without ``stage_vllm.sh manifest`` fails here); the
readiness wait of the scripts that start a server (``tools/gpu/wait_ready.py``) fails fast when that server dies."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

GPU = Path(__file__).resolve().parents[2] / "tools" / "gpu"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(GPU / script)], check=True)


def test_vllm_pins_match_the_manifest() -> None:
    text = (GPU / "stage_vllm.sh").read_text()
    block = re.search(r"^PINS=\((.*?)^\)", text, re.DOTALL | re.MULTILINE)
    assert block is not None
    pins = {(_norm(n), v) for n, v in re.findall(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", block.group(1))}
    wheels = {}
    for line in (GPU / "vllm-manifest.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        digest, name = line.split()
        assert re.fullmatch(r"[0-9a-f]{64}", digest) and name.endswith(".whl"), line
        dist, version = name.split("-")[:2]
        wheels[(_norm(dist), version)] = digest
    assert pins == set(wheels)
    assert ("vllm", "0.26.0") in pins and ("openai", "2.54.0") in pins  # openai 2.x: 3.x imports httpx2


def _wait_ready() -> Any:
    spec = importlib.util.spec_from_file_location("wait_ready", GPU / "wait_ready.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.wait_ready


def test_wait_ready_fails_fast_when_the_server_dies(tmp_path: Path) -> None:
    """A server that exits before it is ready (e.g. an ImportError at start) fails the wait at once with its log's
    tail, not after the whole budget."""
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "raise ImportError('no module named compeer')"],
                                stdout=out, stderr=subprocess.STDOUT)
    t = time.monotonic()
    with pytest.raises(SystemExit, match=r"(?s)exited .*no module named compeer"):
        _wait_ready()("http://127.0.0.1:9/readyz", proc.pid, str(log), budget_s=60, poll_s=0.1)
    assert time.monotonic() - t < 20
    proc.wait()


def test_wait_ready_returns_once_the_server_answers(tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        waited = _wait_ready()(f"http://127.0.0.1:{server.server_port}/", os.getpid(), str(tmp_path / "x.log"),
                               budget_s=30, poll_s=0.1)
        assert waited < 30
    finally:
        server.shutdown()


def test_a_call_budget_counts_from_the_calls_start(tmp_path: Path) -> None:
    """Several scripts in one `run` call share its budget when the caller exports CALL_T0: a loop `wait` whose call
    began longer ago than CALL_BUDGET_S returns at once (it used to wait its whole budget from its own start, and the
    call ran past the tool's limit)."""
    root = tmp_path / "loop"
    root.mkdir()
    driver = subprocess.Popen(["sleep", "60"])  # a running driver: the wait would otherwise go on
    try:
        (root / "driver.pid").write_text(str(driver.pid))
        env = {**os.environ, "LOOP_ROOT": str(root), "LOOP_DATA": str(tmp_path / "data"), "PY": sys.executable,
               "CALL_BUDGET_S": "40", "CALL_T0": str(int(time.time()) - 100), "POLL_S": "1"}
        env.pop("OUT", None)
        t = time.monotonic()
        subprocess.run(["bash", str(GPU / "compeer_loop.sh"), "wait"], env=env, capture_output=True, timeout=120,
                       cwd=GPU.parents[1], check=False)
        assert time.monotonic() - t < 20
        env["CALL_T0"] = str(int(time.time()))  # the call just began: the wait polls the driver until its budget
        t = time.monotonic()
        subprocess.run(["bash", str(GPU / "compeer_loop.sh"), "wait"], env={**env, "CALL_BUDGET_S": "4"},
                       capture_output=True, timeout=120, cwd=GPU.parents[1], check=False)
        assert time.monotonic() - t >= 3
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.skipif(Path("/tmp/vsite/.compeer-vllm").exists(),
                    reason="vLLM is staged in /tmp/vsite on this machine (a lent GPU machine after vllm_judge.sh "
                           "install), and the refusal checked here needs it absent; runs everywhere else, CI included")
def test_a_loop_planned_on_vllm_does_not_start_without_the_staged_vllm(tmp_path: Path) -> None:
    """`compeer_loop.sh resume` of a plan whose arms generate on vLLM (VLLM=1 on `start`) stops before the driver
    starts when vLLM is not staged in /tmp/vsite, naming the staging step."""
    root = tmp_path / "loop"
    root.mkdir()
    (root / "plan.json").write_text(json.dumps({"generation": "vllm", "judge_backend": "transformers"}))
    env = {**os.environ, "LOOP_ROOT": str(root), "LOOP_DATA": str(tmp_path / "data"), "PY": sys.executable,
           "CALL_BUDGET_S": "1"}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(GPU / "compeer_loop.sh"), "resume"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=GPU.parents[1], check=False)
    assert done.returncode == 1 and "vllm_judge.sh install" in done.stderr
    assert not (root / "driver.pid").exists()


def test_the_overlap_runs_share_a_judge_server_without_a_result_cache() -> None:
    """same_step's rollouts equal off's (same seed, same algorithm): a cached server answered them all from off's
    judgments on 2026-11-29, and the run measured nothing. The overlap phase starts its server with the cache off."""
    text = (GPU / "device_evidence.sh").read_text()
    phase = text[text.index("\noverlap)"):]
    assert re.search(r"JUDGE_CACHE=\$\{JUDGE_CACHE:-off\}[^\n]*start_server", phase)
    assert '--cache "${JUDGE_CACHE:-memory}"' in text


def test_the_overlap_runs_take_the_loops_esconv_prompts_by_their_file_names() -> None:
    """PROMPTS=esconv trains every overlap run on the loop's ESConv sets (compeer_loop.sh pack), named as
    compeer_loop.prompts writes them, and TRAIN_ARGS reaches every run."""
    from compeer_loop.prompts import TRAIN_FILE, WARMUP_FILE

    phase = (GPU / "device_evidence.sh").read_text()
    phase = phase[phase.index("\noverlap)"):]
    phase = phase[:phase.index("\n  ;;")]
    assert f"--set prompt_set=/tmp/loop-data/{TRAIN_FILE}" in phase
    assert f"--set sft_warmup_dataset=/tmp/loop-data/{WARMUP_FILE}" in phase
    assert re.search(r'train_vllm [^\n]*--set reward_overlap="\$arm" "\$\{extra\[@\]\}" \$\{TRAIN_ARGS:-\}', phase)
    # ESConv's long conversations ran the policy out of memory without gradient checkpointing (H200, 2026-11-29)
    esconv = phase[phase.index('= esconv ]'):phase.index("\n  fi")]
    assert "--set gradient_checkpointing=true" in esconv


def test_the_overlap_runs_keep_warmup_from_aside_before_replacing_their_run_folders() -> None:
    """WARMUP_FROM=/tmp/run-off with off among OVERLAPS: the loop deleted the folder it was about to copy the warm-up
    from (2026-11-29). The adapter is copied aside before any run folder is replaced, and every run reuses the copy."""
    phase = (GPU / "device_evidence.sh").read_text()
    phase = phase[phase.index("\noverlap)"):]
    phase = phase[:phase.index("\n  ;;")]
    aside = phase.index('reuse_warmup "$WARMUP_FROM" /tmp/warmup-from')
    assert aside < phase.index('rm -rf /tmp/run-"$arm"')
    assert re.search(r'from=\$\( \[ -n "\$\{WARMUP_FROM:-\}" \] && echo /tmp/warmup-from', phase)


def test_the_overlap_runs_resume_their_own_folders_and_take_the_policy_named() -> None:
    """A run longer than one call (a 1.5B policy: warm-up and 60 steps do not fit in 600 s) continues in the next
    call: RESUME=1 keeps the run folder (warm-up adapter, checkpoints) and passes --resume; without it the folder is
    replaced as before. POLICY_MODEL reaches the trainer, and a base name resolves in the cache vllm_judge.sh stage
    converted into."""
    text = (GPU / "device_evidence.sh").read_text()
    assert '--policy-model "${POLICY_MODEL:-/tmp/smollm2}"' in text
    setup = text[:text.index("\ntake_parts()")]  # before any phase: the judge's `default` and a named policy alike
    assert "export COMPEER_CACHE=${COMPEER_CACHE:-/tmp/compeer-cache} COMPEER_GGUF_DIR=${COMPEER_GGUF_DIR:-$S}" in setup
    vllm_judge = (GPU / "vllm_judge.sh").read_text()
    assert "COMPEER_CACHE=/tmp/compeer-cache" in vllm_judge
    phase = text[text.index("\noverlap)"):]
    phase = phase[:phase.index("\n  ;;")]
    resumed = phase[phase.index('if [ "${RESUME:-0}" = 1 ]'):phase.index("\n    else")]
    assert "resume=(--resume)" in resumed and "rm -rf" not in resumed
    # no folder to resume: said before the judge server starts, never a fresh run
    check = phase[phase.index("RESUME=1: no /tmp/run-"):]
    assert "exit 1" in check[:check.index("\n")] and phase.index("RESUME=1: no") < phase.index("start_server")
    fresh = phase[phase.index("\n    else"):phase.index("\n    fi")]
    assert 'rm -rf /tmp/run-"$arm"' in fresh and "reuse_warmup" in fresh
    assert re.search(r'train_vllm [^\n]*\n\s*"\$\{resume\[@\]\}"', phase)


def test_rounds_runs_the_benchmark_once_per_bound_each_later_one_against_the_first(tmp_path: Path) -> None:
    """`vllm_judge.sh rounds` (issue 27): one bench.judge_rounds run per rationale bound, its JSON kept under the
    bound's name, and every later bound compared with the first one's verdicts (--baseline). A fake python3 stands
    in for the benchmark (the GPU run is the real one: docs/reward_server.md)."""
    import lzma

    tree, fake, out, stage = tmp_path / "tree", tmp_path / "bin", tmp_path / "out", tmp_path / "stage"
    for d in (tree / ".gpu-esconv", tree / "bench" / "results", fake, out):
        d.mkdir(parents=True)
    (tree / ".gpu-esconv" / "valid.json.xz").write_bytes(lzma.compress(b"[]"))
    (fake / "python3").write_text(
        '#!/usr/bin/env bash\necho "$@" >> "$CALLS"\n'
        'b=$(echo "$@" | sed -E "s/.*--rationale-bound ([a-z_]+).*/\\1/")\n'
        'echo "{\\"rationale_bound\\": \\"$b\\"}" > bench/results/judge_rounds_prefix_cuda.json\n')
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(out), "STAGE_DIR": str(stage),
           "CALLS": str(tmp_path / "calls.txt"), "BOUNDS": "counted max_tokens line", "CALL_BUDGET_S": "60"}
    done = subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rounds"], env=env, cwd=tree, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split("--rationale-bound ")[1].split()[0] for c in calls] == ["counted", "max_tokens", "line"]
    assert "--baseline" not in calls[0]
    assert all(f"--baseline {stage}/rounds/judge_rounds-counted.json" in c for c in calls[1:])
    assert all(f"--data {stage}/esconv-valid.json" in c and "--device cuda" in c for c in calls)
    for b in ("counted", "max_tokens", "line"):
        assert f'"rationale_bound": "{b}"' in (out / f"judge_rounds-{b}.json").read_text()
    # a later call (the machine still warm) compares its bounds with the counted run an earlier call left
    (tmp_path / "calls.txt").unlink()
    subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rounds"], env={**env, "BOUNDS": "line"}, cwd=tree,
                   capture_output=True, timeout=60, check=True)
    assert f"--baseline {stage}/rounds/judge_rounds-counted.json" in (tmp_path / "calls.txt").read_text()
    # the counted bound with llguidance's masks: its own name, compared with xgrammar's counted run
    subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rounds"], env={**env, "BOUNDS": "counted",
                                                                        "SO_BACKEND": "guidance"},
                   cwd=tree, capture_output=True, timeout=60, check=True)
    last = (tmp_path / "calls.txt").read_text().splitlines()[-1]
    assert "--structured-outputs-backend guidance" in last and "--baseline" in last
    assert (out / "judge_rounds-counted-guidance.json").is_file()
    assert "--max-num-batched-tokens" not in (tmp_path / "calls.txt").read_text()
    # the line bound with a larger scheduler step (MNBT): its own name, compared with the line run (BASELINE)
    subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rounds"], env={**env, "BOUNDS": "line", "MNBT": "16384",
                                                                        "BASELINE": "line"},
                   cwd=tree, capture_output=True, timeout=60, check=True)
    last = (tmp_path / "calls.txt").read_text().splitlines()[-1]
    assert "--max-num-batched-tokens 16384" in last and f"--baseline {stage}/rounds/judge_rounds-line.json" in last
    assert (out / "judge_rounds-line-mnbt16384.json").is_file()


def test_a_carry_part_fits_beside_the_tree_that_travels(tmp_path: Path) -> None:
    """``carry.sh``'s part size is a call's 64 MiB less the tree that travels (tracked files and untracked ones git
    does not ignore, not ignored ones) and 2 MiB: four fixed GGUF parts stopped fitting once the tree grew to 43 MiB
    (2026-11-29), and the GPU side refused the call. The tree counts its disk usage (whole blocks): a wheel folder
    that fitted by the files' lengths was refused on 2026-11-30."""
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("ignored.bin\n")
    (tmp_path / "tracked.bin").write_bytes(b"x" * 3_000_000)
    (tmp_path / "untracked.bin").write_bytes(b"y" * 1_000_000)
    (tmp_path / "ignored.bin").write_bytes(b"z" * 9_000_000)
    (tmp_path / "small.txt").write_text("a few bytes take a whole block")
    git("add", ".gitignore", "tracked.bin", "small.txt")
    tree = sum(os.stat(tmp_path / f).st_blocks * 512 for f in (".gitignore", "tracked.bin", "untracked.bin", "small.txt"))
    assert tree > 3_000_000 + 1_000_000 + len("ignored.bin\n") + 30  # the small files' blocks count in full

    def part_bytes(env: dict[str, str]) -> int:
        out = subprocess.run(["bash", "-c", f". {GPU / 'carry.sh'}; tree_bytes; part_bytes"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        assert int(out[0]) == tree
        return int(out[1])

    env = {k: v for k, v in os.environ.items() if k != "PART_BYTES"}
    assert part_bytes(env) == 64 * 1048576 - tree - 2 * 1048576
    assert part_bytes({**env, "PART_BYTES": "12345"}) == 12345


def _adversarial_round_built(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A run folder whose adversarial round is built and trained (``judge_qwen.sh adversarial-run`` neither builds nor
    trains again), the log of a FAKE ``python3`` (every call logged; the trainer's CLI fails at once, anything else is
    Python's) and the env (no GRPO run, no shipped-judge card)."""
    run = tmp_path / "qwen-run"
    (run / "data2" / "emit" / "judge_sft").mkdir(parents=True)  # the round's data, built: not built again
    (run / "unified-adv-bf16").mkdir()  # the retrained adapter, there: not trained again
    (run / "unified-adv-bf16" / "adapter_model.safetensors").write_bytes(b"weights")
    calls = tmp_path / "python-calls.txt"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(
        f'#!/usr/bin/env bash\necho "$*" >> {calls}\n[ "$1 $2" = "-m reward_trainer.cli" ] && exit 1\n'
        f'exec {sys.executable} "$@"\n')
    (fake / "python3").chmod(0o755)
    negatives = tmp_path / "negatives.jsonl"
    negatives.write_text("")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "QWEN_RUN": str(run),
           "STAGE_DIR": str(tmp_path / "stage"), "ADV_NEGATIVES": str(negatives), "ADV_GRPO2": "0"}
    for key in ("SHIPPED_CARD", "SHIPPED_EVAL", "JUDGE_MODEL", "PROFILE"):
        env.pop(key, None)
    return calls, env


def test_an_adversarial_rerun_with_adv_eval_0_retrains_only(tmp_path: Path) -> None:
    """``judge_qwen.sh adversarial`` with ``ADV_EVAL=0`` (a round whose figures are committed, run again for a GRPO
    run against it) prints the retrained adapter's sha256 and starts no evaluation; with the default it does."""
    calls, env = _adversarial_round_built(tmp_path)
    env["SHIPPED_EVAL"] = "0"
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "adversarial-run"], env={**env, "ADV_EVAL": "0"},
                          cwd=GPU.parents[1], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(b"weights").hexdigest() in done.stdout
    assert "reward_trainer.cli" not in calls.read_text()
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "adversarial-run"], env=env, cwd=GPU.parents[1],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1  # the (fake) evaluation was started and failed
    assert "reward_trainer.cli judge-eval" in calls.read_text() and "--save-texts" not in calls.read_text()
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "adversarial-run"], env={**env, "SAVE_TEXTS": "1"},
                          cwd=GPU.parents[1], capture_output=True, text=True, timeout=120, check=False)
    evals = [line for line in calls.read_text().splitlines() if "judge-eval" in line and "--save-texts" in line]
    assert len(evals) == 1 and "--out " in evals[0] and "eval-adv" in evals[0]  # the retrained judge's rationales


def test_an_adversarial_round_of_the_135m_judge_measures_the_135m_judge_beside_it(tmp_path: Path) -> None:
    """``JUDGE_MODEL=smollm2-135m`` (the CPU default's base): the judge measured beside the retrained one is that
    base's shipped adapter, on that base, never the 1.5B judge's adapter on the wrong base."""
    calls, env = _adversarial_round_built(tmp_path)
    env.update(JUDGE_MODEL="smollm2-135m", PROFILE="gpu-esconv")
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "adversarial-run"], env=env, cwd=GPU.parents[1],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1  # the (fake) evaluations were started and failed
    evals = [line for line in calls.read_text().splitlines() if "reward_trainer.cli judge-" in line]
    shipped = [line for line in evals if "judge/adapters/" in line]
    assert len(shipped) == 2 and all("judge/adapters/unifireward-smollm2-esconv-v2" in line for line in shipped)
    assert all("--model smollm2-135m" in line for line in evals) and "qwen15" not in " ".join(evals)


SHIPPED = Path("judge/adapters/unifireward-qwen15-esconv-v3")


def _slim_tree(tmp_path: Path, fake_line: str) -> tuple[Path, Path, Path, dict[str, str]]:
    """A tree whose shipped adapter has no weights (as after ``slim.sh hide``), the run folder with its data built,
    the log of a FAKE ``python3`` (logs every call, runs ``fake_line`` first, then the real Python) and the env."""
    repo, tree, run = GPU.parents[1], tmp_path / "tree", tmp_path / "qwen-run"
    (tree / SHIPPED).mkdir(parents=True)
    (tree / SHIPPED / "compeer_judge.json").write_text((repo / SHIPPED / "compeer_judge.json").read_text())
    (tree / "tools").symlink_to(repo / "tools")
    (run / "data2" / "emit" / "judge_sft").mkdir(parents=True)
    calls = tmp_path / "python-calls.txt"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n{fake_line}exec {sys.executable} "$@"\n')
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "QWEN_RUN": str(run), "STAGE_DIR": str(tmp_path / "s")}
    return tree, run, calls, env


def test_an_adversarial_round_beside_the_shipped_judge_needs_its_weights(tmp_path: Path) -> None:
    """Measuring the shipped judge beside the retrained one (``SHIPPED_CARD``) in a tree whose shipped weights are set
    aside (``slim.sh hide``) stops before training, naming the fix, instead of training beside two failed
    measurements."""
    tree, _run, calls, env = _slim_tree(tmp_path, "")
    env.update({"ADV_NEGATIVES": str(tmp_path / "negatives.jsonl"), "ADV_GRPO2": "0", "SHIPPED_CARD": "0"})
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "adversarial-run"], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and "slim.sh restore" in done.stderr
    assert "reward_trainer.cli" not in (calls.read_text() if calls.exists() else "")


def test_calibrate_fits_on_raw_probabilities_and_writes_a_copy_of_the_shipped_adapter(tmp_path: Path) -> None:
    """``judge_qwen.sh calibrate``: Table 1 and the contrast with raw probabilities, the fit written into a copy of
    the shipped adapter (marked ready before the contrast ends), then the contrast recomputed; without the shipped
    weights in the tree (``slim.sh hide``) it stops first, naming the fix."""
    tree, run, calls, env = _slim_tree(tmp_path, '[ "$1 $2" = "-m reward_trainer.cli" ] && exit 0\n')
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "calibrate-run"], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and "slim.sh restore" in done.stderr
    assert "reward_trainer.cli" not in (calls.read_text() if calls.exists() else "")  # nothing measured or fitted
    (tree / SHIPPED / "adapter_model.safetensors").write_bytes(b"weights")
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "calibrate-run"], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in calls.read_text().splitlines() if ln.startswith("-m reward_trainer.cli")]
    assert [ln.split()[2] for ln in lines] == ["judge-eval", "judge-contrast", "judge-calibrate", "judge-calibrate"] \
        or [ln.split()[2] for ln in lines] == ["judge-contrast", "judge-eval", "judge-calibrate", "judge-calibrate"]
    assert all("--verdict-temperature 1" in ln for ln in lines[:2])
    assert f"--write-adapter {run}/shipped-cal" in lines[2] and "--contrast" in lines[3]
    assert (run / "CALIBRATED").exists() and (run / "shipped-cal" / "adapter_model.safetensors").read_bytes() == \
        b"weights"


def test_contrast_of_a_candidate_adapter_on_carried_groups(tmp_path: Path) -> None:
    """``judge_qwen.sh contrast`` with ``CONTRAST_ADAPTER`` and ``CONTRAST_GROUPS_FILE``: the candidate judge (not the
    shipped one) on the carried groups, into contrast-candidate; an adapter folder without weights stops first."""
    tree, run, calls, env = _slim_tree(tmp_path, '[ "$1 $2" = "-m reward_trainer.cli" ] && exit 0\n')
    cand = tree / ".gpu-judge" / "adapter"
    cand.mkdir(parents=True)
    env.update({"CONTRAST_ADAPTER": f"evidence={cand}", "CONTRAST_GROUPS_FILE": str(tree / ".gpu-judge/groups.jsonl")})
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "contrast-run"], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and f"{cand} has no weights in this tree" in done.stderr
    assert "reward_trainer.cli" not in (calls.read_text() if calls.exists() else "")
    (cand / "adapter_model.safetensors").write_bytes(b"weights")
    done = subprocess.run(["bash", str(GPU / "judge_qwen.sh"), "contrast-run"], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [line] = [ln for ln in calls.read_text().splitlines() if ln.startswith("-m reward_trainer.cli")]
    assert line.startswith("-m reward_trainer.cli judge-contrast ")
    assert f"--groups {tree}/.gpu-judge/groups.jsonl" in line and f"--adapter evidence={cand}" in line
    assert f"--out {run}/contrast-candidate" in line and "--max-items 120" in line and str(SHIPPED) not in line


def test_minilm_parts_are_joined_once_every_part_is_here(tmp_path: Path) -> None:
    """MiniLM travels in parts like the GGUF (``stage.sh``'s c6, c7 once the tree left no room for one folder): the
    device side names the folders still missing and joins the archive only when all of them were carried."""
    tree, stage = tmp_path / "tree", tmp_path / "stage"
    (tree / "tools").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(GPU), str(tree / "tools" / "gpu")], check=True)
    payload = os.urandom(3000)
    for i, (name, chunk) in enumerate((("c6", payload[:2000]), ("c7", payload[2000:]))):
        d = tmp_path / name  # a staging folder, here until a call carries it
        d.mkdir()
        (d / f"minilm-q8.tar.xz.part-{i:02d}").write_bytes(chunk)
        (d / "minilm.parts").write_text("2\n")
    env = {**os.environ, "STAGE_DIR": str(stage)}

    def carry(name: str) -> str:  # the call's tree holds this one staging folder; what does the device still lack?
        subprocess.run(["rm", "-rf", str(tree / ".gpu-policy")], check=True)
        if name:
            (tree / ".gpu-policy").mkdir()
            subprocess.run(["cp", "-r", str(tmp_path / name), str(tree / ".gpu-policy" / name)], check=True)
        return subprocess.run(["bash", "tools/gpu/device_evidence.sh", "minilm-missing"], cwd=tree, env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    assert carry("") == ".gpu-policy/c6 .."  # nothing carried yet: not even the count
    assert carry("c7") == ".gpu-policy/c6"
    assert not (stage / "minilm-q8.tar.xz").exists()
    assert carry("c6") == ""
    assert (stage / "minilm-q8.tar.xz").read_bytes() == payload


def test_an_adapter_from_history_travels_in_parts_and_is_unpacked_once_all_are_in(tmp_path: Path) -> None:
    """``stage_adapter.sh`` packs an adapter kept at a commit (REV:PATH; not in the tree that travels) into carry
    folders; ``vllm_judge.sh install`` copies the part each call carries, names the folders still missing, and once
    all are in joins them, checks size and sha256 and unpacks the adapter into the stage folder."""
    here, device, stage = tmp_path / "repo", tmp_path / "device", tmp_path / "stage"
    (here / "tools").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(GPU), str(here / "tools" / "gpu")], check=True)
    weights = os.urandom(10_000)
    (here / "kept").mkdir()
    (here / "kept" / "adapter_model.safetensors").write_bytes(weights)
    (here / "kept" / "adapter_config.json").write_text("{}")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "kept")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "kept")
    rev = git("rev-parse", "HEAD")
    git("rm", "-rq", "kept")  # gone from the tree, still in the commit
    env = {**os.environ, "PART_BYTES": "4096", "STAGE_DIR": str(stage)}
    subprocess.run(["bash", "tools/gpu/stage_adapter.sh", f"{rev}:kept", "round3"], cwd=here, env=env, check=True,
                   capture_output=True)
    folders = sorted(p.name for p in (here / ".gpu-adapter").iterdir())
    assert len(folders) >= 3 and folders[0] == "a01"
    (device / "tools").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(GPU), str(device / "tools" / "gpu")], check=True)

    def carry(name: str) -> str:  # one call on the device carrying this one folder
        subprocess.run(["rm", "-rf", str(device / ".gpu-adapter")], check=True)
        (device / ".gpu-adapter").mkdir()
        subprocess.run(["cp", "-r", str(here / ".gpu-adapter" / name), str(device / ".gpu-adapter" / name)], check=True)
        return subprocess.run(["bash", "tools/gpu/vllm_judge.sh", "install"], cwd=device, env=env, check=True,
                              capture_output=True, text=True).stdout

    for i, name in enumerate(reversed(folders[1:])):
        out = carry(name)
        assert "missing: .gpu-adapter/a01 " in out
        assert f"{i + 1} of {len(folders)} here" in out
        assert not (stage / "adapters").exists()
    out = carry("a01")
    assert "round3.adapter.tar joined and checked" in out
    assert (stage / "adapters" / "round3" / "adapter_model.safetensors").read_bytes() == weights
    assert (stage / "adapters" / "round3" / "adapter_config.json").read_text() == "{}"


def test_slim_sets_the_figures_and_adapters_aside_and_restores_them_byte_for_byte(tmp_path: Path) -> None:
    """``slim.sh hide`` takes the committed files of ``SLIM_PATHS`` out of the tree that travels (so the staging parts
    can be larger) without git seeing them as deleted, refuses to hide twice or to hide uncommitted work, and
    ``weights`` brings back only the adapters' weights (what the device calls read), and ``restore`` brings back the
    same bytes with git's view of them unchanged."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    def slim(action: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "tools/gpu/slim.sh", action], cwd=tmp_path, capture_output=True, text=True,
                              check=False)
        assert (done.returncode == 0) is ok, done.stderr
        return done

    (tmp_path / "tools" / "gpu").mkdir(parents=True)
    for name in ("slim.sh", "carry.sh"):
        (tmp_path / "tools" / "gpu" / name).write_text((GPU / name).read_text())
    aside = {"judge/adapters/a/adapter_model.safetensors": os.urandom(300_000),
             "docs/runs/r/completions.jsonl.xz": os.urandom(200_000), "docs/evaluations/e/report.md": b"figures\n"}
    stays = {"judge/adapters/a/adapter_config.json": b"{}\n", "docs/gpu.md": b"calls\n", "judge/x.py": b"x = 1\n"}
    for rel, data in {**aside, **stays}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t")

    def tree() -> int:
        return int(subprocess.run(["bash", "-c", f". {GPU / 'carry.sh'}; tree_bytes"], cwd=tmp_path,
                                  capture_output=True, text=True, check=True).stdout)

    whole = tree()
    (tmp_path / "docs/runs/r/new.txt").write_text("not committed yet")
    assert "commit or move" in slim("hide", ok=False).stderr  # uncommitted work under SLIM_PATHS is never set aside
    (tmp_path / "docs/runs/r/new.txt").unlink()
    slim("hide")
    assert not any((tmp_path / rel).exists() for rel in aside) and all((tmp_path / rel).exists() for rel in stays)
    assert tree() < whole - 500_000
    assert git("status", "--porcelain") == ""  # the hidden archive is ignored; nothing reads as deleted
    git("add", "-A")
    assert git("diff", "--cached", "--name-only") == ""  # `git add -A` cannot record the set-aside files as deleted
    assert "already hidden" in slim("hide", ok=False).stderr
    slim("weights")  # the device calls need the adapters' weights, not the figures
    weights = "judge/adapters/a/adapter_model.safetensors"
    assert (tmp_path / weights).read_bytes() == aside[weights]
    assert not any((tmp_path / rel).exists() for rel in aside if rel != weights)
    assert tree() < whole - 150_000 and git("status", "--porcelain") == ""
    skipped = [line[2:] for line in git("ls-files", "-v").splitlines() if line.startswith("S ")]
    assert weights not in skipped and len(skipped) == len(aside) - 1  # the weights are ordinary tracked files again
    slim("restore")
    assert all((tmp_path / rel).read_bytes() == data for rel, data in {**aside, **stays}.items())
    assert git("status", "--porcelain") == "" and tree() == whole
    assert not [line for line in git("ls-files", "-v").splitlines() if line.startswith("S ")]  # skip-worktree cleared
    assert "nothing hidden" in slim("restore").stdout


def test_stage_on_a_slimmed_tree_says_to_restore_first(tmp_path: Path) -> None:
    """``vllm_judge.sh stage`` merges the shipped adapters: on a tree whose weights ``slim.sh`` set aside it stops at
    once and names the command that brings them back, instead of failing later in the merge."""
    (tmp_path / "tools" / "gpu").mkdir(parents=True)
    (tmp_path / "tools" / "gpu" / "vllm_judge.sh").write_text((GPU / "vllm_judge.sh").read_text())
    (tmp_path / "judge" / "adapters" / "a").mkdir(parents=True)
    (tmp_path / "judge" / "adapters" / "a" / "adapter_config.json").write_text("{}")
    env = {**os.environ, "STAGE_DIR": str(tmp_path / "stage")}
    done = subprocess.run(["bash", "tools/gpu/vllm_judge.sh", "stage"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 1 and "slim.sh restore" in done.stderr
    (tmp_path / "judge" / "adapters" / "a" / "adapter_model.safetensors").write_bytes(b"weights")
    done = subprocess.run(["bash", "tools/gpu/vllm_judge.sh", "stage"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, check=False)
    assert "slim.sh restore" not in done.stderr  # past the check (vLLM is not installed here, so it stops there)


def test_two_bases_parts_are_joined_each_into_its_own_file(tmp_path: Path) -> None:
    """``stage_qwen.sh`` writes a base's GGUF as ``$OUT/q01 ..`` (default ``.gpu-qwen``; the 0.5B scorer's in
    ``OUT=.gpu-qwen05``); ``vllm_judge.sh install`` takes the parts of every ``.gpu-qwen*`` folder carried, one folder
    a call in any order, and joins each file under its own name once all its parts are in. Two files staged under the
    same prefix (their parts named alike: ``gguf.part-00`` ..) never mix either."""
    device, stage = tmp_path / "device", tmp_path / "stage"
    (device / "tools").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(GPU), str(device / "tools" / "gpu")], check=True)
    files = {"big.gguf": (".gpu-qwen", os.urandom(5000), 3), "small.gguf": (".gpu-qwen05", os.urandom(3000), 2),
             "other.gguf": (".gpu-qwen", os.urandom(2000), 2)}
    staged: dict[tuple[str, int], Path] = {}  # (file, part number) -> its carry folder, here until a call carries it
    for name, (out, payload, n) in files.items():
        size = -(-len(payload) // n)
        for i in range(n):
            d = tmp_path / "staging" / name / out / f"q{i + 1:02d}"
            d.mkdir(parents=True)
            (d / f"gguf.part-{i:02d}").write_bytes(payload[i * size:(i + 1) * size])
            (d / "parts.txt").write_text(f"{n} {len(payload)} {hashlib.sha256(payload).hexdigest()} {name}\n")
            staged[(name, i + 1)] = d
    env = {**os.environ, "STAGE_DIR": str(stage)}

    def carry(name: str, part: int) -> str:  # one call on the device carrying this one folder
        for old in device.glob(".gpu-qwen*"):
            subprocess.run(["rm", "-rf", str(old)], check=True)
        d = staged[(name, part)]
        (device / d.parent.name).mkdir()
        subprocess.run(["cp", "-r", str(d), str(device / d.parent.name / d.name)], check=True)
        return subprocess.run(["bash", "tools/gpu/vllm_judge.sh", "install"], cwd=device, env=env, check=True,
                              capture_output=True, text=True).stdout

    assert "big.gguf parts: 1 of 3 here; missing: .gpu-qwen/q01 .gpu-qwen/q03" in carry("big.gguf", 2)
    assert "other.gguf parts: 1 of 2 here; missing: .gpu-qwen/q01" in carry("other.gguf", 2)
    assert "small.gguf parts: 1 of 2 here; missing: .gpu-qwen05/q02" in carry("small.gguf", 1)
    carry("big.gguf", 1)
    assert "other.gguf joined and checked" in carry("other.gguf", 1)
    assert "small.gguf joined and checked" in carry("small.gguf", 2)
    assert "big.gguf joined and checked" in carry("big.gguf", 3)
    for name, (_, payload, _) in files.items():
        assert (stage / name).read_bytes() == payload
    assert not list(stage.glob("parts-*"))  # every part folder removed once its file was joined


def test_rejudge_serves_each_judge_in_turn_and_judges_every_runs_warm_up_again(tmp_path: Path) -> None:
    """`vllm_judge.sh rejudge`: each judge of ADAPTERS served on its own (a staged adapter by its folder), every seed
    folder of RUNS judged again by `compeer-loop rejudge` (POLICIES only), one tar per judge, and a judge done in an
    earlier call not judged again. A fake python3 stands in for the server and the CLI (the GPU run is the real one)."""
    import tarfile

    tree, fake, out, stage = tmp_path / "tree", tmp_path / "bin", tmp_path / "out", tmp_path / "stage"
    for d in (tree / "compeer_proto" / "reward" / "v1", fake, out, stage / "adapters" / "v2"):
        d.mkdir(parents=True)
    (tree / "compeer_proto" / "reward" / "v1" / "reward_pb2.py").write_text("")
    for run, seeds in (("r1", ("seed0",)), ("r2", ("seed1", "seed2"))):
        src = tmp_path / "src" / run
        for seed in seeds:
            (src / seed / "eval" / "a").mkdir(parents=True)
            (src / seed / "eval" / "a" / "records.jsonl").write_text("{}\n")
        (tree / "docs/evaluations/compeer-loop" / run / "inputs").mkdir(parents=True)
        with tarfile.open(tree / "docs/evaluations/compeer-loop" / run / "inputs/results.tar.xz", "w:xz") as tar:
            for seed in seeds:
                tar.add(src / seed, arcname=seed)
    (fake / "python3").write_text(
        '#!/usr/bin/env bash\necho "$@" >> "$CALLS"\n'
        'case "$*" in *"reward_server.cli serve"*) exec sleep 30;; *"compeer_loop.cli rejudge"*)\n'
        '  case "$*" in *"${FAIL_ON:-__never__}"*) exit 1;; esac\n'
        '  o=$(echo "$@" | sed -E "s/.*--out ([^ ]+).*/\\1/"); mkdir -p "$o"; echo "{}" > "$o/rejudged.json";; esac\n')
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(out), "STAGE_DIR": str(stage),
           "CALLS": str(tmp_path / "calls.txt"), "RUNS": "r1 r2", "ADAPTERS": "none v2", "POLICIES": "a"}
    done = subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rejudge"], env=env, cwd=tree, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    serves = [c for c in calls if "reward_server.cli serve" in c]
    assert [c.split("--adapter ")[1].split()[0] for c in serves] == ["none", f"{stage}/adapters/v2"]
    rejudges = [c for c in calls if "compeer_loop.cli rejudge" in c]
    assert len(rejudges) == 6 and all(c.endswith("--address 127.0.0.1:50052 --policies a") for c in rejudges)
    assert f"--out {stage}/rejudge/v2/r2-seed2" in rejudges[-1]
    for tag in ("none", "v2"):
        with tarfile.open(out / f"rejudge-{tag}.tar.xz") as tar:
            assert sorted(n for n in tar.getnames() if n.endswith("rejudged.json")) == [
                f"{tag}/r1-seed0/rejudged.json", f"{tag}/r2-seed1/rejudged.json", f"{tag}/r2-seed2/rejudged.json"]
    (tmp_path / "calls.txt").unlink()
    again = subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rejudge"], env=env, cwd=tree, capture_output=True,
                           text=True, timeout=60, check=True)
    assert "judge none: judged in an earlier call" in again.stdout and not (tmp_path / "calls.txt").exists()
    # a judge whose rejudge of one folder fails: the call fails, and no tar says that judge is done
    failed = subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rejudge"],
                            env={**env, "ADAPTERS": "default", "FAIL_ON": "r2/seed1"}, cwd=tree, capture_output=True,
                            text=True, timeout=60, check=False)
    assert failed.returncode == 1 and "rejudge of" in failed.stderr and not (out / "rejudge-default.tar.xz").exists()
    # too little of the call left for a judge: it is not started (no server on the card when the call ends)
    (tmp_path / "calls.txt").unlink()
    short = subprocess.run(["bash", str(GPU / "vllm_judge.sh"), "rejudge"],
                           env={**env, "ADAPTERS": "default", "CALL_BUDGET_S": "300"}, cwd=tree, capture_output=True,
                           text=True, timeout=60, check=False)
    assert short.returncode == 1 and "judge default: not started" in short.stdout
    assert not (tmp_path / "calls.txt").exists()  # no server started, nothing judged


def test_slim_sets_figures_aside_and_brings_back_the_weights_and_the_loop_archives(tmp_path: Path) -> None:
    """`slim.sh hide` sets the adapters' weights and the figures aside with git status clean; `weights` brings back
    the weights and the loop runs' results archives (what `vllm_judge.sh rejudge` reads) but no other figure;
    `restore` brings back everything."""
    tree = tmp_path / "tree"
    (tree / "tools" / "gpu").mkdir(parents=True)
    for name in ("slim.sh", "carry.sh"):
        (tree / "tools" / "gpu" / name).write_text((GPU / name).read_text())
    files = {"judge/adapters/j/adapter_model.safetensors": "w", "judge/adapters/j/adapter_config.json": "{}",
             "docs/evaluations/compeer-loop/r/inputs/results.tar.xz": "t",
             "docs/evaluations/compeer-loop/r/report.md": "figures", "docs/runs/x.json": "{}"}
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)

    def sh(*args: str) -> str:
        return subprocess.run(list(args), cwd=tree, capture_output=True, text=True, check=True, timeout=60).stdout

    sh("git", "init", "-q")
    sh("git", "add", "-A")
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree")

    def there() -> set[str]:
        return {rel for rel in files if (tree / rel).exists()}

    sh("bash", "tools/gpu/slim.sh", "hide")
    assert there() == {"judge/adapters/j/adapter_config.json"} and sh("git", "status", "--porcelain") == ""
    sh("bash", "tools/gpu/slim.sh", "weights")
    assert there() == {"judge/adapters/j/adapter_config.json", "judge/adapters/j/adapter_model.safetensors",
                       "docs/evaluations/compeer-loop/r/inputs/results.tar.xz"}
    assert sh("git", "status", "--porcelain") == ""
    sh("bash", "tools/gpu/slim.sh", "restore")
    assert there() == set(files) and sh("git", "status", "--porcelain") == ""
