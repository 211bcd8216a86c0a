"""compeer_loop without processes: the plan's commands and shared servers, the bootstrap, the goal checks, and the
policy trainer's routing of PRM and ORM calls to separate judges."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from compeer_loop.plan import ARM_BY_NAME, LoopSettings, arm_env, grpo_argv, judge_servers, server_argv
from compeer_loop.report import conclusion, goals
from compeer_loop.stats import bootstrap, disjoint
from policy_trainer.config import load_config, parse_override
from policy_trainer.runner import ModeRoutingClient
from reward_server.types import GroupRequest, ScoreOptions


def _sets(argv: list[str]) -> dict[str, Any]:
    """The ``--set`` items as the trainer's CLI reads them."""
    return dict(parse_override(argv[i + 1]) for i, a in enumerate(argv) if a == "--set")


def test_arms_share_the_trained_judge_and_differ_only_in_judge_and_reweighting(tmp_path: Path) -> None:
    s = LoopSettings(prompts=str(tmp_path), prm_adapter="/p", orm_adapter="/o")
    servers = judge_servers(s)
    assert set(servers) == {"base", "trained", "prm", "orm"}
    assert len({j.grpc_port for j in servers.values()} | {j.http_port for j in servers.values()}) == 8
    argvs = {a: grpo_argv(ARM_BY_NAME[a], s, tmp_path, servers, resume=False) for a in "bcdef"}
    addr = {a: v[v.index("--reward-server") + 1] for a, v in argvs.items()}
    assert addr["c"] == addr["d"] == addr["e"] == servers["trained"].address != addr["b"]
    sets = {a: _sets(v) for a, v in argvs.items()}
    assert [sets[a]["redundancy_mode"] for a in "cde"] == ["paper", "sign_aware", "off"]
    assert sets["c"]["learning_rate"] == 2.0e-5 and isinstance(sets["c"]["sft_warmup_learning_rate"], float)
    assert sets["f"]["judge_mode"] == "prm_orm" and sets["f"]["orm_reward_server"] == [servers["orm"].address]
    shared = {k for k in sets["c"] if k not in ("redundancy_mode", "judge_mode")}
    for a in "bdef":  # same seed, steps, data and warm-up for every arm
        assert {k: sets[a][k] for k in shared} == {k: sets["c"][k] for k in shared}
        assert argvs[a][argvs[a].index("--max-steps") + 1] == str(s.steps)
    assert "--resume" in grpo_argv(ARM_BY_NAME["c"], s, tmp_path, servers, resume=True)
    # every arm's overrides build a valid trainer config (what `compeer-train grpo` will be given)
    cfg = load_config("cpu-smoke", {**sets["f"], "output_dir": str(tmp_path), "reward_server": [addr["f"]]})
    assert cfg.orm_reward_server == [servers["orm"].address]


def test_vllm_generation_and_judges_are_opt_in_and_reach_the_trainer_and_the_server(tmp_path: Path) -> None:
    """``generation: vllm`` gives every GRPO arm TRL's colocated vLLM (with gradient checkpointing and a
    torch.distributed port of its own); ``judge_backend: vllm`` serves the judges on vLLM with the CUDA image's line
    bound and a share of the card each. The defaults keep the transformers paths the loop's figures were made with."""
    from reward_server.cli import config_from_args, make_parser

    old = LoopSettings(prompts=str(tmp_path))
    servers = judge_servers(old)
    old_sets = _sets(grpo_argv(ARM_BY_NAME["c"], old, tmp_path, servers, resume=False))
    assert "use_vllm" not in old_sets and old_sets["gradient_checkpointing"] is False
    assert arm_env(ARM_BY_NAME["c"], old) == {}
    old_server = server_argv(servers["trained"], old)
    assert old_server[old_server.index("--backend") + 1] == "transformers" and "--static-cache" in old_server

    s = LoopSettings(prompts=str(tmp_path), generation="vllm", judge_backend="vllm", policy_vllm_memory=0.25)
    sets = {a: _sets(grpo_argv(ARM_BY_NAME[a], s, tmp_path, servers, resume=False)) for a in "bc"}
    for a in "bc":
        assert sets[a]["use_vllm"] is True and sets[a]["vllm_mode"] == "colocate"
        assert sets[a]["vllm_gpu_memory_utilization"] == 0.25 and sets[a]["gradient_checkpointing"] is True
    cfg = load_config("cpu-smoke", {**sets["c"], "output_dir": str(tmp_path), "reward_server": ["127.0.0.1:1"]})
    assert cfg.use_vllm and cfg.vllm_mode == "colocate"
    ports = {a: arm_env(ARM_BY_NAME[a], s)["MASTER_PORT"] for a in "bcdef"}
    assert len(set(ports.values())) == 5 and arm_env(ARM_BY_NAME["c"], s)["WORLD_SIZE"] == "1"
    argv = server_argv(servers["trained"], s)
    assert "--static-cache" not in argv
    served = config_from_args(make_parser().parse_args(argv[3:]))  # the server's own parser reads the flags
    assert served.engine.backend == "vllm" and served.engine.rationale_bound == "line"
    assert served.engine.vllm.gpu_memory_utilization == 0.12
    for bad, message in (({"generation": "sglang"}, "generation 'sglang'"),
                         ({"judge_backend": "openai"}, "judge_backend 'openai'"),
                         ({"policy_vllm_memory": 1.0}, "policy_vllm_memory 1.0")):
        with pytest.raises(ValueError, match=message):
            LoopSettings(prompts=str(tmp_path), **bad)


def test_settings_reject_unknown_arms_and_zero_steps() -> None:
    with pytest.raises(ValueError, match="arms"):
        LoopSettings(arms=["z"])
    with pytest.raises(ValueError, match="steps"):
        LoopSettings(steps=0)
    assert load_config("cpu-smoke", {"output_dir": "/tmp/x", "learning_rate": "2e-5"}).learning_rate == 2e-5
    with pytest.raises(ValueError, match="learning_rate: expected a number"):
        load_config("cpu-smoke", {"output_dir": "/tmp/x", "learning_rate": "fast"})
    with pytest.raises(ValueError, match="orm_reward_server"):
        load_config("cpu-smoke", {"output_dir": "/tmp/x", "orm_reward_server": ["localhost:1"]})


def test_bootstrap_intervals_cover_the_value_and_separate_distinct_groups() -> None:
    def mean(rs: Any) -> float:
        return sum(r["v"] for r in rs) / len(rs)

    high = bootstrap([{"v": 10.0 + (i % 3)} for i in range(60)], mean, n_boot=300)
    low = bootstrap([{"v": 1.0 + (i % 3)} for i in range(60)], mean, n_boot=300)
    assert high["lo"] <= high["value"] <= high["hi"]
    assert disjoint(high, low) is True and disjoint(low, high) is False
    assert bootstrap([{"v": 1.0}], mean) == {"value": 1.0, "lo": None, "hi": None, "n": 1}  # one prompt: no interval


def _fig(v: float, lo: float, hi: float) -> dict[str, Any]:
    return {"value": v, "lo": lo, "hi": hi}


def test_goals_are_stated_from_the_figures() -> None:
    figs = {p: {"figures": {"strategy_accuracy": _fig(*v), "reward_total": _fig(*v), "distinct_2": _fig(*v)}}
            for p, v in {"a": (10, 8, 12), "b": (20, 15, 25), "c": (30, 28, 32), "d": (30, 20, 40),
                         "e": (25, 24, 26)}.items()}
    out = goals(figs)
    assert out[0].startswith("(c) beats (a) on strategy accuracy: met")
    assert "met" in out[1]
    assert "distinct-2 of (c) not below (a)'s: met" in out[4]
    assert out[5].startswith("(d) beats (a) on strategy accuracy: met")
    assert out[8].startswith("(e) beats (a) on the trained judge's reward: met")
    assert ": met" in out[9] and "missed: (d) is higher by 5.00 but the 95% intervals overlap" in out[10]
    assert "(f) was not evaluated" in out[11]
    del figs["c"]
    assert all("not measured" in line for line in goals(figs)[:5])


def test_paired_intervals_decide_the_goals_and_issue_26s_goals_are_checked() -> None:
    """Overlapping per-arm intervals but a paired interval above 0: met (the paired test is the sharper one, and it
    decides); a paired interval holding 0: missed, whatever the per-arm intervals say."""
    figs = {p: {"figures": {"strategy_accuracy": _fig(*v), "reward_total": _fig(*v), "independent_win_share": _fig(*v),
                            "strategy_kappa": _fig(k, k, k), "degenerate": _fig(dg, dg, dg),
                            "reference_degenerate": _fig(4.0, 3.0, 5.0)}}
            for p, v, k, dg in (("a", (10, 5, 15), 0.05, 1.0), ("b", (11, 6, 16), 0.0, 0.5),
                                ("c", (12, 7, 17), 0.2, 3.5))}
    paired = {"c-a:strategy_correct": {"n": 585, "diff": 2.0, "lo": 0.5, "hi": 3.5, "p": 0.01},
              "c-b:reward_total": {"n": 585, "diff": 1.0, "lo": -0.2, "hi": 2.2, "p": 0.2},
              "c-a:independent_win": {"n": 585, "diff": 0.3, "lo": 0.1, "hi": 0.5, "p": 0.001}}
    out = goals(figs, paired)
    assert out[0].startswith("(c) beats (a) on strategy accuracy: met: (c) - (a) = 2.00, paired 95% interval")
    assert "intervals overlap" in goals(figs)[0]  # without the paired figures: the old, blunter rule
    assert out[3].startswith("(c) beats (b) on the trained judge's reward: missed") and "-0.20, 2.20" in out[3]
    assert "no paired figure" in out[1]  # no paired c-b strategy figure: the per-arm intervals, said so
    by_name = {line.split(":")[0]: line for line in out}
    assert by_name["(c) beats (a) on the independent scorer"].endswith("excludes 0")
    assert "missed" in by_name["(c) beats (b) on the independent scorer"]
    assert "met (0.200 vs (a) 0.050)" in by_name["strategy kappa of (c) >= 0.15 and above (a)'s"]
    assert ("missed (highest: (c) 3.5%; the rule marks 4.0% of the real supporter replies there)"
            in by_name["degenerate replies < 2% in every arm"])


def test_the_conclusion_counts_what_was_measured(tmp_path: Path) -> None:
    from compeer_loop.seeds import Replicate

    s = LoopSettings(prompts=str(tmp_path), arms=["a"])
    partial = goals({"a": {"figures": {"strategy_accuracy": _fig(10, 8, 12)}}})
    text = conclusion(partial, [Replicate(tmp_path, s)])
    assert f"0 of {len(partial)} checks are met (0 measured)." in text
    assert "Not measured in this run: (c) beats (a) on strategy accuracy" in text
    figs = {p: {"figures": {"strategy_accuracy": _fig(*v), "reward_total": _fig(*v), "distinct_2": _fig(*v)}}
            for p, v in {"a": (10, 8, 12), "b": (20, 15, 25), "c": (30, 28, 32), "d": (30, 20, 40),
                         "e": (25, 24, 26), "f": (1, 0, 2)}.items()}
    full = conclusion(goals(figs), [Replicate(tmp_path, s)])
    assert "11 of 16 checks are met (12 measured)." in full
    assert "Not measured in this run: (c) beats (a) on the independent scorer" in full


class _Recording:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    async def score_batch(self, groups: Any, timeout_s: float | None = None) -> list[Any]:
        self.calls.append(self.name)
        return []

    async def close(self) -> None:
        self.calls.append(f"close-{self.name}")


def test_prm_and_orm_calls_go_to_their_own_judges() -> None:
    calls: list[str] = []
    client = ModeRoutingClient(_Recording("prm", calls), _Recording("orm", calls))
    hist = [Turn(Role.SEEKER, "hi")]

    def group(mode: JudgeMode) -> GroupRequest:
        return GroupRequest(hist, "ref", ["x"], ScoreOptions(mode=mode))

    async def go() -> None:
        await client.score_batch([group(JudgeMode.PRM)])
        await client.score_batch([group(JudgeMode.ORM), group(JudgeMode.ORM)])
        with pytest.raises(ValueError, match="one judge mode"):
            await client.score_batch([group(JudgeMode.PRM), group(JudgeMode.ORM)])
        await client.close()

    asyncio.run(go())
    assert calls == ["prm", "orm", "close-prm", "close-orm"]


_FAKE_ARM = """
import pathlib, sys
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
with (out.parent / "calls.log").open("a") as fh:
    fh.write(out.name + (" resume" if "--resume" in argv else "") + "\\n")
if (out / "checkpoint-1").exists() and "--resume" in argv:
    (out / "final").mkdir(parents=True)
    (out / "final" / "adapter_config.json").write_text("{}")
else:
    (out / "checkpoint-1").mkdir(parents=True)
    sys.exit(3)  # killed after its first checkpoint
"""
_FAKE_WARMUP = """
import pathlib, sys
root = pathlib.Path(sys.argv[sys.argv.index("--root") + 1])
(root / "a" / "warmup" / "adapter").mkdir(parents=True)
(root / "a" / "warmup" / "adapter" / "adapter_config.json").write_text("{}")
"""


def test_the_driver_resumes_a_killed_arm_from_its_checkpoint_and_skips_finished_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes replaced by tiny scripts: the warm-up runs once, every GRPO arm starts from it, an arm that exits
    after a checkpoint is started again with --resume, and a second driver starts nothing."""
    import sys

    from compeer_loop import runner

    root = tmp_path / "loop"
    root.mkdir()
    s = LoopSettings(prompts=str(tmp_path), arms=["a", "c", "e"], eval_policies=[])
    (root / "plan.json").write_text(json.dumps(s.to_json()))
    monkeypatch.setattr(runner, "POLL_S", 0.05)
    up = {"ready": True}
    monkeypatch.setattr(runner, "ready", lambda server, timeout_s=2.0: up["ready"])
    monkeypatch.setattr(runner, "warmup_argv", lambda s, root: [sys.executable, "-c", _FAKE_WARMUP, "--root", str(root)])
    monkeypatch.setattr(runner, "verify_arm", lambda *args: {})  # the judge checks: test_compeer_loop_controls.py
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM, "--out", str(root / arm.name), *(["--resume"] if resume else [])])
    state = runner.Driver(root, s).run(evaluate=False)
    assert {k: v["status"] for k, v in state["arms"].items()} == {"a": "done", "c": "done", "e": "done"}
    assert state["restarts"] == {"c": 1, "e": 1}
    assert sorted((root / "calls.log").read_text().split("\n")) == ["", "c", "c resume", "e", "e resume"]
    assert (root / "c" / "warmup" / "adapter" / "adapter_config.json").exists()
    assert (root / "DONE").read_text() == "ok"
    up["ready"] = False  # everything is done: nothing runs again, and no server is waited for
    s.server_wait_s = 30.0
    t0 = time.monotonic()
    runner.Driver(root, s).run(evaluate=False)
    assert time.monotonic() - t0 < 10
    assert len((root / "calls.log").read_text().split()) == 6


_FAKE_ARM_PORT = """
import os, pathlib, sys
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
with (out.parent / "ports.log").open("a") as fh:
    fh.write(out.name + " " + os.environ.get("MASTER_PORT", "-") + " " + os.environ.get("WORLD_SIZE", "-") + "\\n")
(out / "final").mkdir(parents=True)
(out / "final" / "adapter_config.json").write_text("{}")
"""


def test_the_driver_gives_each_vllm_generating_arm_its_own_distributed_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``generation: vllm`` the launched arm processes get torch.distributed's one-process launch, each on a port
    of its own (two arms train at once on one card)."""
    from compeer_loop import runner

    root = tmp_path / "loop"
    root.mkdir()
    s = LoopSettings(prompts=str(tmp_path), arms=["a", "c", "e"], eval_policies=[], generation="vllm")
    (root / "plan.json").write_text(json.dumps(s.to_json()))
    monkeypatch.setattr(runner, "POLL_S", 0.05)
    monkeypatch.setattr(runner, "ready", lambda server, timeout_s=2.0: True)
    monkeypatch.setattr(runner, "warmup_argv", lambda s, root: [sys.executable, "-c", _FAKE_WARMUP, "--root", str(root)])
    monkeypatch.setattr(runner, "verify_arm", lambda *args: {})
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM_PORT, "--out", str(root / arm.name)])
    state = runner.Driver(root, s).run(evaluate=False)
    assert {k: v["status"] for k, v in state["arms"].items()} == {"a": "done", "c": "done", "e": "done"}
    ports = dict(line.split(" ", 1) for line in (root / "ports.log").read_text().splitlines())
    assert ports == {a: f"{arm_env(ARM_BY_NAME[a], s)['MASTER_PORT']} 1" for a in "ce"} and ports["c"] != ports["e"]


_FAKE_ARM_SLOW = """
import pathlib, sys, time
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
others = [p.name for p in out.parent.glob("*.running")]
(out.parent / (out.name + ".running")).write_text("")
with (out.parent / "calls.log").open("a") as fh:
    fh.write(out.name + " alongside " + ",".join(sorted(others)) + "\\n")
time.sleep(0.3)
(out.parent / (out.name + ".running")).unlink()
if out.name == "d":
    sys.exit(1)  # always crashes (as the NaN step did)
(out / "final").mkdir(parents=True)
(out / "final" / "adapter_config.json").write_text("{}")
"""


def _fake_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> tuple[Path, LoopSettings]:
    import sys

    from compeer_loop import runner

    root = tmp_path / "loop"
    root.mkdir()
    s = LoopSettings(prompts=str(tmp_path), eval_policies=[], **settings)
    (root / "plan.json").write_text(json.dumps(s.to_json()))
    monkeypatch.setattr(runner, "POLL_S", 0.05)
    monkeypatch.setattr(runner, "ready", lambda server, timeout_s=2.0: True)
    monkeypatch.setattr(runner, "warmup_argv", lambda s, root: [sys.executable, "-c", _FAKE_WARMUP, "--root", str(root)])
    monkeypatch.setattr(runner, "verify_arm", lambda *args: {})  # the judge checks: test_compeer_loop_controls.py
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM_SLOW, "--out", str(root / arm.name)])
    return root, s


def test_the_driver_runs_at_most_max_concurrent_arms_and_a_failed_arm_costs_one_try_per_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four GRPO arms at once ran out of memory on the H200: with max_concurrent_arms=1 no arm starts while another
    runs; an arm that always crashes is tried 1 + max_restarts times, and a later driver (`resume`) tries it once."""
    from compeer_loop import runner

    root, s = _fake_driver(tmp_path, monkeypatch, arms=["a", "b", "c", "d"], max_concurrent_arms=1, max_restarts=1)
    state = runner.Driver(root, s).run(evaluate=False)
    calls = (root / "calls.log").read_text().split("\n")[:-1]
    assert sorted(c.split()[0] for c in calls) == ["b", "c", "d", "d"]
    assert all(c.endswith("alongside ") for c in calls), calls  # never two arms at once
    assert {k: v["status"][:6] for k, v in state["arms"].items()} == {"a": "done", "b": "done", "c": "done",
                                                                       "d": "failed"}
    runner.Driver(root, s).run(evaluate=False)
    assert len((root / "calls.log").read_text().split("\n")[:-1]) == 5  # one more try of d, nothing else


_FAKE_ARM_OOM = """
import pathlib, sys, time
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
(out.parent / (out.name + ".running")).write_text("")
time.sleep(0.15)  # both arms of a pair have started by now
others = [p.stem for p in out.parent.glob("*.running") if p.stem != out.name]
with (out.parent / "calls.log").open("a") as fh:
    fh.write(out.name + " alongside " + ",".join(sorted(others)) + "\\n")
time.sleep(0.3)
(out.parent / (out.name + ".running")).unlink()
if out.name == "c" and others:
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 MiB.")
    sys.exit(1)
(out / "final").mkdir(parents=True)
(out / "final" / "adapter_config.json").write_text("{}")
"""


def test_an_arm_out_of_memory_beside_others_runs_again_alone_without_costing_a_try(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 arm (c) died with CUDA OOM while (b) held 73.5 GB and used up its restarts within minutes: an arm
    whose log ends in a CUDA OOM while other arms ran is queued again, runs when nothing else does, and the rest of
    the run goes one arm at a time; the restart count is untouched."""
    import sys

    from compeer_loop import runner

    root, s = _fake_driver(tmp_path, monkeypatch, arms=["a", "b", "c", "d"], max_concurrent_arms=2, max_restarts=0)
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM_OOM, "--out", str(root / arm.name)])
    state = runner.Driver(root, s).run(evaluate=False)
    calls = (root / "calls.log").read_text().split("\n")[:-1]
    assert {k: v["status"] for k, v in state["arms"].items()} == {"a": "done", "b": "done", "c": "done", "d": "done"}
    assert state["restarts"] == {}
    assert sorted(calls[:2]) == ["b alongside c", "c alongside b"], calls
    # c again, alone, and d alone (in either order: when b and c end within one poll of the driver, which of the
    # requeued c and the waiting d starts first depends on the machine's load)
    assert sorted(calls[2:]) == ["c alongside ", "d alongside "], calls


_FAKE_ARM_STEPS = """
import pathlib, sys, time
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
stepped = sorted(p.parent.name for p in out.parent.glob("*/metrics.jsonl"))
running = sorted(p.stem for p in out.parent.glob("*.running"))
(out.parent / (out.name + ".running")).write_text("")
with (out.parent / "calls.log").open("a") as fh:
    fh.write(f"{out.name} beside {','.join(running)} stepped {','.join(stepped)}\\n")
time.sleep(0.4)  # the colocated engine starting: no step yet
out.mkdir(parents=True, exist_ok=True)
(out / "metrics.jsonl").write_text('{"step": 1}\\n')
time.sleep(1.0)  # training beside the next arm
(out.parent / (out.name + ".running")).unlink()
(out / "final").mkdir(parents=True)
(out / "final" / "adapter_config.json").write_text("{}")
"""


@pytest.mark.parametrize("generation", ["vllm", "transformers"])
def test_a_vllm_arm_waits_for_the_arm_starting_on_its_card(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generation: str) -> None:
    """Two colocated vLLM engines profiling one H200 at once stopped one ("No available memory for the cache blocks",
    2026-11-30): with vLLM generation the second arm on a card starts once the first has logged a step, and still
    trains beside it; with transformers generation both start at once."""
    import sys

    from compeer_loop import runner

    root, s = _fake_driver(tmp_path, monkeypatch, arms=["a", "b", "c"], max_concurrent_arms=2, max_restarts=0,
                           generation=generation)
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM_STEPS, "--out", str(root / arm.name)])
    state = runner.Driver(root, s).run(evaluate=False)
    assert {k: v["status"] for k, v in state["arms"].items()} == {"a": "done", "b": "done", "c": "done"}
    calls = (root / "calls.log").read_text().splitlines()
    if generation == "vllm":
        assert calls == ["b beside  stepped ", "c beside b stepped b"], calls
    else:  # both at once (which process writes first is the machine's business): neither saw a step of the other
        assert sorted(c.split()[0] for c in calls) == ["b", "c"] and all(c.endswith(" stepped ") for c in calls), calls


def test_max_concurrent_arms_is_validated() -> None:
    with pytest.raises(ValueError, match="max_concurrent_arms"):
        LoopSettings(max_concurrent_arms=0)


def test_esc_settings_are_validated_and_an_older_plan_did_not_run_the_esc_step() -> None:
    with pytest.raises(ValueError, match="esc_cards"):
        LoopSettings(esc_cards=-1)
    with pytest.raises(ValueError, match="esc_rounds"):
        LoopSettings(esc_rounds=0)
    assert LoopSettings().esc_cards == 50
    old = LoopSettings().to_json()
    del old["esc_cards"], old["esc_rounds"]
    assert LoopSettings.from_json(old).esc_cards == 0
    assert LoopSettings.from_json(LoopSettings(esc_cards=7).to_json()).esc_cards == 7


def test_distinct_intervals_are_shifted_onto_the_figure() -> None:
    """Resampling repeats replies, which lowers distinct-n; the shifted interval still holds the figure."""
    from compeer_loop.stats import FIGURES

    records = [{"text": f"reply number {i} says word{i} and word{i + 1}"} for i in range(40)]
    plain = bootstrap(records, FIGURES["distinct_2"], n_boot=200)
    shifted = bootstrap(records, FIGURES["distinct_2"], n_boot=200, shift_bias=True)
    assert plain["hi"] < plain["value"]  # the bias this corrects
    assert shifted["lo"] <= shifted["value"] <= shifted["hi"]
    assert shifted["hi"] - shifted["lo"] == pytest.approx(plain["hi"] - plain["lo"])
    top = bootstrap(records, FIGURES["top_reply_share"], n_boot=200)  # 40 distinct replies: 2.5%
    assert top["lo"] > top["value"]  # a resample repeats replies: its top share is at least 5%
    from compeer_loop.stats import BIAS_SHIFTED  # the figures summarise() shifts

    shifted = bootstrap(records, FIGURES["top_reply_share"], n_boot=200, shift_bias="top_reply_share" in BIAS_SHIFTED)
    assert shifted["value"] == pytest.approx(2.5) and shifted["lo"] <= shifted["value"] <= shifted["hi"]


class _NaNGrad(torch.autograd.Function):
    """Identity forward, NaN gradient backward when the flag is set: a finite loss with NaN gradients, as the
    GRPO arms logged at step 23 on the H200."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(bad)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (bad,) = ctx.saved_tensors
        return (grad * float("nan") if bool(bad) else grad), None


class _TinyModel(torch.nn.Module):
    def __init__(self, bad_steps: set[int]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))
        self.bad_steps, self.calls = bad_steps, 0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        bad = torch.tensor(self.calls in self.bad_steps)  # the step's batch, as batch 23 was
        self.calls += 1
        return {"loss": (_NaNGrad.apply(self.w, bad) * x).sum()}


def test_a_real_trainer_skips_a_step_with_nan_gradients_and_stops_after_too_many(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """transformers' Trainer with the guard: the NaN step leaves the weights finite and untouched, later steps
    train; without the guard the same run writes NaN into the weights; N NaN steps in a row stop the run."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from judge.guards import NonFiniteGradientError, SkipNonFiniteGradients

    def train(bad_steps: set[int], guard: SkipNonFiniteGradients | None) -> tuple[_TinyModel, list[dict[str, Any]]]:
        rows = [{"x": torch.ones(2)} for _ in range(4)]
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=4,
                                 learning_rate=0.1, max_grad_norm=1.0, logging_steps=1, report_to=[],
                                 save_strategy="no", use_cpu=True, disable_tqdm=True)
        model = _TinyModel(bad_steps)
        logged: list[dict[str, Any]] = []

        class Record(TrainerCallback):  # what MetricsReport (after the guard) writes to metrics.jsonl
            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
                if "loss" in logs:
                    logged.append(dict(logs))

        trainer = Trainer(model=model, args=args, train_dataset=rows,
                          callbacks=[guard, Record()] if guard else [Record()],
                          data_collator=lambda b: {"x": torch.stack([r["x"] for r in b])})
        trainer.train()
        return model, logged

    unguarded, _ = train({1}, None)
    assert not torch.isfinite(unguarded.w).all()  # what the arms did
    guard = SkipNonFiniteGradients(max_consecutive=3)
    with caplog.at_level("WARNING", logger="judge.guards"):
        model, logs = train({1}, guard)
    assert torch.isfinite(model.w).all() and guard.skipped == 1 and guard.consecutive == 0
    assert "non-finite gradients in 1 of 1 tensors (first: w)" in caplog.text  # names where it happened
    assert [h["compeer/nonfinite_grad_steps"] for h in logs] == [0.0, 1.0, 1.0, 1.0]
    # AdamW moves w by about lr per step (linear decay 0.1, 0.075, 0.05, 0.025): the skipped step moved nothing
    assert float(model.w[0]) == pytest.approx(1.0 - 0.1 - 0.05 - 0.025, abs=1e-3)
    with pytest.raises(NonFiniteGradientError, match="2 optimizer steps in a row"):
        train({1, 2}, SkipNonFiniteGradients(max_consecutive=2))


def _loop_folder(root: Path, arms: list[str], evals: list[str], sha: str, restored: bool = False,
                 **settings: Any) -> Path:
    """A loop folder as `compeer_loop.sh` brings it back: plan, state, arms' metrics, evaluations' records."""
    s = LoopSettings(prompts="/data", arms=arms, eval_policies=evals, **settings)
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps(s.to_json()))
    (root / "state.json").write_text(json.dumps({"elapsed_s": 100.0, "warmup_sha256": sha,
                                                 "arms": {a: {"status": "done"} for a in arms}, "eval": {}}))
    (root / "prompts-manifest.json").write_text('{"counts": {"eval": 195}}')
    (root / "a" / "warmup" / "adapter").mkdir(parents=True)
    (root / "a" / "warmup" / "adapter" / "adapter_config.json").write_text("{}")
    if restored:
        (root / "a" / "RESTORED").write_text(f"{sha}  warmup.tar\n")
    for arm in arms:
        if arm != "a":
            (root / arm).mkdir()
            (root / arm / "metrics.jsonl").write_text(json.dumps({"step": 30, "arm": arm}) + "\n")
    for policy in evals:
        (root / "eval" / policy).mkdir(parents=True)
        (root / "eval" / policy / "records.jsonl").write_text(json.dumps({"policy": policy}) + "\n")
        (root / "eval" / policy / "done.json").write_text("{}")
    return root


def test_merge_joins_arms_trained_on_two_machines_and_refuses_what_is_not_comparable(tmp_path: Path) -> None:
    """A GPU machine is held 30 minutes: arms a-c trained on one, d-e on a second from the exported warm-up. The
    merged folder has every arm and evaluation from the folder that made it; folders with other settings, another
    warm-up or the same evaluation twice are refused."""
    from compeer_loop.cli import main
    from compeer_loop.merge import merge_roots

    m1 = _loop_folder(tmp_path / "m1", ["a", "b", "c"], ["base", "a", "b", "c"], "aa11")
    m2 = _loop_folder(tmp_path / "m2", ["a", "d", "e"], ["d", "e"], "aa11", restored=True)
    assert main(["merge", "--out", str(tmp_path / "all"), str(m1), str(m2)]) == 0
    merged = json.loads((tmp_path / "all" / "plan.json").read_text())
    assert merged["arms"] == ["a", "b", "c", "d", "e"] and merged["eval_policies"] == ["base", "a", "b", "c", "d", "e"]
    state = json.loads((tmp_path / "all" / "state.json").read_text())
    assert [(p["root"], p["arms"], p["eval"]) for p in state["parts"]] == [
        ("m1", ["a", "b", "c"], ["base", "a", "b", "c"]), ("m2", ["d", "e"], ["d", "e"])]
    assert state["warmup_sha256"] == "aa11" and state["elapsed_s"] == 200.0
    assert not (tmp_path / "all" / "a" / "RESTORED").exists()  # arm (a) comes from the machine that trained it
    for policy in merged["eval_policies"]:
        assert json.loads((tmp_path / "all" / "eval" / policy / "records.jsonl").read_text()) == {"policy": policy}
    assert json.loads((tmp_path / "all" / "e" / "metrics.jsonl").read_text())["arm"] == "e"
    from compeer_loop.report_runs import gpu_section

    section = gpu_section(state, None)
    assert "2 loop folders merged" in section and "- m2: 100 s; trained d, e; evaluated d, e" in section
    state["eval"] = {"d": "running", "e": "running"}  # packed before the driver saw them finish
    (tmp_path / "all" / "eval" / "e" / "done.json").unlink()
    section = gpu_section(state, None, tmp_path / "all")
    assert "- evaluation of d: done (finished after the driver last wrote its state: running there)" in section
    assert "- evaluation of e: not finished (running when the driver last wrote its state), but its records" in section
    (tmp_path / "all" / "eval" / "e" / "records.jsonl").unlink()  # cut before its records
    assert "- evaluation of e: running\n" in gpu_section(state, None, tmp_path / "all") + "\n"

    other_lr = _loop_folder(tmp_path / "lr", ["a", "d"], ["d"], "aa11", restored=True, learning_rate=1e-4)
    with pytest.raises(ValueError, match="learning_rate"):
        merge_roots([m1, other_lr], tmp_path / "x1")
    other_warmup = _loop_folder(tmp_path / "w", ["a", "d"], ["d"], "bb22", restored=True)
    with pytest.raises(ValueError, match="different warm-ups"):
        merge_roots([m1, other_warmup], tmp_path / "x2")
    twice = _loop_folder(tmp_path / "t", ["a", "d"], ["c", "d"], "aa11", restored=True)
    with pytest.raises(ValueError, match="evaluation of c is in more than one folder"):
        merge_roots([m1, twice], tmp_path / "x3")
    assert main(["merge", "--out", str(tmp_path / "all"), str(m1), str(m2)]) == 2  # never over an existing folder


def test_an_arm_cut_short_on_one_machine_is_continued_on_the_next(tmp_path: Path) -> None:
    """`compeer_loop.sh export` sends each GRPO arm's newest complete checkpoint (or its final adapter) with its
    metrics and completions; the next machine's `import` restores them (the driver then resumes the arm), and
    `compeer-loop merge` takes the arm from the folder that continued it, not from the one marked EXPORTED."""
    import subprocess

    from compeer_loop.merge import merge_roots

    script = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "compeer_loop.sh"
    m1 = _loop_folder(tmp_path / "m1", ["a", "b", "c"], ["a"], "aa11")
    (m1 / "a" / "warmup" / "adapter" / "adapter_model.safetensors").write_bytes(b"w" * 1000)
    for step, complete in ((5, True), (10, False)):  # checkpoint-10 was still being written
        ck = m1 / "c" / f"checkpoint-{step}"
        ck.mkdir()
        (ck / "adapter_model.safetensors").write_bytes(bytes([step]) * 500)
        if complete:
            (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (m1 / "c" / "completions.jsonl").write_text(json.dumps({"call": 1, "step": 1}) + "\n")
    (m1 / "b" / "final").mkdir()
    (m1 / "b" / "final" / "adapter_config.json").write_text("{}")
    env = {**os.environ, "LOOP_ROOT": str(m1), "EXPORT_DIR": str(tmp_path / "x"), "OUT": str(tmp_path / "out")}
    (tmp_path / "out").mkdir()
    done = subprocess.run(["bash", str(script), "export"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "left: done" in done.stdout, done.stdout + done.stderr
    assert (m1 / "c" / "EXPORTED").exists() and (m1 / "b" / "EXPORTED").exists()

    work = tmp_path / "work"  # the next machine's tree, with the parts carried in .gpu-import/i1
    (work / ".gpu-import" / "i1").mkdir(parents=True)
    for f in (tmp_path / "out").iterdir():
        (work / ".gpu-import" / "i1" / f.name).write_bytes(f.read_bytes())
    m2 = tmp_path / "m2"
    env = {**os.environ, "LOOP_ROOT": str(m2), "IMPORT_DIR": str(tmp_path / "i")}
    done = subprocess.run(["bash", str(script), "import"], env=env, cwd=work, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and "arm c restored" in done.stdout, done.stdout + done.stderr
    assert (m2 / "a" / "RESTORED").exists() and (m2 / "a" / "warmup" / "adapter" / "adapter_model.safetensors").exists()
    assert sorted(p.name for p in (m2 / "c").iterdir()) == ["checkpoint-5", "completions.jsonl", "metrics.jsonl"]
    assert (m2 / "c" / "checkpoint-5" / "trainer_state.json").exists() and (m2 / "b" / "final").is_dir()
    assert not (m2 / "c" / "EXPORTED").exists()

    # machine 1's results as its last `wait` packs them (the EXPORTED marks with them), brought here
    env = {**os.environ, "LOOP_ROOT": str(m1), "OUT": str(tmp_path / "out1"), "PY": sys.executable,
           "CALL_BUDGET_S": "0", "LOOP_DATA": str(tmp_path / "data")}
    (tmp_path / "out1").mkdir()
    subprocess.run(["bash", str(script), "wait"], env=env, capture_output=True, timeout=120, check=False,
                   cwd=script.parents[2])
    here = tmp_path / "m1-here"
    here.mkdir()
    subprocess.run(["tar", "-xJf", str(tmp_path / "out1" / "results.tar.xz"), "-C", str(here)], check=True)
    assert (here / "c" / "EXPORTED").exists()
    # machine 2 finished c (its plan and state as `start` writes them), then both folders are merged
    (m2 / "c" / "final").mkdir()
    (m2 / "plan.json").write_text((m1 / "plan.json").read_text())
    (m2 / "state.json").write_text(json.dumps({"elapsed_s": 50.0, "warmup_sha256": "aa11", "arms": {}, "eval": {}}))
    (m2 / "prompts-manifest.json").write_text((m1 / "prompts-manifest.json").read_text())
    merge_roots([here, m2], tmp_path / "all")
    assert (tmp_path / "all" / "c" / "final").is_dir() and (tmp_path / "all" / "b" / "final").is_dir()
    assert not (tmp_path / "all" / "c" / "EXPORTED").exists()


def test_judge_follows_reports_length_correlation_and_strategy_gap_over_valid_judged_replies() -> None:
    """The report's probe of what the reward follows: only format-valid, judged replies count; rho is Spearman's
    between words and total; totals are split by whether the named strategy is the annotated one."""
    from compeer_loop.stats import judge_follows

    def rec(words: int, total: float, strategy: str, ok: bool = True, judged: str = "ok") -> dict[str, Any]:
        return {"text": " ".join(["w"] * words), "reward_total": total, "format_ok": ok, "judge_status": judged,
                "strategy": strategy, "gold_strategy": "Question"}

    rs = [rec(5, 1.0, "Question"), rec(10, 2.0, "Other"), rec(20, 3.0, "Question"), rec(40, 4.0, "Other"),
          rec(80, -5.0, "Question", ok=False), rec(3, 9.0, "Question", judged="failed")]
    f = judge_follows(rs)
    assert f["n"] == 4 and f["rho_length_total"] == pytest.approx(1.0)
    assert (f["total_strategy_right"], f["n_right"], f["total_strategy_wrong"], f["n_wrong"]) == (2.0, 2, 3.0, 2)
    assert judge_follows(rs[:2])["rho_length_total"] is None  # too few to rank
    flat = judge_follows([rec(5, 1.0, "Question"), rec(10, 1.0, "Other"), rec(20, 1.0, "Other")])
    assert flat["rho_length_total"] is None  # a constant total has no rank correlation: not made up


def test_the_esc_section_names_dimensions_the_scorer_gave_one_score_everywhere(tmp_path: Path) -> None:
    """Machine 3's scorer (base SmolLM2) gave 4.00 on Fluency, Empathy and Overall to every dialogue: the loop's
    report names those dimensions under the table rather than leaving their means to speak."""
    from compeer_loop.report import esc_section
    from compeer_loop.seeds import Replicate

    s = LoopSettings(prompts="/data", arms=["a"], eval_policies=["base", "a"])
    dims = {"Fluency": (4.0, 1.0), "Empathy": (4.0, 1.0), "Skill": (3.86, 0.86)}
    for policy in s.eval_policies:
        (tmp_path / "eval" / policy).mkdir(parents=True)
        (tmp_path / "eval" / policy / "esc.json").write_text(json.dumps({
            "dialogues": 50, "statuses": {"ok": 50}, "unparsed_total": 0, "average_percent": 95.0, "cer": None,
            "rounds": 5, "roles": {"simulator": "sim", "scorer": "scorer"},
            "dimensions": {d: {"mean": m, "n": 50, "unparsed": 0, "modal_share": share}
                           for d, (m, share) in dims.items()}}))
    text = esc_section([Replicate(tmp_path, s)])
    notes = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(notes) == 2 and all("at least 90% of the dialogues on Fluency, Empathy;" in n for n in notes)
    assert notes[0].startswith("- base (no training): ") and not any("Skill" in n for n in notes)


def test_the_evaluation_loads_a_named_policy_base_from_the_model_store(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`--policy-model qwen2.5-coder-1.5b` trains through the model store (resolve_model); the evaluation merges each
    arm's LoRA into the same folder, not into a path called "qwen2.5-coder-1.5b". A folder is taken as given."""
    from compeer_loop import evaluate
    from judge.model_store import ModelRef

    asked: list[str] = []

    def fake_resolve(spec: str, dtype: str = "float32") -> ModelRef:
        asked.append(spec)
        return ModelRef(str(tmp_path / f"models/{spec}-{dtype}"), spec, "rev")

    monkeypatch.setattr(evaluate, "resolve_model", fake_resolve)
    for name in ("default", "qwen2.5-coder-1.5b"):
        s = LoopSettings(prompts=str(tmp_path), policy_model=name, device="cpu")
        assert evaluate._base_path(s) == str(tmp_path / f"models/{name}-float32")
    folder = LoopSettings(prompts=str(tmp_path), policy_model=str(tmp_path / "my-policy"), device="cpu")
    assert evaluate._base_path(folder) == str(tmp_path / "my-policy")
    assert asked == ["default", "qwen2.5-coder-1.5b"]


_FAKE_ARM_CARD = """
import os, pathlib, sys, time
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--out") + 1])
log = pathlib.Path(argv[argv.index("--log") + 1])
me = out.parent.name + "/" + out.name
(log / (out.parent.name + "-" + out.name + ".running")).write_text("")
time.sleep(0.3)
others = sorted(p.stem.replace("-", "/") for p in log.glob("*.running") if p.stem.replace("-", "/") != me)
with (log / "calls.log").open("a") as fh:
    fh.write(me + " card " + os.environ.get("CUDA_VISIBLE_DEVICES", "-") + " port " + os.environ.get("MASTER_PORT", "-")
             + " alongside " + ",".join(others) + "\\n")
time.sleep(0.3)
(log / (out.parent.name + "-" + out.name + ".running")).unlink()
(out / "final").mkdir(parents=True)
(out / "final" / "adapter_config.json").write_text("{}")
"""


def _replicate_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any
                       ) -> tuple[list[Path], list[LoopSettings], list[tuple[str, set[str]]], list[Path]]:
    """Two loop folders (seeds 0 and 1) with stand-in processes (``_FAKE_ARM_CARD`` logs each arm's card, port and
    the arms beside it to ``tmp_path/calls.log``); returns the roots, plans, and the servers started and stopped."""
    import sys

    from compeer_loop import replicates, runner

    roots, plans = [], []
    for seed in (0, 1):
        root = tmp_path / f"seed{seed}"
        root.mkdir()
        s = LoopSettings(prompts=str(tmp_path), arms=["a", "b", "c"], eval_policies=[], seed=seed, **settings)
        (root / "plan.json").write_text(json.dumps(s.to_json()))
        roots.append(root)
        plans.append(s)
    started: list[tuple[str, set[str]]] = []
    stopped: list[Path] = []
    monkeypatch.setattr(runner, "POLL_S", 0.05)
    monkeypatch.setattr(runner.Driver, "start_servers", lambda self, names: started.append((self.root.name, names)))
    monkeypatch.setattr(replicates, "stop_servers", lambda root: stopped.append(root))
    monkeypatch.setattr(runner, "ready", lambda server, timeout_s=2.0: True)
    monkeypatch.setattr(runner, "warmup_argv", lambda s, root: [sys.executable, "-c", _FAKE_WARMUP, "--root", str(root)])
    monkeypatch.setattr(runner, "verify_arm", lambda *args: {})
    monkeypatch.setattr(runner, "grpo_argv", lambda arm, s, root, servers, resume: [
        sys.executable, "-c", _FAKE_ARM_CARD, "--out", str(root / arm.name), "--log", str(tmp_path)])
    return roots, plans, started, stopped


def _calls(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """``_FAKE_ARM_CARD``'s log: per arm (``seed0/b``) its card, port and the arms that ran beside it."""
    out = {}
    for line in (tmp_path / "calls.log").read_text().splitlines():
        f = line.split(" alongside ")
        me, _, card, _, port = f[0].split()
        out[me] = {"card": card, "port": port, "beside": [b for b in f[1].split(",") if b] if len(f) > 1 else []}
    return out


def test_seed_replicates_share_one_set_of_judge_servers_and_train_one_folder_after_the_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``compeer-loop run --root R0 --root R1`` on one arm card: the servers are started once (by the first folder)
    and stopped once, each folder trains its own warm-up (its plan's seed) and arms, never beside the other folder's
    arms, and each gets its DONE; folders whose judge-server settings differ are refused before anything starts."""
    from compeer_loop import replicates, runner

    roots, plans, started, stopped = _replicate_folders(tmp_path, monkeypatch, max_concurrent_arms=2)
    states = replicates.run_replicates([runner.Driver(r, s) for r, s in zip(roots, plans)], evaluate=False)
    assert started == [("seed0", {"base", "trained"})] and stopped == [roots[0]]
    assert [{k: v["status"] for k, v in st["arms"].items()} for st in states] == [
        {"a": "done", "b": "done", "c": "done"}] * 2
    assert all((r / "DONE").read_text() == "ok" and (r / "a" / "warmup" / "adapter").is_dir() for r in roots)
    calls = _calls(tmp_path)
    assert sorted(calls) == ["seed0/b", "seed0/c", "seed1/b", "seed1/c"]
    for me, c in calls.items():  # b and c of one folder train together (max_concurrent_arms 2), never with the other's
        assert all(b.split("/")[0] == me.split("/")[0] for b in c["beside"]), (me, c)
    assert any(c["beside"] for c in calls.values())
    other = LoopSettings(prompts=str(tmp_path), arms=["a", "c"], eval_policies=[], seed=2, base_port=50071)
    with pytest.raises(ValueError, match="base_port"):
        replicates.run_replicates([runner.Driver(roots[0], plans[0]), runner.Driver(roots[1], other)])


def test_seed_replicates_train_side_by_side_on_their_own_arm_cards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several arm cards (judges on card 0, arms on 1 and 2) two folders train at once, each on an arm card of its
    own, their vLLM arms on distinct torch.distributed ports; a lane that fails stops the run with its error."""
    from compeer_loop import replicates, runner

    roots, plans, _, _ = _replicate_folders(tmp_path, monkeypatch, cards=["0", "1", "2"], generation="vllm")
    states = replicates.run_replicates([runner.Driver(r, s) for r, s in zip(roots, plans)], evaluate=False)
    assert [{k: v["status"] for k, v in st["arms"].items()} for st in states] == [
        {"a": "done", "b": "done", "c": "done"}] * 2
    calls = _calls(tmp_path)
    assert {k: c["card"] for k, c in calls.items()} == {"seed0/b": "1", "seed0/c": "1", "seed1/b": "2", "seed1/c": "2"}
    assert len({c["port"] for c in calls.values()}) == 4  # four distinct ports
    assert any(b.startswith("seed1/") for k, c in calls.items() if k.startswith("seed0/") for b in c["beside"])
    assert [st["placement"]["arm_cards"] for st in states] == [["1"], ["2"]]

    def broken(self: Any) -> None:
        raise RuntimeError("lane broke")
    monkeypatch.setattr(runner.Driver, "run_arms", broken)
    with pytest.raises(RuntimeError, match="lane broke"):
        replicates.run_replicates([runner.Driver(r, s) for r, s in zip(roots, plans)], evaluate=False)


def test_two_cards_can_train_a_second_seed_beside_the_judges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a two-card machine `--cards 0 1 0` names card 0 (the judges' and evaluations' card) as an arm card too: the
    first folder trains on card 1, the second beside the judges on card 0, side by side; the second folder's own
    `max_concurrent_arms` 1 (SEED_ARGS_K in tools/gpu/compeer_loop.sh) keeps its arms one at a time there."""
    from dataclasses import replace

    from compeer_loop import replicates, runner

    roots, plans, _, _ = _replicate_folders(tmp_path, monkeypatch, cards=["0", "1", "0"], generation="vllm",
                                            max_concurrent_arms=2)
    plans[1] = replace(plans[1], max_concurrent_arms=1)
    states = replicates.run_replicates([runner.Driver(r, s) for r, s in zip(roots, plans)], evaluate=False)
    assert [st["placement"]["arm_cards"] for st in states] == [["1"], ["0"]]
    calls = _calls(tmp_path)
    assert {k: c["card"] for k, c in calls.items()} == {"seed0/b": "1", "seed0/c": "1", "seed1/b": "0", "seed1/c": "0"}
    assert not any(b.startswith("seed1/") for b in calls["seed1/b"]["beside"] + calls["seed1/c"]["beside"])
    assert any(b.startswith("seed1/") for k, c in calls.items() if k.startswith("seed0/") for b in c["beside"])


def test_a_card_whose_lane_has_finished_takes_another_lanes_waiting_arm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the lane of card 1 has nothing left to train, the lane of card 0 (one arm at a time there) starts its
    waiting arm on card 1 instead of queueing it; a card with an unfinished lane is never lent."""
    from dataclasses import replace

    from compeer_loop import replicates, runner
    from compeer_loop.placement import SpareCards

    roots, plans, _, _ = _replicate_folders(tmp_path, monkeypatch, cards=["0", "1", "0"], generation="vllm",
                                            max_concurrent_arms=1)
    plans[0] = replace(plans[0], arms=["a"])
    states = replicates.run_replicates([runner.Driver(r, s) for r, s in zip(roots, plans)], evaluate=False)
    assert [{k: v["status"] for k, v in st["arms"].items()} for st in states] == [
        {"a": "done"}, {"a": "done", "b": "done", "c": "done"}]
    calls = _calls(tmp_path)
    assert {k: c["card"] for k, c in calls.items()} == {"seed1/b": "0", "seed1/c": "1"}
    assert calls["seed1/b"]["beside"] == ["seed1/c"] or calls["seed1/c"]["beside"] == ["seed1/b"]
    spare = SpareCards(["1", "1", "0"])
    spare.lane_done("1")
    assert spare.take() is None  # card 1's other lane still trains
    spare.lane_done("1")
    assert spare.take() == "1" and spare.take() is None
    spare.give_back("1")
    assert spare.take() == "1"


def test_the_gpu_script_packs_every_seed_folder_of_a_seeds_run(tmp_path: Path) -> None:
    """`compeer_loop.sh` with SEEDS keeps one loop folder per seed ($L/seedK, listed in roots.txt): `wait` reports
    every folder's status and packs each folder's results under seedK/ in the one results.tar.xz."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "compeer_loop.sh"
    top = tmp_path / "loop"
    for seed, evals in ((0, ["base", "a", "c"]), (1, ["a", "c"])):
        r = _loop_folder(top / f"seed{seed}", ["a", "c"], evals, f"sha{seed}", seed=seed)
        (r / "DONE").write_text("ok")
    (top / "roots.txt").write_text(f"{top / 'seed0'}\n{top / 'seed1'}\n")
    env = {**os.environ, "LOOP_ROOT": str(top), "OUT": str(tmp_path / "out"), "PY": sys.executable,
           "CALL_BUDGET_S": "0", "LOOP_DATA": str(tmp_path / "data")}
    (tmp_path / "out").mkdir()
    done = subprocess.run(["bash", str(script), "wait"], env=env, capture_output=True, text=True, timeout=120,
                          check=False, cwd=script.parents[2])
    assert done.stdout.count("DONE: ok") == 2, done.stdout + done.stderr
    listed = subprocess.run(["tar", "-tJf", str(tmp_path / "out" / "results.tar.xz")], capture_output=True, text=True,
                            check=True).stdout.split()
    for seed in (0, 1):
        assert {f"seed{seed}/plan.json", f"seed{seed}/DONE", f"seed{seed}/c/metrics.jsonl",
                f"seed{seed}/eval/a/records.jsonl"} <= set(listed), listed
    assert "seed0/eval/base/records.jsonl" in listed and "seed1/eval/base/records.jsonl" not in listed
    status = (tmp_path / "out" / "status.txt").read_text()
    assert "== seed0/" in status and "== seed1/" in status


def test_status_says_how_far_a_running_evaluation_got(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`compeer-loop status` reads a running evaluation's files: prompts answered, replies judged, records written,
    ESC-Eval-style dialogues done; a finished or waiting one is shown as before."""
    from compeer_loop.cli import main

    (tmp_path / "state.json").write_text(json.dumps({"elapsed_s": 5, "servers": {}, "arms": {},
                                                     "eval": {"a": "done", "c": "running", "e": "running"}}))
    c = tmp_path / "eval" / "c"
    (c / "gold").mkdir(parents=True)
    (c / "gold" / "items.jsonl").write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    (c / "scored.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    (c / "records.jsonl").write_text("")
    (c / "esc").mkdir()
    (c / "esc" / "items.jsonl").write_text('{"id": 1}\n')
    assert main(["status", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  eval a: done\n" in out
    assert "  eval c: running (answered 3, judged 2, records written, ESC dialogues 1)\n" in out
    assert "  eval e: running (answered 0, judged 0)\n" in out
