"""evaluator: resumable runs, call cache, model specs, reports, human pairwise export/import, the CLI."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from evaluator import esc_eval
from evaluator.backends import EngineError, ModelSpec, add_role_options, resolve_spec, spec_from_args
from evaluator.cli import main
from evaluator.inputs import load_cards
from evaluator.pairwise import VoteError, export_pairs, import_votes, outcomes, read_votes, win_rates
from evaluator.prompts import load_prompts
from evaluator.report import write_report
from evaluator.runs import ITEMS, RunDir, RunError, run_items
from tests.unit.evaluator_fakes import fake_roles

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"


async def test_run_resumes_after_a_kill_and_retries_engine_errors(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "run", "esc", {"rounds": 1})
    calls: list[str] = []
    gate = asyncio.Event()

    async def slow(x: str) -> dict[str, Any]:
        calls.append(x)
        if x == "c":
            await gate.wait()  # never set: the run is "killed" while c is in flight
        if x == "b":
            raise EngineError("engine went away")
        return {"id": x, "status": "ok", "value": x.upper()}

    task = asyncio.create_task(run_items(run, [("a", "a"), ("b", "b"), ("c", "c")], slow, 3, "t"))
    while len(run.records()) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with (run.path / ITEMS).open("a") as fh:
        fh.write('{"id": "c", "sta')  # a line cut short by the kill
    assert set(run.finished()) == {"a"} and run.records()["b"]["status"] == "engine_error"

    calls.clear()
    again = RunDir.open(tmp_path / "run", "esc", {"rounds": 1})

    async def fine(x: str) -> dict[str, Any]:
        calls.append(x)
        return {"id": x, "status": "ok", "value": x.upper()}

    records = await run_items(again, [("a", "a"), ("b", "b"), ("c", "c")], fine, 2, "t")
    assert sorted(calls) == ["b", "c"]  # a was finished; b (engine error) and c (killed) run again
    assert [r["value"] for r in records] == ["A", "B", "C"]


def test_run_folder_with_other_settings_is_refused(tmp_path: Path) -> None:
    RunDir.open(tmp_path / "r", "esc", {"rounds": 5, "seed": 0})
    with pytest.raises(RunError, match="rounds"):
        RunDir.open(tmp_path / "r", "esc", {"rounds": 3, "seed": 0})
    with pytest.raises(RunError, match="'esc' run"):
        RunDir.open(tmp_path / "r", "sage", {"rounds": 5, "seed": 0})
    assert RunDir.open(tmp_path / "r", "esc", {"rounds": 3}, overwrite=True).manifest()["config"] == {"rounds": 3}


async def test_calls_are_cached_across_runs(tmp_path: Path) -> None:
    card, prompts = load_cards()[0], load_prompts()
    judge = "Reason: fine.\nScore: 2"
    roles, engines = fake_roles(lambda m, p: "I see.", lambda m, p: "I feel alone.", lambda m, p: judge, tmp_path)
    first = await esc_eval.run_card(card, roles, prompts, esc_eval.EscConfig(rounds=2))
    n = sum(len(e.calls) for e in engines.values())
    assert n == 2 + 2 + 7
    roles, engines = fake_roles(lambda m, p: "other", lambda m, p: "other", lambda m, p: "other", tmp_path)
    again = await esc_eval.run_card(card, roles, prompts, esc_eval.EscConfig(rounds=2))
    assert again == first and sum(len(e.calls) for e in engines.values()) == 0
    assert all(e.starts == 0 for e in engines.values())  # nothing generated: no engine started


async def test_identical_asks_in_flight_share_one_generation(tmp_path: Path) -> None:
    roles, engines = fake_roles(lambda m, p: "same", lambda m, p: "", lambda m, p: "", tmp_path)
    msgs = [{"role": "user", "content": "hello"}]
    a, b, c = await asyncio.gather(roles.model.ask(msgs, str.strip, "a"), roles.model.ask(msgs, str.strip, "b"),
                                   roles.model.ask([{"role": "user", "content": "other"}], str.strip, "c"))
    assert a.value == b.value == c.value == "same" and len(engines["model"].calls) == 2


def test_model_specs_and_policy_checkpoints(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_role_options(parser, "model", max_tokens=64)
    add_role_options(parser, "scorer")
    args = parser.parse_args(["--model", "m1", "--model-backend", "openai", "--model-base-url", "http://x/v1",
                              "--scorer-temperature", "0.5", "--no-scorer-openai-regex"])
    assert spec_from_args(args, "model") == ModelSpec(model="m1", backend="openai", base_url="http://x/v1",
                                                      max_tokens=64)
    assert spec_from_args(args, "scorer").temperature == 0.5
    assert resolve_spec(spec_from_args(args, "model")).identity == "m1"
    with pytest.raises(ValueError, match="base_url"):
        ModelSpec(backend="openai")
    # a policy_trainer run folder: OUT/final holds the adapter, whose config names the base folder
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    (final / "adapter_model.safetensors").write_bytes(b"weights")
    resolved = resolve_spec(ModelSpec(model=str(tmp_path / "run")))
    assert resolved.config.model_path == str(base) and resolved.config.adapter == str(final)
    assert resolved.identity.startswith("base+final@sha256:")
    (final / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/not-here"}))
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        resolve_spec(ModelSpec(model=str(final)))


def _fake_run(path: Path, harness: str, replies: dict[str, str]) -> Path:
    run = RunDir.open(path, harness, {"roles": {"model": {"identity": path.name}}})
    for item, text in replies.items():
        run.append({"id": item, "status": "ok", "history": [{"role": "seeker", "text": f"help {item}"}],
                    "text": text, "reference": "I hear you, that is hard.", "gold_strategy": None})
    return path


def test_pairwise_export_and_hand_computed_rates(tmp_path: Path) -> None:
    a = _fake_run(tmp_path / "model_a", "gold", {"1": "A1", "2": "A2", "3": "A3", "4": "A4"})
    b = _fake_run(tmp_path / "model_b", "gold", {"1": "B1", "2": "B2", "3": "B3", "5": "B5"})
    key = export_pairs(a, b, tmp_path / "pairs", seed=3)
    assert len(key["pairs"]) == 3  # items both runs finished
    rows = list(csv.DictReader((tmp_path / "pairs" / "pairs.csv").open()))
    for row in rows:  # the recorded order says where A's text is
        a_left = key["pairs"][row["pair_id"]]["left"] == "A"
        assert (row["left"] if a_left else row["right"]).startswith("A")
        assert row["context"] == f"Seeker: help {row['item_id']}"
    tasks = json.loads((tmp_path / "pairs" / "labelstudio_tasks.json").read_text())
    assert {t["data"]["pair_id"] for t in tasks} == set(key["pairs"])
    assert '<Choices name="vote"' in (tmp_path / "pairs" / "labelstudio_config.xml").read_text()

    # votes that prefer A on p0000 twice, tie on p0001, B on p0002 -> win 2/4, tie 1/4, loss 1/4
    def side(pid: str, who: str) -> str:
        return "left" if (key["pairs"][pid]["left"] == who) else "right"
    votes = tmp_path / "votes.csv"
    votes.write_text("pair_id,vote,annotator\n" + f"p0000,{side('p0000', 'A')},ann1\np0000,{side('p0000', 'A')},ann2\n"
                     f"p0001,tie,ann1\np0002,{side('p0002', 'B')},ann1\np0002,,ann2\n")
    result = import_votes(tmp_path / "pairs", votes, tmp_path / "out", n_boot=500)
    assert (result["votes"], result["pairs"]) == (4, 3)
    assert (result["win"]["rate"], result["tie"]["rate"], result["loss"]["rate"]) == (0.5, 0.25, 0.25)
    lo, hi = result["win"]["ci95"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0 and lo < hi
    assert (tmp_path / "out" / "pairwise.png").stat().st_size > 1000
    assert "| win | 50.0% |" in (tmp_path / "out" / "pairwise.md").read_text()

    # the same votes from Label Studio's JSON export (one cancelled annotation is ignored)
    ls = [{"data": {"pair_id": pid}, "annotations": [
        {"id": k, "completed_by": 1, "was_cancelled": False,
         "result": [{"from_name": "vote", "to_name": "left", "type": "choices", "value": {"choices": [v]}}]}
        for k, v in enumerate(vs)] + [{"id": 99, "was_cancelled": True, "result": []}]}
        for pid, vs in (("p0000", [side("p0000", "A")] * 2), ("p0001", ["tie"]), ("p0002", [side("p0002", "B")]))]
    export = tmp_path / "export.json"
    export.write_text(json.dumps(ls))
    assert sorted(outcomes(read_votes(export), key)) == [("p0000", 1), ("p0000", 1), ("p0001", 0), ("p0002", -1)]
    bad = tmp_path / "bad.csv"
    bad.write_text("pair_id,vote\np0000,maybe\n")
    with pytest.raises(VoteError, match="bad.csv:2"):
        read_votes(bad)
    with pytest.raises(VoteError, match="unknown pair"):
        outcomes([("p9999", "tie", "")], key)


def test_bootstrap_of_unanimous_votes_is_a_point() -> None:
    rates = win_rates([("p1", 1), ("p2", 1), ("p3", 1)], n_boot=200)
    assert rates["win"] == {"rate": 1.0, "ci95": [1.0, 1.0]} and rates["loss"]["ci95"] == [0.0, 0.0]


def test_report_over_two_runs(tmp_path: Path) -> None:
    a = _fake_run(tmp_path / "a", "gold", {"1": "That sounds hard."})
    b = _fake_run(tmp_path / "b", "gold", {"1": "I hear you, that is hard."})
    for p in (a, b):
        manifest = json.loads((p / "manifest.json").read_text())
        manifest["config"]["harness"] = {"model_format": "plain"}
        (p / "manifest.json").write_text(json.dumps(manifest))
    report = write_report([a, b], tmp_path / "rep").read_text()
    assert "| a | 1/1 |" in report and "| b | 1/1 | 100.00 |" in report  # b repeats the gold reply: BLEU-2 100
    assert json.loads((a / "results.json").read_text())["summary"]["answered"] == 1


def test_cli_cards_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cards.json"
    assert main(["cards", "--esconv", str(FIX / "esconv.json"), "--out", str(out), "--limit", "3"]) == 0
    cards = json.loads(out.read_text())
    assert len(cards) == 3 and set(cards[0]) == {"base", "res", "source", "base_biaozhu", "language", "id"}
    assert load_cards(out)[0].source == "ESConv"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"base": "x", "language": "klingon", "id": 1}]))
    assert main(["esc", "--cards", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "[0].language" in capsys.readouterr().err
