"""The report's "what the judge favoured in training" table (compeer_loop/report_strategy.py): a candidate's edge is its
judge total minus its group's mean, split by whether the strategy it names is the one annotated at that round of the
train file the prompts were built from; computed by hand here on a two-round ESConv file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from compeer_loop.report_strategy import MIN_NAMED, strategy_edges, strategy_section
from compeer_loop.seeds import load_replicates
from data_builder.ingest import ingest_files
from tests.unit.loop_report_fixture import PROMPTS, seed_folder

DIALOGUE = {"emotion_type": "anxiety", "problem_type": "job crisis", "situation": "I may lose my job.",
            "experience_type": "Current Experience", "dialog": [
                {"speaker": "seeker", "annotation": {}, "content": "Hello, I am worried about my job."},
                {"speaker": "supporter", "annotation": {"strategy": "Question"}, "content": "What happened at work?"},
                {"speaker": "seeker", "annotation": {}, "content": "They are cutting staff."},
                {"speaker": "supporter", "annotation": {"strategy": "Providing Suggestions"},
                 "content": "Maybe update your resume."},
                {"speaker": "seeker", "annotation": {}, "content": "Thanks."}]}


def _train(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "train.json"
    path.write_text(json.dumps([DIALOGUE]))
    records, _ = ingest_files([path], "esconv")
    return path, str(records[0]["id"])


def _cand(dialogue: str, round_index: int, group: int, strategy: str | None, total: float,
          parts: tuple[float, ...] | None = None) -> dict[str, object]:
    step3 = f"<strategy>I will use {strategy}.</strategy>" if strategy else ""
    verdicts = {"steps": list(parts[:3]), "preference": parts[3], "format": parts[4]} if parts else {}
    return {"step": 1, "call": 1, "group": group, "dialogue_id": dialogue, "round_index": round_index,
            "status": "ok", "reward": total, "total": total, "text": f"{step3}<response>Okay then.</response>",
            **verdicts}


def test_edges_split_by_the_annotated_strategy_of_each_round(tmp_path: Path) -> None:
    path, did = _train(tmp_path)
    turns = {did: [dict(t) for t in ingest_files([path], "esconv")[0][0]["turns"]]}
    # round 1 is annotated Question, round 2 Providing Suggestions; round 3 has no annotation (group skipped)
    rows = [_cand(did, 1, 0, "Question", 4.0), _cand(did, 1, 0, "Question", 4.0), _cand(did, 1, 0, "Others", 2.0),
            _cand(did, 1, 0, None, 2.0),  # names nothing: in the group's mean, not counted
            _cand(did, 2, 1, "Question", 5.0), _cand(did, 2, 1, "Providing Suggestions", 3.0),
            _cand(did, 3, 2, "Question", 5.0), _cand(did, 3, 2, "Others", 1.0)]
    f = strategy_edges(rows, turns)
    assert f["groups"] == 2
    # group 0 mean 3.0: Question +1, +1 (annotated), Others -1; group 1 mean 4.0: Question +1, Suggestions -1
    assert f["right"]["mean"] == pytest.approx((1 + 1 - 1) / 3) and f["right"]["n"] == 3
    assert f["wrong"]["mean"] == pytest.approx(0.0) and f["wrong"]["n"] == 2
    assert f["right"]["lo"] <= f["right"]["mean"] <= f["right"]["hi"]
    assert f["favourite"] is None and f["favourite_parts"] is None  # none named MIN_NAMED times out of place
    # the favourite's edge by verdict: Question wins the preference (+1 against -1) and step 1 (+1 against +1 - 2)
    many = [_cand(did, 2, g, s, t, parts) for g in range(MIN_NAMED)
            for s, t, parts in (("Question", 5.0, (1, 1, 1, 1, 1)), ("Others", 1.0, (-1, 1, 1, -1, 1)))]
    f = strategy_edges(many, turns)
    assert f["favourite"][0] == "Question" and f["favourite"][1]["mean"] == pytest.approx(2.0)
    assert f["favourite"][1]["n"] == MIN_NAMED and f["favourite_parts"] == pytest.approx([1.0, 0.0, 0.0, 1.0, 0.0])


def test_the_section_reads_the_train_file_named_in_the_prompts_manifest(tmp_path: Path) -> None:
    path, did = _train(tmp_path)
    root = seed_folder(tmp_path / "loop", 0, {"a": [0.5] * PROMPTS, "c": [0.5] * PROMPTS})
    reps = load_replicates([root])
    assert strategy_section(reps) == []  # no arm logged its candidates
    rows = [_cand(did, 2, g, s, t) for g in range(MIN_NAMED) for s, t in (("Question", 5.0), ("Others", 3.0))]
    (root / "c" / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = {"inputs": {"train": {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}}
    (root / "prompts-manifest.json").write_text(json.dumps(manifest))
    lines = strategy_section(reps)
    assert lines[-1].startswith(f"| (c) | {MIN_NAMED} | n/a | +0.000 [")
    assert lines[-1].endswith(f"| Question: +1.000 [+1.000, +1.000] ({MIN_NAMED}) | n/a |")  # no verdicts logged
    manifest["inputs"]["train"]["sha256"] = "0" * 64
    (root / "prompts-manifest.json").write_text(json.dumps(manifest))
    assert "differs from the file the prompts were built from" in strategy_section(reps)[-1]
    path.unlink()
    assert "is not found here" in strategy_section(reps)[-1]


def test_questions_out_of_place_compare_the_judges_preference_with_the_scorers_win() -> None:
    """Only format-valid judged replies at rounds annotated with another strategy than Question count; a reply asks
    when it holds a question mark; short = at most SHORT_WORDS words; the differences are asking - not."""
    from compeer_loop.replies import asks_question
    from compeer_loop.report_follows import SHORT_WORDS, question_figures, questions_table

    def rec(text: str, pref: float, win: float | None, gold: str = "Providing Suggestions", ok: bool = True) -> dict:
        return {"text": text, "reward_preference": pref, "gold_strategy": gold, "format_ok": ok, "judge_status": "ok",
                "independent_win": win, "independent_status": "ok" if win is not None else "failed"}

    long_q = "How are you feeling about " + " ".join(["it"] * SHORT_WORDS) + "?"
    rs = [rec("How are you?", 1.0, 0.0), rec(long_q, 0.0, 0.5), rec("Try a walk.", -1.0, 1.0),
          rec("Maybe talk to your manager about the workload you carry this week.", 1.0, None),
          rec("Why?", 1.0, 0.0, gold="Question"),  # annotated Question: not counted
          rec("What now?", 1.0, 0.0, ok=False), {**rec("So what?", 1.0, 0.0), "judge_status": "failed"}]
    assert asks_question("Really\uff1f") and not asks_question("Fine.")
    f = question_figures(rs)
    assert f["ask"] == {"pref": [1.0, 0.0], "win": [0.0, 0.5]}
    assert f["not"] == {"pref": [-1.0, 1.0], "win": [1.0]}  # a scorer failure keeps the preference, not a win
    assert f["short_ask"] == {"pref": [1.0], "win": [0.0]} and f["short_not"] == {"pref": [-1.0], "win": [1.0]}
    row = questions_table({"a": rs}, {"a": "(a) warm-up"})[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "(a) warm-up" and cells[1] == "2 / 2" and cells[4] == "1 / 1"
    assert cells[2].startswith("+0.50 [") and cells[3].startswith("-0.75 [")  # 0.5 - 0.0; 0.25 - 1.0
    assert cells[5] == "+2.00 [+2.00, +2.00]" and cells[6] == "-1.00 [-1.00, -1.00]"
    assert questions_table({"a": rs[4:5]})[-1] == "| a | 0 / 0 | n/a | n/a | 0 / 0 | n/a | n/a |"
