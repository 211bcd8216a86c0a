"""Verdict temperature (:mod:`judge.calibration`): tempering, fitting, where a judge's temperature comes from, the
judge applying it (and keying its cache on it), ``Info`` on both fronts, and ``compeer-train judge-calibrate`` on
predictions and contrast judgments. The engine is the FAKE one (tests/fake_engine.py) with fake logprobs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Kind
from judge.calibration import (
    VerdictTemperature,
    calibration_metrics,
    fit_temperature,
    read_temperature,
    resolve_temperature,
    temper,
)
from judge.conversation import Judge, judgment_rewards
from judge.engines.base import EngineConfig
from judge.protocol import JudgeSettings, load_template
from reward_server.grpc import convert
from reward_server.http.convert import group_from_json
from reward_trainer.calibrate import TEMPERED, calibrate, rescore_contrast
from reward_trainer.cli import main as train_main
from tests.fake_engine import FakeEngine, verdict_logprobs
from tests.unit.fakes import scripted_judge
from tests.unit.test_reward_service import GOOD, body, make_service

compeer_proto = pytest.importorskip("compeer_proto.reward.v1.reward_pb2")


def test_temper_keeps_the_order_and_spreads_the_probabilities() -> None:
    d = {"True": 1 - 1e-6, "False": 1e-6}
    assert temper(d, 1.0) == d  # exactly: T 1 leaves the engine's probabilities untouched
    hot = temper(d, 10.0)
    assert hot["True"] > hot["False"] > 1e-3 and sum(hot.values()) == pytest.approx(1.0)
    # log-odds divided by T: 13.8 / 10 = 1.38
    assert math.log(hot["True"] / hot["False"]) == pytest.approx(math.log((1 - 1e-6) / 1e-6) / 10)
    assert temper({"True": 1.0, "False": 0.0}, 10.0) == {"True": 1.0, "False": 0.0}  # 0 stays 0
    pref = temper({"first": 0.9, "second": 0.09, "both_good": 0.009, "neither": 0.001}, 3.0)
    assert sorted(pref, key=pref.__getitem__) == ["neither", "both_good", "second", "first"]


def test_the_fit_recovers_the_judges_accuracy_from_saturated_probabilities() -> None:
    """A judge 75% right but always 1 - 1e-6 sure: the fitted T makes its confidence its accuracy."""
    sure = {"True": 1 - 1e-6, "False": 1e-6}
    samples = [(sure, "True")] * 75 + [(sure, "False")] * 25
    t = fit_temperature(samples)
    assert t > 5 and temper(sure, t)["True"] == pytest.approx(0.75, abs=0.01)
    raw, fitted = calibration_metrics(samples), calibration_metrics(samples, t)
    assert fitted["nll"] < raw["nll"] and fitted["accuracy"] == raw["accuracy"] == 0.75
    assert fitted["ece"] == pytest.approx(0.0, abs=0.01) and raw["ece"] == pytest.approx(0.25, abs=1e-4)
    with pytest.raises(ValueError, match="no samples"):
        fit_temperature([])


def test_where_a_judges_temperature_comes_from(tmp_path: Path) -> None:
    assert resolve_temperature(None, None) == VerdictTemperature(1.0, 1.0, "none")
    (tmp_path / "compeer_judge.json").write_text(json.dumps({"variant": "unified"}))
    assert read_temperature(tmp_path) is None and resolve_temperature(None, tmp_path).source == "none"
    (tmp_path / "compeer_judge.json").write_text(json.dumps({"verdict_temperature": {"step": 4.0, "preference": 2.5}}))
    assert resolve_temperature(None, tmp_path) == VerdictTemperature(4.0, 2.5, "adapter")
    assert resolve_temperature(1.0, tmp_path) == VerdictTemperature(1.0, 1.0, "setting")  # the setting wins
    (tmp_path / "compeer_judge.json").write_text(json.dumps({"verdict_temperature": {"step": -1, "preference": 2}}))
    with pytest.raises(ValueError, match="compeer_judge.json: verdict_temperature"):
        read_temperature(tmp_path)
    with pytest.raises(ValueError, match="verdict_temperature 0.0: expected a positive number"):
        JudgeSettings(verdict_temperature=0.0)


async def test_the_judge_tempers_the_probabilities_and_keys_its_cache_on_the_temperature(tmp_path: Path) -> None:
    (tmp_path / "compeer_judge.json").write_text(json.dumps({"verdict_temperature": {"step": 2.0, "preference": 1.0}}))

    def judge(adapter_dir: Path | None, **settings: Any) -> Judge:
        engine = FakeEngine(scripted_judge(), logprobs=verdict_logprobs(0.8),
                            config=EngineConfig(backend="fake", model_id="fake", adapter_dir=adapter_dir and
                                                str(adapter_dir)))
        return Judge(engine, load_template(), load_taxonomy(), JudgeSettings(**settings))

    history = group_from_json(body([GOOD])).history
    raw, calibrated, forced = judge(None), judge(tmp_path), judge(tmp_path, verdict_temperature=1.0)
    assert calibrated.temperature == VerdictTemperature(2.0, 1.0, "adapter")
    judgments = []
    for j in (raw, calibrated):
        await j.engine.start()
        judgments.append(await j.judge(history, "That must be frustrating.", parse(GOOD), JudgeMode.UNIFIED))
    p = 1 / (1 + math.sqrt(0.2 / 0.8))  # log-odds of 0.8 halved
    assert judgments[0].p_true("step1") == pytest.approx(0.8) and judgments[1].p_true("step1") == pytest.approx(p)
    assert judgments[1].probs["preference"] == pytest.approx(judgments[0].probs["preference"])  # T 1: untouched
    d0, g0 = judgment_rewards(judgments[0], parse(GOOD), JudgeMode.UNIFIED)
    d1, g1 = judgment_rewards(judgments[1], parse(GOOD), JudgeMode.UNIFIED)
    assert d0 == d1 and g1.total is not None and g0.total is not None and g1.total < g0.total
    keys = [j.judgment_key(history, "That must be frustrating.", parse(GOOD), JudgeMode.UNIFIED)
            for j in (raw, calibrated, forced)]
    assert keys[0] == keys[2] != keys[1]  # T 1 keeps the keys an uncalibrated judge always had


async def test_info_reports_the_verdict_temperature_on_both_fronts() -> None:
    async def both(s: Any) -> tuple[Any, Any]:
        http = (await s.http.get("/v1/info")).json()["verdict_temperature"]
        info = convert.info_from_pb(await s.stub.Info(compeer_proto.InfoRequest()))
        return http, info.verdict_temperature

    async for s in make_service(logprobs=verdict_logprobs(), verdict_temperature=3.0):
        http, grpc_t = await both(s)
        assert http == {"step": 3.0, "preference": 3.0, "source": "setting"}
        assert grpc_t == VerdictTemperature(3.0, 3.0, "setting")
    async for s in make_service(logprobs=verdict_logprobs()):
        assert (await both(s))[0] == {"step": 1.0, "preference": 1.0, "source": "none"}
    async for s in make_service():  # not graded: no temperature
        assert await both(s) == (None, None)


def _predictions(folder: Path, temperature: float | None = 1.0) -> Path:
    """A judge-eval output: 40 dialogues, step verdicts 75% right at 1 - 1e-6, preference 60% right at 0.999."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"meta": {"settings": {"verdict_temperature": temperature}}}))
    sure = {"True": 1 - 1e-6, "False": 1e-6}
    pref = {"first": 0.999, "second": 0.0005, "both_good": 0.0003, "neither": 0.0002}
    rows = []
    for i in range(40):
        for j in range(4):
            n = 4 * i + j
            rows.append({"judge": "trained", "variant": "unified", "key": f"esconv-{i}:{j}",
                         "verdicts": {"step1": "True", "preference": "first"},
                         "gold": {"step1": "True" if n % 4 else "False", "preference": "first" if n % 5 < 3 else
                                  "second"},
                         "probs": {"step1": sure, "preference": pref}})
    rows.append({"judge": "trained", "variant": "unified", "key": "esconv-x:0", "verdicts": {"step1": None},
                 "gold": {"step1": "True"}, "probs": {"step1": None}})
    path = folder / "predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_calibrate_cross_fits_by_dialogue_and_writes_the_adapter(tmp_path: Path, capsys: Any) -> None:
    preds = _predictions(tmp_path / "eval")
    result = calibrate(preds, folds=2)
    step, pref = result["kinds"][Kind.STEP.value], result["kinds"][Kind.PREFERENCE.value]
    assert result["missing_probabilities"] == 1 and step["n"] == 160 and step["dialogues"] == 40
    assert step["temperature"] > 5 and pref["temperature"] > 1
    assert step["cross_fitted"]["nll"] < step["raw"]["nll"] and step["cross_fitted"]["n"] == 160
    assert step["cross_fitted"]["accuracy"] == step["raw"]["accuracy"] == 0.75
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "compeer_judge.json").write_text(json.dumps({"variant": "unified"}))
    assert train_main(["judge-calibrate", "--predictions", str(preds), "--out", str(tmp_path / "cal"),
                       "--write-adapter", str(adapter)]) == 0
    written = read_temperature(adapter)
    assert written is not None and written.step == pytest.approx(step["temperature"], rel=1e-3)
    assert json.loads((adapter / "compeer_judge.json").read_text())["variant"] == "unified"  # the rest is kept
    assert "| step | 160 (40) |" in (tmp_path / "cal" / "calibration.md").read_text()
    # one dialogue: a fold without items is not cross-fitted (n/a), never a crash
    one = tmp_path / "one" / "predictions.jsonl"
    _predictions(one.parent)
    rows = [json.loads(ln) for ln in one.read_text().splitlines()]
    one.write_text("".join(json.dumps({**r, "key": f"esconv-0:{n}"}) + "\n" for n, r in enumerate(rows)))
    assert train_main(["judge-calibrate", "--predictions", str(one), "--out", str(tmp_path / "c1")]) == 0
    assert "n/a | n/a | n/a" in (tmp_path / "c1" / "calibration.md").read_text()
    # probabilities that were already tempered cannot be fitted on: a clear error, exit 2
    assert train_main(["judge-calibrate", "--predictions", str(_predictions(tmp_path / "t", None)),
                       "--out", str(tmp_path / "x")]) == 2
    assert "re-run it with --verdict-temperature 1" in capsys.readouterr().err
    (tmp_path / "t" / "metrics.json").unlink()  # which temperature it was made with is unknown: refused too
    assert train_main(["judge-calibrate", "--predictions", str(tmp_path / "t" / "predictions.jsonl"),
                       "--out", str(tmp_path / "x")]) == 2
    assert "metrics.json: not found" in capsys.readouterr().err


def test_rescoring_a_contrast_run_under_a_temperature() -> None:
    """The discrete and raw graded totals are recomputed as the run computed them; the tempered totals spread the
    judge's confidence, so a candidate it is less sure about falls behind the one it is sure about."""
    groups = [{"candidates": {"positive": GOOD, "generic": GOOD}, "references": {"gold": "ref"}}]
    step = {"True": 1 - 1e-6, "False": 1e-6}
    unsure = {"True": 1 - 1e-3, "False": 1e-3}
    pref = {"first": 1e-6, "second": 1 - 3e-6, "both_good": 1e-6, "neither": 1e-6}

    def record(s: dict[str, float]) -> dict[str, Any]:
        return {"verdicts": {"step1": "True", "step2": "True", "step3": "True", "preference": "second"},
                "probs": {"step1": s, "step2": s, "step3": s, "preference": pref}}

    contrast = {"meta": {"n_groups": 1, "settings": {"verdict_temperature": 1.0}},
                "judgments": {"shipped": {"gold": [{"positive": record(step), "generic": record(unsure)}]}}}
    out = rescore_contrast(contrast, groups, VerdictTemperature(10.0, 10.0))["shipped"]["gold"]
    assert out["discrete"]["generic"]["within_group"]["tie"] == 1.0
    assert out["graded"]["generic"]["within_group"]["win"] == 1.0  # the raw tie-break, by 3e-3
    assert out[TEMPERED]["generic"]["within_group"]["win"] == 1.0
    assert out[TEMPERED]["positive_mean_total"] - out[TEMPERED]["generic"]["negative_mean_total"] > 0.3
    with pytest.raises(ValueError, match="kept no judgments"):
        rescore_contrast({"meta": contrast["meta"]}, groups, VerdictTemperature())
    with pytest.raises(ValueError, match="2 groups"):
        rescore_contrast({**contrast, "judgments": {"shipped": {"gold": [{}, {}]}}}, groups, VerdictTemperature())
