"""Loaders of every input format (English and Chinese), malformed records, unmapped strategies, manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_builder.cli import main
from data_builder.ingest import ingest_files, iter_json_objects
from data_builder.records import read_jsonl

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"


def test_esconv_english_and_chinese() -> None:
    recs, rep = ingest_files([FIX / "esconv.json"], "esconv")
    assert rep.read == 5 and rep.kept == 5 and rep.malformed == 0
    assert [r["lang"] for r in recs] == ["en", "en", "en", "zh", "zh"]
    first = recs[0]
    assert first["turns"][0] == {"role": "supporter", "text": "Hi there, how are you feeling tonight?", "strategy": "Question"}
    assert first["meta"]["emotion_type"] == "anxiety" and first["meta"]["initial_intensity"] == 5
    assert recs[2]["meta"]["final_intensity"] is None  # missing survey value
    zh = recs[3]
    assert zh["meta"]["problem_type"] == "学业压力" and zh["turns"][1]["strategy"] == "Question"
    assert not rep.unmapped
    assert sum(rep.strategies.values()) == sum(1 for r in recs for t in r["turns"] if t["strategy"])


def test_raw_variant_maps_aliases_and_counts_unmapped() -> None:
    recs, rep = ingest_files([FIX / "esconv_raw.json"], "esconv-raw")
    assert rep.kept == 3
    assert dict(rep.unmapped) == {"Empathic Humour": 2}
    roles = {t["role"] for r in recs for t in r["turns"]}
    assert roles == {"seeker", "supporter"}
    strategies = {t["strategy"] for r in recs for t in r["turns"]}
    assert {"Question", "Others", "Providing Suggestions", "Affirmation and Reassurance"} <= strategies
    unmapped = [t for r in recs for t in r["turns"] if t.get("strategy_raw")]
    assert len(unmapped) == 2 and all(t["strategy"] is None for t in unmapped)


def test_generic_jsonl_and_sio() -> None:
    recs, rep = ingest_files([FIX / "dialogues.jsonl"], "jsonl")
    assert rep.kept == 2 and [r["id"] for r in recs] == ["jsonl-g-en-1", "jsonl-g-zh-1"]
    assert [r["lang"] for r in recs] == ["en", "zh"]
    assert recs[1]["meta"]["emotion_type"] == "悲伤"
    sio, rep2 = ingest_files([FIX / "sio.jsonl"], "sio")
    assert rep2.kept == 2 and sio[0]["lang"] == "zh" and sio[1]["lang"] == "en"
    assert sio[0]["meta"]["system"].startswith("你是")
    assert [t["role"] for t in sio[1]["turns"]] == ["seeker", "supporter", "seeker", "supporter"]


def test_malformed_reported_with_file_and_line_then_skipped() -> None:
    _, rep = ingest_files([FIX / "esconv_malformed.json"], "esconv")
    assert rep.read == 5 and rep.kept == 1 and rep.malformed == 4
    lines = [e.split(":")[1] for e in rep.errors]
    assert lines == ["109", "110", "111", "218"]
    assert all(e.startswith(str(FIX / "esconv_malformed.json")) for e in rep.errors)
    # dialogue text never appears in the report
    assert not any("refreshing" in e for e in rep.errors)
    _, rep = ingest_files([FIX / "dialogues_malformed.jsonl"], "jsonl")
    assert rep.kept == 1 and rep.malformed == 3
    assert [e.split(":")[1] for e in rep.errors] == ["2", "3", "4"]


def test_json_array_line_numbers() -> None:
    objs = list(iter_json_objects(FIX / "esconv.json"))
    assert objs[0][0] == 2 and len(objs) == 5


def test_cli_manifest_strict_and_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ing"
    assert main(["ingest", "--format", "esconv-raw", "--out", str(out), str(FIX / "esconv_raw.json")]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["unmapped_strategies"] == {"Empathic Humour": 2}
    assert m["command"].startswith("compeer-data ingest --format esconv-raw")
    assert "ingest" in capsys.readouterr().out  # the summary table
    assert len(list(read_jsonl(out / "dialogues.jsonl"))) == 3
    bad = tmp_path / "bad"
    assert main(["ingest", "--strict", "--format", "jsonl", "--out", str(bad), str(FIX / "dialogues_malformed.jsonl")]) == 2
    assert "dialogues_malformed.jsonl:2" in capsys.readouterr().err
    lim = tmp_path / "lim"
    assert main(["ingest", "--format", "esconv", "--limit", "2", "--out", str(lim), str(FIX / "esconv.json")]) == 0
    assert json.loads((lim / "manifest.json").read_text())["counts"]["kept"] == 2


def test_duplicates_counted(tmp_path: Path) -> None:
    _, rep = ingest_files([FIX / "esconv.json", FIX / "esconv.json"], "esconv")
    assert rep.kept == 5 and rep.duplicates == 5


def test_jsonl_round_trip_property(tmp_path_factory: pytest.TempPathFactory) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40).filter(
        lambda s: s.strip() != "")
    turns = st.lists(st.tuples(st.sampled_from(["seeker", "supporter"]), text), min_size=2, max_size=8).filter(
        lambda ts: {r for r, _ in ts} == {"seeker", "supporter"})

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(dialogues=st.lists(turns, min_size=1, max_size=4))
    def check(dialogues: list[list[tuple[str, str]]]) -> None:
        path = tmp_path_factory.mktemp("prop") / "d.jsonl"
        lines = [json.dumps({"id": f"x{i}", "turns": [{"role": r, "text": t} for r, t in d]}, ensure_ascii=False)
                 for i, d in enumerate(dialogues)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        recs, rep = ingest_files([path], "jsonl")
        assert rep.malformed == 0 and rep.kept == len(dialogues)
        for rec, d in zip(recs, dialogues):
            assert [(t["role"], t["text"]) for t in rec["turns"]] == [(r, t.strip()) for r, t in d]

    check()
