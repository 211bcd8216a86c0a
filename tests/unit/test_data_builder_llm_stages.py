"""LLM stages (filter, generate, persona) on reward_server's FakeEngine: parsing, retries, failures, cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cer.reasoning import parse
from data_builder.cli import main
from data_builder.llm import LLM, LLMSettings
from data_builder.llm_filter import parse_label
from data_builder.persona import artifacts, elbow, parse_disc
from data_builder.records import read_jsonl
from judge.engines.base import GenParams, Message
from tests.fake_engine import FakeEngine

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"
GOOD_CER = ("<analysis>job loss worry; exploration</analysis><emotion>negative, anxiety, 4</emotion>"
            "<strategy>Question: learn more first</strategy><response>What worries you most?</response>")


def _ingest(tmp: Path) -> Path:
    assert main(["ingest", "--quiet", "--format", "esconv", "--out", str(tmp / "ing"), str(FIX / "esconv.json")]) == 0
    return tmp / "ing" / "dialogues.jsonl"


def _factory(engine: FakeEngine, cache: Path) -> Any:
    def make(settings: LLMSettings) -> LLM:
        return LLM(LLMSettings(**{**settings.__dict__, "cache_dir": cache}), engine=engine)
    return make


def responder(messages: list[Message], params: GenParams) -> str:
    system = messages[0]["content"]
    user = messages[-1]["content"]
    if system.startswith("You check"):
        # drops the anger dialogue as machine-like, answers garbage for the breakup one, keeps the rest
        if "group chat" in user:
            return "Rationale: boilerplate.\nLabel: machine style"
        if "six years" in user:
            return "I cannot tell."
        return "Rationale: natural.\nLabel: clean"
    if system.startswith("You are an emotional-support assistant"):
        return "no tags at all" if "考研" in user or params.temperature == 0 and "inbox" in user else GOOD_CER
    if system.startswith("You describe"):
        level = "high" if "annoyed" in user or "压力" in user else "low"
        return f"Dominance: {level}\nInfluence: medium\nSteadiness: {level}\nCompliance: high\nSummary: talks plainly."
    if system.startswith("You rewrite"):
        return f'"{user}"'  # quotes are stripped; meaning kept exactly
    raise AssertionError("unexpected prompt")


def test_parsers() -> None:
    assert parse_label("Rationale: x\nLabel: clean\n") == "clean"
    assert parse_label("Label: clean\nLabel: Non-dialogue.") == "non_dialogue"
    assert parse_label("Label: whatever") is None
    d = parse_disc("Dominance: High\n**Influence**: moderate\nSteadiness: 低\nCompliance: low\nSummary: calm")
    assert d == {"Dominance": "high", "Influence": "medium", "Steadiness": "low", "Compliance": "low", "summary": "calm"}
    assert parse_disc("Dominance: high\nInfluence: medium") is None
    assert elbow([1, 2, 3, 4, 5, 6], [100, 40, 20, 17, 15, 14]) == 3
    assert elbow([2, 3], [5, 4]) == 2
    assert artifacts("I feel sad", "Here is the rewritten message: I feel down", (0.3, 3.0))
    assert artifacts("I feel sad", "Seeker: I feel down", (0.3, 3.0))
    assert artifacts("我很难过", "以下是改写：我很伤心", (0.3, 3.0))
    assert artifacts("I feel sad today", "I feel low today", (0.3, 3.0)) == []


def test_filter_keeps_drops_and_records_failures(tmp_path: Path) -> None:
    dl = _ingest(tmp_path)
    eng = FakeEngine(responder)
    out = tmp_path / "filt"
    args = ["filter", "--quiet", "--out", str(out), "--max-retries", "1", str(dl)]
    assert main(args, llm_factory=_factory(eng, tmp_path / "cache")) == 0
    decisions = {d["id"]: d for d in read_jsonl(out / "decisions.jsonl")}
    assert sorted(d["reason"] for d in decisions.values()) == ["clean", "clean", "clean", "judge_failed", "machine_style"]
    failed = next(d for d in decisions.values() if d["status"] == "failed")
    assert failed["attempts"] == 2 and failed["decision"] is None
    m = json.loads((out / "manifest.json").read_text())["counts"]
    assert m["kept"] == 4 and m["dropped"] == 1 and m["share_removed"] == pytest.approx(0.2)
    assert m["llm"]["generations"] == 6 and m["llm"]["failed"] == 1
    # a re-run is served from the disk cache: no generation at all
    eng2 = FakeEngine(responder)
    assert main(args, llm_factory=_factory(eng2, tmp_path / "cache")) == 0
    assert eng2.calls == []
    assert json.loads((out / "manifest.json").read_text())["counts"]["llm"]["cache_hits"] == 6
    # --on-failure drop
    out2 = tmp_path / "filt2"
    assert main(["filter", "--quiet", "--on-failure", "drop", "--max-retries", "1", "--out", str(out2), str(dl)],
                llm_factory=_factory(FakeEngine(responder), tmp_path / "cache")) == 0
    assert json.loads((out2 / "manifest.json").read_text())["counts"]["kept"] == 3


def test_generate_retries_then_records_failure(tmp_path: Path) -> None:
    dl = _ingest(tmp_path)
    assert main(["sample", "--quiet", "--rounds", "2", "--out", str(tmp_path / "s"), str(dl)]) == 0
    eng = FakeEngine(responder)
    out = tmp_path / "gen"
    assert main(["generate", "--quiet", "--max-retries", "2", "--out", str(out), str(tmp_path / "s" / "rounds.jsonl")],
                llm_factory=_factory(eng, tmp_path / "cache")) == 0
    ok = list(read_jsonl(out / "generations.jsonl"))
    failed = list(read_jsonl(out / "failed.jsonl"))
    assert ok and failed
    assert all(parse(g["candidate"]).ok and g["strategy_named"] == "Question" for g in ok)
    assert all(g["candidate"] is None and g["attempts"] == 3 and g["error"] == "invalid_format" for g in failed)
    # the retried rounds whose first answer was bad succeeded on a retry (temperature raised)
    assert any(g["attempts"] > 1 for g in ok)
    # the prompt is exactly the policy's
    from cer.policy_prompt import system_prompt
    assert eng.calls[0].messages[0]["content"] == system_prompt()
    m = json.loads((out / "manifest.json").read_text())["counts"]
    exam = [r for r in read_jsonl(tmp_path / "s" / "rounds.jsonl") if any("考研" in t["text"] for t in r["history"])]
    assert m["generated"] == len(ok) and m["failed"] == len(failed) == len(exam)  # the exam rounds always fail


def test_persona_clusters_rewrites_and_filters_drift(tmp_path: Path) -> None:
    dl = _ingest(tmp_path)
    out = tmp_path / "persona"
    assert main(["persona", "--quiet", "--out", str(out), "--k-min", "1", "--k-max", "4", str(dl)],
                llm_factory=_factory(FakeEngine(responder), tmp_path / "cache")) == 0
    m = json.loads((out / "manifest.json").read_text())["counts"]
    assert m["disc_ok"] == 5 and m["clusters"] >= 1 and (out / "sse.png").stat().st_size > 1000
    clusters = json.loads((out / "clusters.json").read_text())
    assert clusters["ks"] == [1, 2] and len(clusters["sse"]) == 2  # two distinct profiles: k <= 2
    kept = list(read_jsonl(out / "dialogues.jsonl"))
    assert m["kept"] == len(kept) == 5
    assert all(d["id"].endswith("#persona") and d["origin"] == "persona" for d in kept)
    assert all(d["meta"]["drift"]["min_similarity"] > 0.99 for d in kept)  # identical rewrites
    # a profile comes from the same cluster
    assign = {a["id"]: a for a in clusters["assignment"]}
    for a in assign.values():
        assert assign[a["profile_from"]]["cluster"] == a["cluster"]


def test_persona_drift_filter_drops(tmp_path: Path) -> None:
    dl = _ingest(tmp_path)

    def drifting(messages: list[Message], params: GenParams) -> str:
        if messages[0]["content"].startswith("You rewrite"):
            return "The quarterly revenue of the steel company rose by four percent."
        return responder(messages, params)

    out = tmp_path / "rw"
    assert main(["persona", "--quiet", "--mode", "rewrite", "--limit", "2", "--out", str(out), str(dl)],
                llm_factory=_factory(FakeEngine(drifting), tmp_path / "cache")) == 0
    m = json.loads((out / "manifest.json").read_text())["counts"]
    assert m["kept"] == 0 and m["dropped"] == 2 and m["drop_reasons"]["semantic_drift"] == 2


def test_llm_cache_key_and_failure_never_invented(tmp_path: Path) -> None:
    import asyncio

    eng = FakeEngine(lambda m, p: "nope")
    llm = LLM(LLMSettings(max_retries=1, cache_dir=tmp_path), engine=eng)
    c = asyncio.run(llm.complete([{"role": "user", "content": "x"}], GenParams(), lambda t: None, "r"))
    assert c.value is None and c.error == "invalid_format" and c.attempts == 2 and len(eng.calls) == 2
    assert eng.calls[1].params.seed != eng.calls[0].params.seed and eng.calls[1].params.temperature > 0
    assert len(list(tmp_path.rglob("*.json"))) == 2
    assert np.isclose(llm.stats.failed, 1)


def test_generate_constrain_sends_the_cer_regex(tmp_path: Path) -> None:
    import re

    from cer.reasoning import render
    from data_builder.generate import CER_REGEX

    assert re.fullmatch(CER_REGEX, render({"analysis": "a", "emotion": "b", "strategy": "c", "response": "d"}))
    dl = _ingest(tmp_path)
    assert main(["sample", "--quiet", "--rounds", "1", "--limit", "1", "--out", str(tmp_path / "s"), str(dl)]) == 0
    eng = FakeEngine(lambda m, p: GOOD_CER, supports_regex=True)
    assert main(["generate", "--quiet", "--constrain", "--out", str(tmp_path / "g"), str(tmp_path / "s" / "rounds.jsonl")],
                llm_factory=_factory(eng, tmp_path / "cache")) == 0
    assert eng.calls and all(c.params.regex == CER_REGEX for c in eng.calls)
