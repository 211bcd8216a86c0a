"""Rationale phrasings replaced for an experiment (``compeer-data silver --rationales FILE``): the step-3 rationale
that states the reply's own annotated strategy before the verdict, and clear errors for a wrong key or field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_builder.cli import main
from data_builder.records import read_jsonl
from data_builder.silver_text import load_config, with_rationales

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"
EVIDENCE = Path(__file__).resolve().parents[2] / "data_builder" / "data" / "rationales-step3-evidence.yaml"


def _silver(tmp_path: Path, *extra: str) -> list[dict]:
    if not (tmp_path / "s" / "rounds.jsonl").exists():  # the fixture's rounds, sampled once
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
            named = a["rationales"]["step3"].split("carry out ", 1)[1].rstrip(".")
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


def _fixture_split(tmp_path: Path) -> Path:
    """The fixture dialogues as an ESConv folder (train.json: three, valid.json: the rest)."""
    src = tmp_path / "esconv"
    src.mkdir()
    dialogues = json.loads((FIX / "esconv.json").read_text())
    (src / "train.json").write_text(json.dumps(dialogues[:3]))
    (src / "valid.json").write_text(json.dumps(dialogues[3:]))
    return src


def test_esconv_data_sh_passes_the_rationales_to_the_judges_training_chats(tmp_path: Path) -> None:
    """``SILVER_RATIONALES`` on the real ``tools/gpu/esconv_data.sh`` (the GPU scripts' data build), on the fixture
    split in two: the contrast groups and every label stay byte for byte, and the step-3 turns of the judge's SFT
    chats carry the evidence phrasing."""
    from datasets import load_from_disk

    repo, src = EVIDENCE.parents[2], _fixture_split(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for name, extra in (("plain", {}), ("evidence", {"SILVER_RATIONALES": str(EVIDENCE)})):
        subprocess.run(["bash", "tools/gpu/esconv_data.sh", str(src), str(tmp_path / name)], cwd=repo,
                       env={**env, **extra}, check=True, capture_output=True, timeout=300)
    plain, evidence = tmp_path / "plain", tmp_path / "evidence"
    assert (plain / "contrast" / "groups.jsonl").read_bytes() == (evidence / "contrast" / "groups.jsonl").read_bytes()
    a = list(read_jsonl(plain / "silver-train" / "items.jsonl"))
    b = list(read_jsonl(evidence / "silver-train" / "items.jsonl"))
    assert [x["labels"] for x in a] == [x["labels"] for x in b]
    turns = [m["content"] for row in load_from_disk(str(evidence / "emit" / "judge_sft" / "unified"))["train"]
             for m in row["messages"] if m["role"] == "assistant"]
    assert any(t.startswith("Rationale: the reply is ") and t.endswith("Verdict: True") for t in turns)
    # the default step-3 phrasings are gone (but for a hack's "carries out no strategy", not overridden)
    assert not any("does not carry out" in t or ("carries out" in t and "no strategy" not in t) for t in turns)



def test_esconv_data_sh_builds_with_another_construction_yaml(tmp_path: Path) -> None:
    """``SILVER_CONFIG`` (e.g. an earlier commit's silver.yaml, to rebuild an earlier judge's data) reaches both
    silver and contrast: a config whose generic eval texts are one marker puts that marker in every contrast group."""
    import yaml

    repo, src = EVIDENCE.parents[2], _fixture_split(tmp_path)
    cfg = yaml.safe_load((repo / "data_builder" / "data" / "silver.yaml").read_text())
    for lang in ("en", "zh"):  # the fixture's valid dialogues are Chinese
        cfg["negative_replies"][lang]["generic"]["eval"] = ["A marker text of this test?"]
    (tmp_path / "silver.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SILVER_CONFIG": str(tmp_path / "silver.yaml")}
    subprocess.run(["bash", "tools/gpu/esconv_data.sh", str(src), str(tmp_path / "out")], cwd=repo, env=env,
                   check=True, capture_output=True, timeout=300)
    groups = list(read_jsonl(tmp_path / "out" / "contrast" / "groups.jsonl"))
    assert groups and all("A marker text of this test?" in json.dumps(g) for g in groups)
    # beside the hashes, the cue table of both item files (compeer-data cues)
    cues = (tmp_path / "out" / "cues.txt").read_text()
    assert cues.count("| question, short |") == 2 and "silver-valid/items.jsonl" in cues
