"""compeer-eval end to end on the real default model (SmolLM2-135M-Instruct, transformers engine, CPU): ESC-Eval
over 2 cards, SAGE over 2 profiles, ESConv held-out turns on a policy checkpoint (base + LoRA), and a run killed
mid-way that resumes. Short rounds and few tokens keep each test around a minute."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evaluator.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"
SHORT = ["--model-max-tokens", "16", "--simulator-max-tokens", "16", "--scorer-max-tokens", "48"]


def _results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def test_esc_two_cards_scored_on_seven_dimensions(tmp_path: Path) -> None:
    run = tmp_path / "esc"
    assert main(["esc", "--out", str(run), "--limit", "2", "--rounds", "2", "--concurrency", "2", *SHORT]) == 0
    res = _results(run)
    items = res["items"]
    assert [i["status"] for i in items] == ["ok", "ok"]
    for item in items:
        assert [t["role"] for t in item["dialogue"]] == ["seeker", "supporter"] * 2
        assert all(t["text"] for t in item["dialogue"] if t["role"] == "seeker")
        assert len(item["scores"]) == 7
        for name, s in item["scores"].items():  # a score is 0-4 or None-and-listed, never anything else
            assert s["score"] in (0, 1, 2, 3, 4) or (s["score"] is None and name in item["unparsed"])
    summary = res["summary"]
    assert summary["dialogues"] == 2 and summary["replies"]["replies"] == 4
    assert summary["replies"]["distinct_1"] is not None
    roles = res["manifest"]["config"]["roles"]
    assert roles["model"]["identity"] == roles["scorer"]["identity"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (run / "esc_radar.png").stat().st_size > 5000 and "| esc | 2/2 |" in (run / "report.md").read_text()


def test_sage_two_profiles_with_emotion_trajectories(tmp_path: Path) -> None:
    run = tmp_path / "sage"
    assert main(["sage", "--out", str(run), "--limit", "2", "--max-rounds", "2", "--concurrency", "2",
                 "--model-max-tokens", "16", "--simulator-max-tokens", "48"]) == 0
    res = _results(run)
    for item in res["items"]:
        assert item["status"] in ("success", "failure", "max_rounds", "unparsed", "simulator_failed")
        assert item["trajectory"][0] == 40
        steps = [b - a for a, b in zip(item["trajectory"], item["trajectory"][1:])]
        assert all(-10 <= s <= 10 for s in steps) and len(steps) <= 2
    summary = res["summary"]
    assert summary["dialogues"] == 2
    assert summary["scored"] + summary["unparsed"] + summary["statuses"].get("simulator_failed", 0) == 2
    assert (run / "sage_trajectories_0.png").stat().st_size > 5000


def test_gold_turns_on_a_policy_checkpoint(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from judge.model_store import prepare_default_model

    base = prepare_default_model()
    policy_run = tmp_path / "grpo"  # shaped as policy_trainer leaves it: OUT/final is the LoRA adapter
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base.path),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(str(policy_run / "final"))
    run = tmp_path / "gold"
    assert main(["gold", "--out", str(run), "--esconv", str(FIX / "esconv.json"), "--limit", "3",
                 "--model", str(policy_run), "--model-max-tokens", "24"]) == 0
    res = _results(run)
    assert res["manifest"]["config"]["roles"]["model"]["identity"].startswith(
        "HuggingFaceTB/SmolLM2-135M-Instruct+final@sha256:")
    summary = res["summary"]
    assert summary["answered"] == 3 and summary["bleu_2"] is not None and summary["rouge_l"] is not None
    assert summary["strategy"]["n"] >= 1 and summary["format_ok_rate"] is not None


def test_killed_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    run = tmp_path / "esc"
    cmd = [sys.executable, "-m", "evaluator.cli", "esc", "--out", str(run), "--limit", "2", "--rounds", "1",
           "--concurrency", "1", *SHORT]
    log = (tmp_path / "first.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    items = run / "items.jsonl"
    deadline = time.monotonic() + 300
    while not (items.exists() and items.read_text().count("\n") >= 1):
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the first dialogue did not finish in 300 s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    first = items.read_text().splitlines()
    assert len(first) == 1, "killed after the first card and before the second"
    cached = sum(1 for _ in (run / "cache").rglob("*.json"))

    assert main(cmd[3:]) == 0
    lines = items.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == first[0], "the finished card was not run again"
    assert [i["status"] for i in _results(run)["items"]] == ["ok", "ok"]
    assert sum(1 for _ in (run / "cache").rglob("*.json")) > cached
