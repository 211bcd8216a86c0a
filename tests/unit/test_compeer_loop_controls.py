"""compeer_loop's controls and placement (issue 26, items 1 and 5): the judge each arm trains against is checked
against the plan through the reward server's real HTTP front (FAKE engine) before the arm trains, a mismatch stops
the arm, the probe's means are recorded; processes are placed on cards and each arm's machine is recorded."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cer.reasoning import render
from compeer_loop import controls, runner
from compeer_loop.controls import JudgeControlError, check_served, expected_judge, verify_arm
from compeer_loop.placement import (
    Placement,
    card_env,
    default_concurrency,
    detect_cards,
    pick_card,
    plan_placement,
    record_launch,
    where_ran,
)
from compeer_loop.plan import ARM_BY_NAME, JudgeServer, LoopSettings, all_judges
from compeer_loop.seeds import Replicate
from judge.engines.base import EngineConfig
from tests.unit.fakes import scripted_judge
from tests.unit.live_service import live_service

_FAKE_WARMUP = """
import pathlib, sys
root = pathlib.Path(sys.argv[sys.argv.index("--root") + 1])
(root / "a" / "warmup" / "adapter").mkdir(parents=True)
(root / "a" / "warmup" / "adapter" / "adapter_config.json").write_text("{}")
"""
# records its card and the cards of the arms running beside it, then finishes
_FAKE_ARM = """
import os, pathlib, sys, time
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
card = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
(out.parent / (out.name + ".running")).write_text(card)
time.sleep(0.8)  # the arms started beside it have written their .running by now
others = sorted(p.read_text() for p in out.parent.glob("*.running") if p.stem != out.name)
with (out.parent / "calls.log").open("a") as fh:
    fh.write(out.name + " " + card + " " + ",".join(others) + "\\n")
time.sleep(0.2)
(out.parent / (out.name + ".running")).unlink()
(out / "final").mkdir(parents=True)
(out / "final" / "adapter_config.json").write_text("{}")
"""


def _prompts(folder: Path, n: int = 3) -> Path:
    """A prompt folder with the warm-up rows the probe is built from."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"dialogue_id": f"d{i}", "history": [{"role": "seeker", "text": f"I feel lost about job {i}."}],
             "target": render({"analysis": f"Job worry {i}.", "emotion": "negative, anxiety, 4",
                               "strategy": "Question, to learn more", "response": f"What happened at job {i}?"})}
            for i in range(n)]
    (folder / "warmup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> tuple[Path, LoopSettings]:
    root = tmp_path / "loop"
    root.mkdir()
    s = LoopSettings(prompts=str(_prompts(tmp_path / "data")), eval_policies=[], **settings)
    (root / "plan.json").write_text(json.dumps(s.to_json()))
    monkeypatch.setattr(runner, "POLL_S", 0.05)
    monkeypatch.setattr(runner, "ready", lambda server, timeout_s=2.0: True)
    monkeypatch.setattr(runner, "warmup_argv",
                        lambda s, root: [sys.executable, "-c", _FAKE_WARMUP, "--root", str(root)])
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM, "--out", str(root / arm.name)])
    return root, s


def _engine(e: controls.ExpectedJudge, adapter: str | None) -> EngineConfig:
    """What a FAKE engine reports: the plan's base and revision, and ``adapter``."""
    return EngineConfig(backend="fake", model_id=e.model, revision=f"fake+{e.revision_hash}", adapter_id=adapter)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# ---- item 1: the judges are what the plan says ------------------------------------------------------------------
def test_the_plan_expects_the_bare_base_for_b_and_the_shipped_adapter_for_the_trained_judge() -> None:
    for device, base_id in (("cuda", "Qwen"), ("cpu", "SmolLM2")):
        s = LoopSettings(device=device)
        judges = all_judges(s)
        bare, trained = expected_judge(judges["base"], s), expected_judge(judges["trained"], s)
        assert bare.adapter is None and base_id in bare.model
        assert (trained.model, trained.revision_hash) == (bare.model, bare.revision_hash)
        assert trained.adapter is not None and "@sha256:" in trained.adapter and "esconv" in trained.adapter
    with pytest.raises(JudgeControlError, match="judge prm: .*not a PEFT adapter folder"):
        s = LoopSettings(prm_adapter="/nowhere/prm", orm_adapter="/nowhere/orm")
        expected_judge(all_judges(s)["prm"], s)


def test_a_served_judge_unlike_the_plan_is_named_expected_against_served() -> None:
    s = LoopSettings()
    bare, trained = (expected_judge(all_judges(s)[n], s) for n in ("base", "trained"))
    served = {"model": bare.model, "revision": f"x+{bare.revision_hash}", "adapter": None}
    check_served(bare, served)
    check_served(bare, {**served, "adapter": ""})  # an empty adapter is none
    with pytest.raises(JudgeControlError, match="independent rounds served"):
        check_served(bare, {**served, "independent_rounds": True})
    with pytest.raises(JudgeControlError, match=rf"adapter none \(the bare base\) expected, {trained.adapter} served"):
        check_served(bare, {**served, "adapter": trained.adapter})  # the bug of issue 26: (b) against the trained judge
    with pytest.raises(JudgeControlError, match=rf"adapter {trained.adapter} expected, none"):
        check_served(trained, served)
    with pytest.raises(JudgeControlError, match="model .* expected, 'other' served; a revision naming"):
        check_served(bare, {"model": "other", "revision": "r1", "adapter": None})


def test_the_driver_checks_each_judge_and_probes_it_before_the_arm_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real HTTP fronts (FAKE engines): the bare base prefers the reference, the trained judge the candidate.
    Both arms train; each arm's judge.json names what its server served and the probe's means, which differ."""
    root, s = _loop(tmp_path, monkeypatch, arms=["a", "b", "c"])
    bare, trained = (expected_judge(all_judges(s)[n], s) for n in ("base", "trained"))
    with live_service(_engine(bare, None), scripted_judge(preference="first")) as b_svc, \
            live_service(_engine(trained, trained.adapter), scripted_judge(preference="second")) as t_svc:
        servers = {"base": JudgeServer("base", "none", 1, _port(b_svc.http_url)),
                   "trained": JudgeServer("trained", "default", 2, _port(t_svc.http_url))}
        monkeypatch.setattr(runner, "judge_servers", lambda s: servers)
        state = runner.Driver(root, s).run(evaluate=False)
    assert {k: v["status"] for k, v in state["arms"].items()} == {"a": "done", "b": "done", "c": "done"}
    b, c = (json.loads((root / arm / "judge.json").read_text())["judges"] for arm in "bc")
    assert [j["server"] for j in b] == ["base"] and b[0]["served"]["adapter"] is None
    assert c[0]["served"]["adapter"] == trained.adapter and c[0]["served"]["model"] == trained.model
    # the temperature its graded rewards were tempered by is recorded too (None: the server serves no graded rewards)
    assert all("verdict_temperature" in j["served"] for j in (*b, *c))
    assert b[0]["probe"]["ok"] == c[0]["probe"]["ok"] == 6  # 3 groups of 2 candidates
    assert (b[0]["probe"]["preference"], c[0]["probe"]["preference"]) == (-1.0, 1.0)
    assert state["arms"]["b"]["judge"] == [{"server": "base", "model": bare.model,
                                            "revision": f"fake+{bare.revision_hash}", "adapter": None}]
    from compeer_loop.report_runs import control_line, judges_and_machines, trained_against

    assert trained_against([Replicate(root, s)])["b"].endswith("no adapter (bare base)")
    assert trained.adapter in trained_against([Replicate(root, s)])["c"]
    section = judges_and_machines([Replicate(root, s)])
    assert "| (b) | base (`--adapter none`) |" in section and "| none (bare base) | -1.00 /" in section
    assert "preference -1.00 vs 1.00;" in control_line(root, s)


def test_a_judge_serving_the_wrong_adapter_stops_its_arm_and_no_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server meant to be the bare base serves the trained judge (what `--adapter none` once did): arm (b) is
    marked failed naming expected and served, its trainer never starts, arm (c) trains."""
    root, s = _loop(tmp_path, monkeypatch, arms=["a", "b", "c"])
    trained = expected_judge(all_judges(s)["trained"], s)
    with live_service(_engine(trained, trained.adapter)) as svc:
        servers = {name: JudgeServer(name, flag, 1, _port(svc.http_url))
                   for name, flag in (("base", "none"), ("trained", "default"))}
        monkeypatch.setattr(runner, "judge_servers", lambda s: servers)
        state = runner.Driver(root, s).run(evaluate=False)
    status = state["arms"]["b"]["status"]
    assert status.startswith("failed: judge base does not serve what the plan says")
    assert f"adapter none (the bare base) expected, {trained.adapter} served" in status
    assert state["arms"]["c"]["status"] == "done"
    assert [line.split()[0] for line in (root / "calls.log").read_text().splitlines()] == ["c"]
    assert not (root / "b" / "judge.json").exists() and (root / "DONE").read_text() == "FAILED: b"


def test_a_resumed_arm_keeps_its_first_probe_and_must_find_the_same_judge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = LoopSettings(prompts=str(_prompts(tmp_path / "data")))
    bare = expected_judge(all_judges(s)["base"], s)
    info = {"model": bare.model, "revision": f"r+{bare.revision_hash}", "adapter": None}
    served = dict(info)
    calls: list[str] = []
    monkeypatch.setattr(controls, "fetch_info", lambda server, timeout_s=10.0: dict(served))

    def score(server: JudgeServer, groups: list[dict[str, Any]], timeout_s: float = 600.0) -> dict[str, Any]:
        calls.append(server.name)
        result = {"status": "ok", "rewards": {"steps": [1.0, 1.0, -1.0], "preference": -1.0, "format": 1.0,
                                              "total": 2.0}}
        return {"groups": [{"results": [result] * len(g["candidates"]), "meta": info} for g in groups]}

    monkeypatch.setattr(controls, "score_probe", score)
    out = tmp_path / "b"
    first = verify_arm(ARM_BY_NAME["b"], s, all_judges(s), out, {})
    assert first["judges"][0]["probe"]["step"] == pytest.approx(1 / 3) and calls == ["base"]
    again = verify_arm(ARM_BY_NAME["b"], s, all_judges(s), out, {})  # a restart: no new probe
    assert again["judges"][0]["probe"] == first["judges"][0]["probe"] and calls == ["base"]
    assert len(again["verified_at"]) == 2
    served["revision"] = f"another+{bare.revision_hash}"
    with pytest.raises(JudgeControlError, match="before its restart"):
        verify_arm(ARM_BY_NAME["b"], s, all_judges(s), out, {})


# ---- item 5: cards and machines ---------------------------------------------------------------------------------
def test_placement_puts_the_judges_on_the_first_card_and_spreads_the_arms() -> None:
    assert plan_placement([]) == Placement() and default_concurrency(Placement()) == 2 and card_env(None) == {}
    one = plan_placement(["0"])
    assert one.shared and one.arm_cards == ("0",) and default_concurrency(one) == 2
    four = plan_placement(["0", "1", "2", "3"])
    assert (four.judge_card, four.arm_cards, four.shared) == ("0", ("1", "2", "3"), False)
    assert default_concurrency(four) == 3 and default_concurrency(plan_placement(["4", "5"])) == 1
    assert pick_card(four, []) == "1" and pick_card(four, ["1"]) == "2" and pick_card(four, ["1", "2", "3"]) == "1"
    assert pick_card(four, ["1", "3", "1"]) == "2" and pick_card(Placement(), ["x"]) is None
    assert card_env("2") == {"CUDA_VISIBLE_DEVICES": "2"}
    assert detect_cards({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert detect_cards({"CUDA_VISIBLE_DEVICES": ""}) == [] and detect_cards({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_on_four_cards_three_arms_run_at_once_one_per_card_and_each_records_its_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, s = _loop(tmp_path, monkeypatch, arms=["a", "b", "c", "d", "e"], cards=["0", "1", "2", "3"])
    monkeypatch.setattr(runner, "verify_arm", lambda *args: {})  # the judge checks: tests above
    monkeypatch.setattr(runner, "machine_info", lambda: {"hostname": "gpu-host-1", "gpu_count": 4,
                                                         "gpus": "4 x NVIDIA H100 80GB HBM3"})
    state = runner.Driver(root, s).run(evaluate=False)
    assert {v["status"] for v in state["arms"].values()} == {"done"}
    assert state["placement"] == {"judge_card": "0", "arm_cards": ["1", "2", "3"]}
    calls = [line.split(" ") for line in (root / "calls.log").read_text().splitlines()]
    assert {name for name, *_ in calls} == {"b", "c", "d", "e"}
    for _name, card, others in calls:
        assert card in ("1", "2", "3") and card not in others.split(",")  # never two arms on one card
    assert max(len(others.split(",")) for *_, others in calls if others) == 2  # three at once
    assert json.loads((root / "a" / "machine.json").read_text())[0]["card"] == "1"  # the warm-up on an arm card
    launch = json.loads((root / "b" / "machine.json").read_text())
    assert [(r["hostname"], r["card"], r["resume"]) for r in launch] == [("gpu-host-1", "1", False)]
    assert state["arms"]["b"]["ran_on"] == "gpu-host-1 (4 x NVIDIA H100 80GB HBM3, card 1)"
    from compeer_loop.report_runs import gpu_section, judges_and_machines

    section = gpu_section(state, None)
    assert "gpu-host-1: 4 x NVIDIA H100 80GB HBM3; judge servers on card 0, arms on 1, 2, 3" in section
    assert "- arm (b): done, None steps" not in section and "ran on gpu-host-1" in section
    row_a = "| (a) | — | — | — | — | — | gpu-host-1 (4 x NVIDIA H100 80GB HBM3, card 1) |"
    assert row_a in judges_and_machines([Replicate(root, s)])


def test_the_launches_of_an_arm_on_two_machines_are_both_named(tmp_path: Path) -> None:
    record_launch(tmp_path, {"hostname": "m1", "gpus": "1 x H200"}, "0", resume=False)
    record_launch(tmp_path, {"hostname": "m1", "gpus": "1 x H200"}, "0", resume=True)
    record_launch(tmp_path, {"hostname": "m2", "gpus": "4 x H100"}, "2", resume=True)
    runs = json.loads((tmp_path / "machine.json").read_text())
    assert [r["resume"] for r in runs] == [False, True, True] and runs[0]["at"] <= time.time()
    assert where_ran(runs) == "m1 (1 x H200, card 0); m2 (4 x H100, card 2)" and where_ran([]) == "not recorded"


def test_placement_settings_may_differ_between_merged_folders_and_the_parts_name_their_machines(
        tmp_path: Path) -> None:
    from compeer_loop.merge import merge_roots
    from compeer_loop.report_runs import gpu_section
    from tests.unit.test_compeer_loop import _loop_folder

    m1 = _loop_folder(tmp_path / "m1", ["a", "b"], ["b"], "aa11", cards=["0"])
    m2 = _loop_folder(tmp_path / "m2", ["a", "c"], ["c"], "aa11", restored=True, cards=["0", "1", "2", "3"],
                      max_concurrent_arms=3)
    for root, host in ((m1, "h200-box"), (m2, "h100-box")):
        state = json.loads((root / "state.json").read_text())
        (root / "state.json").write_text(json.dumps({**state, "machine": {"hostname": host, "gpus": "x"}}))
    merge_roots([m1, m2], tmp_path / "all")
    state = json.loads((tmp_path / "all" / "state.json").read_text())
    assert [p["machine"]["hostname"] for p in state["parts"]] == ["h200-box", "h100-box"]
    assert "- m2 on h100-box (x): 100 s; trained c" in gpu_section(state, None)
