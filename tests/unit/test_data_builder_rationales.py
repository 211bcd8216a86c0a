"""Rationale phrasings replaced for an experiment (``compeer-data silver --rationales FILE``): the step-3 rationale
that states the reply's own annotated strategy before the verdict, and clear errors for a wrong key or field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_builder.cli import main
from data_builder.records import read_jsonl
from data_builder.silver_text import load_config, with_rationales

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"
EVIDENCE = Path(__file__).resolve().parents[2] / "data_builder" / "data" / "rationales-step3-evidence.yaml"


def _silver(tmp_path: Path, *extra: str) -> list[dict]:
    assert main(["ingest", "--quiet", "--format", "esconv", "--out", str(tmp_path / "i"),
                 str(FIX / "esconv.json")]) == 0
    assert main(["sample", "--quiet", "--rounds", "5", "--out", str(tmp_path / "s"),
                 str(tmp_path / "i" / "dialogues.jsonl")]) == 0
    out = tmp_path / ("silver" + "-".join(Path(e).stem for e in extra))
    assert main(["silver", "--quiet", "--false-share", "0.5", "--seed", "3", "--no-reply-items", "--out", str(out),
                 *extra, str(tmp_path / "s" / "rounds.jsonl")]) == 0
    return list(read_jsonl(out / "items.jsonl"))


def test_the_evidence_rationales_state_the_replys_strategy_and_change_nothing_else(tmp_path: Path) -> None:
    plain = _silver(tmp_path)
    evidence = _silver(tmp_path, "--rationales", str(EVIDENCE))
    assert len(plain) == len(evidence) > 0
    seen = set()
    for a, b in zip(plain, evidence):
        # the same items, labels, candidates and other rationales: only step 3's wording differs
        assert {k: v for k, v in a.items() if k != "rationales"} == {k: v for k, v in b.items() if k != "rationales"}
        assert {k: v for k, v in a["rationales"].items() if k != "step3"} == \
            {k: v for k, v in b["rationales"].items() if k != "step3"}
        kind = a["construction"].get("corrupted", {}).get("step3")
        reply = a["construction"]["reply_strategy"]
        if kind is None:
            assert b["rationales"]["step3"] == f"the reply is {reply}, as named."
            seen.add("true")
        elif kind == "unused_strategy":
            named = next(s for s in a["rationales"]["step3"].split("carry out ")[1:])[:-1]
            assert named != reply and b["rationales"]["step3"] == f"the reply is {reply}, not {named}."
            seen.add(kind)
    assert seen == {"true", "unused_strategy"}


def test_a_wrong_key_or_field_is_a_clear_error(tmp_path: Path) -> None:
    cfg = load_config()
    bad_key = tmp_path / "k.yaml"
    bad_key.write_text("step4_true: the reply is fine.\n")
    with pytest.raises(ValueError, match="unknown key 'step4_true'"):
        with_rationales(cfg, str(bad_key))
    bad_field = tmp_path / "f.yaml"
    bad_field.write_text(json.dumps({"step3_true": "the reply is {reply_stratgy}."}))
    with pytest.raises(ValueError, match="reply_stratgy"):
        with_rationales(cfg, str(bad_field))
    assert with_rationales(cfg, str(EVIDENCE)).rationales["step3_stage_mismatch"] == \
        cfg.rationales["step3_stage_mismatch"]
