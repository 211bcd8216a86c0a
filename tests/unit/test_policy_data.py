"""policy_trainer.data: the shipped smoke set, emit-style folders and JSONL, warm-up targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import Dataset

from cer.policy_prompt import system_prompt
from cer.reasoning import parse
from policy_trainer.data import load_prompt_set, load_warmup_set


def test_smoke_set_builds_policy_prompts() -> None:
    ds = load_prompt_set("smoke")
    assert len(ds) >= 8
    row = ds[1]
    assert row["prompt"][0] == {"role": "system", "content": system_prompt()}
    assert [m["role"] for m in row["prompt"][1:]] == ["user", "assistant", "user"]
    assert row["history"][0]["role"] == "seeker" and row["reference"]
    assert len(load_prompt_set("smoke", max_prompts=3)) == 3


def test_emit_folder_with_prompt_column_is_used_as_is(tmp_path: Path) -> None:
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    Dataset.from_list([{"dialogue_id": "d1", "history": [{"role": "seeker", "text": "hi"}], "reference": "hello",
                        "prompt": prompt}]).save_to_disk(str(tmp_path / "emit"))
    ds = load_prompt_set(str(tmp_path / "emit"))
    assert ds[0]["prompt"] == prompt and ds[0]["dialogue_id"] == "d1"


def test_bad_rows_name_the_problem(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"dialogue_id": "x", "history": [{"role": "therapist", "text": "t"}],
                             "reference": "r"}) + "\n")
    with pytest.raises(ValueError, match="seeker \\| supporter"):
        load_prompt_set(str(f))
    f.write_text(json.dumps({"history": [], "reference": "r"}) + "\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_prompt_set(str(f))
    with pytest.raises(FileNotFoundError):
        load_prompt_set(str(tmp_path / "absent"))


def test_warmup_set_is_prompt_completion_with_valid_cer_targets(tmp_path: Path) -> None:
    ds, dropped = load_warmup_set("smoke")
    assert len(ds) >= 8 and dropped == {}
    for row in ds:
        assert row["completion"][0]["role"] == "assistant"
        assert parse(row["completion"][0]["content"]).ok
    f = tmp_path / "w.jsonl"
    f.write_text(json.dumps({"history": [{"role": "seeker", "text": "t"}], "target": "<analysis>a</analysis>"}) + "\n")
    with pytest.raises(ValueError, match="not well-formed CER"):
        load_warmup_set(str(f))


def test_warmup_rows_with_a_marked_target_reply_are_left_out_and_counted(tmp_path: Path) -> None:
    """sft_warmup_drop_marked: a real but contentless turn ("I see.") is not taught; a real reply is."""
    history = [{"role": "seeker", "text": "My sister stopped talking to me after our father's funeral."}]
    good = ("It must hurt to lose your father and then feel your sister pull away. What happened between you two "
            "at the funeral?")
    rows = [{"history": history, "target": f"<analysis>a</analysis><emotion>e</emotion><strategy>s</strategy>"
                                           f"<response>{reply}</response>"} for reply in (good, "I see.")]
    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds, dropped = load_warmup_set(str(f), drop_marked=True)
    assert len(ds) == 1 and good in ds[0]["completion"][0]["content"]
    assert dropped == {"generic/short_no_content": 1}
    ds, dropped = load_warmup_set(str(f))  # off: every well-formed row is kept
    assert len(ds) == 2 and dropped == {}
    f.write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(ValueError, match="every row marked"):
        load_warmup_set(str(f), drop_marked=True)
