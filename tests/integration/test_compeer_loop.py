"""The COMPEER loop end to end on CPU with tiny steps: prompt sets from an ESConv-format file, the driver process
(``compeer-loop run``) starting a real reward server (the shipped trained judge, transformers engine), the warm-up
(arm a) alone, then, with the plan widened (``--overwrite``), one GRPO step of arm c from that warm-up and the
evaluation of both policies (evaluator harness + the judge over gRPC), a further run that finds everything done and
starts nothing, and the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from compeer_loop import cli
from compeer_loop.prompts import read_jsonl
from compeer_loop.report import write_report
from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder" / "esconv.json"
REPO = Path(__file__).resolve().parents[2]


def _run(root: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compeer_loop.cli", "run", "--root", str(root)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_the_loop_runs_arms_evaluates_resumes_and_reports(tmp_path: Path) -> None:
    dialogues = json.loads(FIXTURE.read_text())
    (tmp_path / "train.json").write_text(json.dumps(dialogues[:3]))
    (tmp_path / "valid.json").write_text(json.dumps(dialogues[3:]))
    data, root = tmp_path / "data", tmp_path / "loop"
    # the default: several rounds of each valid dialogue (issue 26: >= 500 valid turns on ESConv's 195 dialogues)
    assert cli.main(["prompts", "--train", str(tmp_path / "train.json"), "--valid", str(tmp_path / "valid.json"),
                     "--out", str(tmp_path / "data3")]) == 0
    rows3 = list(read_jsonl(tmp_path / "data3" / "eval.jsonl"))
    assert len(rows3) > 2 and len({r["id"] for r in rows3}) == len(rows3)
    assert len({r["dialogue_id"] for r in rows3}) == 2  # both valid dialogues, several rounds each
    assert cli.main(["prompts", "--train", str(tmp_path / "train.json"), "--valid", str(tmp_path / "valid.json"),
                     "--out", str(data), "--eval-rounds", "1"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["counts"]["eval"] == 2  # one round per valid dialogue
    assert {r["dialogue_id"] for r in read_jsonl(data / "eval.jsonl")}.isdisjoint(
        {r["dialogue_id"] for r in read_jsonl(data / "grpo_train.jsonl")})
    common = ["--root", str(root), "--prompts", str(data), "--steps", "1",
              "--profile", "cpu-smoke", "--device", "cpu", "--no-static-cache", "--warmup-steps", "1",
              "--save-steps", "1", "--max-completion-length", "16", "--grpo-sets", "max_prompts=2",
              "per_device_train_batch_size=2", "--eval-limit", "2",
              "--eval-max-tokens", "16", "--eval-concurrency", "2", "--esc-cards", "1", "--esc-rounds", "1",
              "--judge-probe-groups", "2", "--base-port", str(free_port())]
    assert len(json.loads((data / "cards.json").read_text())) == 2  # one ESC-Eval card per valid dialogue

    # phase 1, the warm-up alone (as a machine that also trains the PRM/ORM judges runs it)
    assert cli.main(["plan", *common, "--arms", "a", "--eval-policies"]) == 0
    warmup_only = _run(root)
    assert warmup_only.returncode == 0, warmup_only.stderr[-3000:]
    assert json.loads((root / "state.json").read_text())["arms"]["a"]["status"] == "done"
    warmup_log = (root / "logs" / "a.log").stat().st_size
    # phase 2 on the same folder: more arms need --overwrite; the warm-up on disk is reused, never retrained
    assert cli.main(["plan", *common, "--arms", "a", "c", "--eval-policies", "a", "c"]) == 2
    assert cli.main(["plan", *common, "--arms", "a", "c", "--eval-policies", "a", "c", "--overwrite"]) == 0
    first = _run(root)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted((root / "logs").glob("*.log")))
    assert first.returncode == 0, first.stderr[-3000:] + logs
    assert (root / "logs" / "a.log").stat().st_size == warmup_log, "arm a was trained again"
    assert (root / "DONE").read_text() == "ok", logs
    state = json.loads((root / "state.json").read_text())
    assert {k: v["status"] for k, v in state["arms"].items()} == {"a": "done", "c": "done"}
    assert state["eval"] == {"a": "done", "c": "done"}
    # arm c was checked against the shipped trained judge (Info) and its probe scored before it trained
    judge = json.loads((root / "c" / "judge.json").read_text())["judges"][0]
    assert judge["served"]["adapter"] == judge["expected"]["adapter"] and "@sha256:" in judge["served"]["adapter"]
    assert judge["probe"]["candidates"] == 4 and judge["probe"]["at"] < (root / "c" / "final").stat().st_mtime

    # arm c started from arm a's warm-up and its GRPO step moved the LoRA weights away from it
    warm = load_file(str(root / "a" / "warmup" / "adapter" / "adapter_model.safetensors"))
    assert (root / "c" / "warmup" / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (root / "a" / "warmup" / "adapter" / "adapter_model.safetensors").read_bytes()
    final = load_file(str(root / "c" / "final" / "adapter_model.safetensors"))
    assert any(float((final[k] - warm[k]).abs().max()) > 0 for k in warm if k in final)
    assert [r["step"] for r in read_jsonl(root / "c" / "metrics.jsonl")] == [1]
    for policy in ("a", "c"):
        records = read_jsonl(root / "eval" / policy / "records.jsonl")
        assert len(records) == 2 and all(r["status"] == "ok" for r in records)
        assert all(r["judge_status"] in ("ok", "parse_failed") for r in records), records
        assert all(r["reward_format"] is not None for r in records)
        # the server serves graded rewards by default: the evaluation keeps the graded total beside the discrete one
        assert all(isinstance(r["reward_total_graded"], float) for r in records if r["judge_status"] == "ok"), records
        # the independent scorer (the bare judge base) compared every reply with the real one in both orders
        assert all(r["independent_status"] in ("ok", "failed") and r["independent_win"] in (None, 0.0, 0.5, 1.0)
                   and (r["independent_win"] is None) == (r["independent_status"] != "ok") for r in records), records
        esc = json.loads((root / "eval" / policy / "esc.json").read_text())  # 1 card, 1 round, base as scorer
        assert esc["dialogues"] == 1 and esc["rounds"] == 1 and len(esc["dimensions"]) == 7, esc
        assert esc["roles"]["scorer"] == esc["roles"]["simulator"] != esc["roles"]["model"]

    # started again: every arm and evaluation is done, so nothing is trained or evaluated again
    sizes = {p.name: p.stat().st_size for p in (root / "logs").glob("*.log")}
    second = _run(root, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {p.name: p.stat().st_size for p in (root / "logs").glob("*.log")} == sizes
    assert (root / "DONE").read_text() == "ok"

    report = write_report(root, tmp_path / "report", n_boot=50)
    text = report.read_text()
    assert "| (a) SFT warm-up only |" in text and "| (c) GRPO, trained judge, reweighting paper |" in text
    assert "## ESC-Eval-style evaluation" in text and "scores unparsed %" in text
    assert "## The judge each arm trained against, and where it ran" in text and judge["served"]["adapter"] in text
    figures = json.loads((tmp_path / "report" / "figures.json").read_text())
    assert figures["c"]["figures"]["format_ok"]["value"] is not None
    assert (tmp_path / "report" / "curves_reward.png").exists()
