"""``compeer-loop rejudge`` without a server: which fields a new judgment replaces, what the copy leaves out, and
the refusals made before anything is copied (the real server: tests/integration/test_compeer_loop_rejudge.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compeer_loop.rejudge import SCORED, rejudge, replace_judgments
from compeer_loop.rescore import copy_ignoring


def test_a_new_judgment_replaces_every_judge_and_reward_field_of_answered_records_only() -> None:
    records = [{"id": "p0", "status": "ok", "text": "Hi?", "judge_status": "ok", "reward_total": 5.0,
                "reward_total_graded": 4.9, "judge_error": "old", "independent_win": 1.0},
               {"id": "p1", "status": "ok", "text": "Okay.", "judge_status": "ok", "reward_total": 1.0},
               {"id": "p2", "status": "engine_error", "text": "", "reward_total": 3.0}]
    scores = {"p0": {"id": "p0", "judge_status": "parse_failed"}}
    out = replace_judgments(records, scores)
    assert out[0] == {"id": "p0", "status": "ok", "text": "Hi?", "independent_win": 1.0, "judge_status": "parse_failed"}
    assert out[1] == {"id": "p1", "status": "ok", "text": "Okay.", "judge_status": "call_failed"}  # no new judgment
    assert out[2] == records[2]


def test_the_copy_leaves_out_process_ids_and_the_old_judges_answers() -> None:
    skip = copy_ignoring(SCORED)
    assert skip("/r/eval/a", ["records.jsonl", "scored.jsonl", "compared"]) == {"scored.jsonl"}
    assert skip("/r", ["scored.jsonl", "driver.pid", "pid", "plan.json"]) == {"driver.pid", "pid"}


def test_refusals_before_anything_is_copied(tmp_path: Path) -> None:
    root = tmp_path / "loop"
    (root / "eval" / "a").mkdir(parents=True)
    (root / "eval" / "a" / "records.jsonl").write_text(json.dumps({"id": "p0", "status": "ok"}) + "\n")
    with pytest.raises(ValueError, match="inside --root"):
        rejudge(root, root / "x", "127.0.0.1:1")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        rejudge(root, tmp_path / "full", "127.0.0.1:1")
    with pytest.raises(ValueError, match="no evaluation records of b"):
        rejudge(root, tmp_path / "new", "127.0.0.1:1", ["b"])
    assert not (tmp_path / "new").exists()
