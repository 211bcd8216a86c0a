"""``compeer-data cues``: whether a question or a short reply tells the label of judge items, and the shipped hack
pools that keep a question from being a sign of a real reply (issue 23, 2026-12-08)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_builder.cli import main
from data_builder.cues import asks_question, cell_of, cue_table
from data_builder.negatives import HACK_KINDS
from data_builder.records import write_jsonl
from data_builder.silver_text import REPLY_POOLS, load_config


def _pref(reply: str, preferred: bool, negative: bool) -> dict:
    construction = {"pair": "gold_vs_hack", "negative": {"kind": "generic", "role": "candidate"} if negative else None}
    return {"candidate": f"<analysis>a</analysis><response>{reply}</response>", "construction": construction,
            "labels": {"preference": "second" if preferred else "first", "step1": True}}


def _reply(reply: str, true: bool) -> dict:
    return {"candidate": f"<response>{reply}</response>", "construction": {"reply": "gold"}, "labels": {"reply": true}}


def test_cells_and_gaps_are_counted_from_the_candidates_reply() -> None:
    long_q = "Could you tell me a little more about what happened at work last week with your boss?"
    items = [_pref("How are you?", True, False), _pref("Anything else?", False, True),  # short questions: 1 of 2 real
             _pref("Okay.", False, True), _pref("I get it.", False, True), _pref("Thanks.", False, True),
             _pref("I hear you.", True, False),  # short statements: 1 of 4 real, 1 preferred
             _pref(long_q, True, False),
             _reply("How are you?", True), _reply("Okay.", False), _reply("Okay then.", False)]
    t = cue_table(items)
    short_q, short_s = t["cells"]["question, short"], t["cells"]["no question, short"]
    assert (short_q["preference_items"], short_q["real_pct"], short_q["preferred_pct"]) == (2, 50.0, 50.0)
    assert (short_s["preference_items"], short_s["real_pct"], short_s["preferred_pct"]) == (4, 25.0, 25.0)
    assert (short_q["reply_items"], short_q["reply_true_pct"], short_s["reply_true_pct"]) == (1, 100.0, 0.0)
    assert t["cells"]["question, longer"]["preference_items"] == 1
    assert t["gap_question_minus_not"]["short"] == {"real_pct": 25.0, "preferred_pct": 25.0, "reply_true_pct": 100.0}
    # no item in a cell: its figures are None, and so is a gap that needs it
    assert t["cells"]["no question, longer"]["real_pct"] is None
    assert t["gap_question_minus_not"]["longer"]["real_pct"] is None
    assert cell_of("Why？") == ("question", "short") and not asks_question("Fine.")


def test_the_cli_prints_the_table_writes_json_and_refuses_a_bad_length(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    items = tmp_path / "items.jsonl"
    write_jsonl(items, [_pref("How are you?", True, False), _pref("Okay.", False, True)])
    assert main(["cues", str(items), "--short-words", "3", "--json", str(tmp_path / "cues.json")]) == 0
    out = capsys.readouterr().out
    assert "| question, short | 1 | 100.0 | 100.0 |" in out and "| no question, short | 1 | 0.0 | 0.0 |" in out
    assert "gap, short: question - no question | | 100.0 | 100.0 |" in out
    saved = json.loads((tmp_path / "cues.json").read_text())
    assert saved[str(items)]["short_words"] == 3
    assert main(["cues", str(items), "--short-words", "0"]) == 2
    assert "--short-words must be at least 1" in capsys.readouterr().err


def test_the_shipped_english_hack_pools_ask_questions_too() -> None:
    """Real supporter replies ask a question about a third of the time; hacks that never did made a question the
    sign of a real reply (v3's items: +26 points of 'preferred' for a short question). Each English pool of the
    generic and dismissive hacks is at least a third questions, and the degenerate fragments hold some."""
    cfg = load_config()
    for pool in REPLY_POOLS:
        for kind in HACK_KINDS:
            texts = cfg.hack_texts("en", kind, pool)
            share = sum(asks_question(t) for t in texts) / len(texts)
            if kind in ("generic", "dismissive"):
                assert share >= 1 / 3, (pool, kind, share)
            elif kind == "degenerate":
                assert share >= 0.25, (pool, kind, share)
