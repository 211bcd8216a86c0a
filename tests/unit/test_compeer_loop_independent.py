"""Issue 26, the independent scorer compares, not rates: each evaluation reply set against the real ESConv supporter
reply of its prompt, in both orders (`compeer_loop.independent`); the win values, the statuses that are never scored,
the win share and the paired difference between arms, and the report's columns. FAKE engines only
(``tests.fake_engine.FakeEngine``: scripted answers, every call recorded)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compeer_loop.independent import (
    BETTER_REGEX,
    PAIR_SYSTEM,
    RUBRIC,
    compare_replies,
    first_position,
    pair_messages,
    parse_better,
    win_value,
)
from compeer_loop.report import goals
from compeer_loop.report_checks import independent_section, paired_section, skeptic_table
from compeer_loop.stats import FIGURES, matched_win_share, paired_difference, per_prompt, summarise, win_share
from evaluator.backends import EngineError, roles_from_engines
from tests.fake_engine import FakeEngine

HISTORY = [{"role": "seeker", "text": "I lost my job last week and I cannot sleep."}]
REFERENCE = "I am so sorry. Losing a job is a shock; what has kept you awake?"


def _rec(i: int, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": f"p{i}", "status": "ok", "history": HISTORY, "text": text, "reference": REFERENCE,
            "strategy": None, "gold_strategy": "Question", "format_ok": True, "rouge_l": 10.0, "length": 5.0,
            **extra}


def _replies(messages: list[dict[str, str]]) -> tuple[str, str]:
    """Reply A and reply B of a comparison prompt (as :func:`pair_messages` lays them out)."""
    user = messages[-1]["content"]
    a = user.split("\n\nReply A:\n", 1)[1].split("\n\nReply B:\n", 1)[0]
    b = user.split("\n\nReply B:\n", 1)[1].split("\n\nWhich reply", 1)[0]
    return a, b


def _prefers(better: Callable[[str, str], str]) -> Callable[[list[dict[str, str]], Any], str]:
    """A fake scorer's responder: ``better(a, b)`` names the reply it prefers by content ("A" or "B")."""
    return lambda messages, params: f"Better: {better(*_replies(messages))}"


def _compare(recs: list[dict[str, Any]], engine: FakeEngine) -> dict[str, dict[str, Any]]:
    """``compare_replies`` with the fake engine as scorer, on a cache of its own (without one, the generate loop
    caches in ~/.cache/compeer, where another test's or run's answers to the same prompt would be found)."""
    with tempfile.TemporaryDirectory() as cache:
        roles = roles_from_engines({"model": engine, "simulator": engine, "scorer": engine}, cache_dir=Path(cache))

        async def go() -> dict[str, dict[str, Any]]:
            try:
                return await compare_replies(recs, roles.scorer)
            finally:
                await roles.aclose()

        return asyncio.run(go())


def test_parse_better_takes_exactly_one_better_line() -> None:
    assert parse_better("Better: A") == "A"
    assert parse_better("better : b\n") == "B"
    assert parse_better("Some thought.\nBetter: B") == "B"
    for bad in ("Better: C", "A", "B is better", "Better: A\nBetter: B", "Better: A\nBetter: A", "Better: AB",
                "Better: A, because it listens", "Rating: 4", ""):
        assert parse_better(bad) is None, bad


def test_the_prompt_is_the_one_the_scorer_check_measured() -> None:
    """The wording of docs/evaluations/compeer-loop/scorer-check (`rate_contrast.py --pairwise`), to the letter."""
    msgs = pair_messages(HISTORY, "first reply", "second reply")
    assert msgs[0] == {"role": "system", "content": "You compare two replies in an emotional-support conversation. "
                       "Answer with exactly one line: `Better: A` or `Better: B`."} == {"role": "system",
                                                                                       "content": PAIR_SYSTEM}
    assert msgs[1] == {"role": "user", "content": (
        "Conversation so far:\nSeeker: I lost my job last week and I cannot sleep.\n\nReply A:\nfirst reply\n\n"
        f"Reply B:\nsecond reply\n\nWhich reply supports the seeker better? {RUBRIC}\nAnswer `Better: A` or "
        "`Better: B`.")}
    assert BETTER_REGEX == "Better: (A|B)"


def test_win_and_first_position_values() -> None:
    assert win_value("A", "B") == 1.0 and win_value("B", "A") == 0.0
    assert win_value("A", "A") == 0.5 and win_value("B", "B") == 0.5
    assert win_value(None, "B") is None and win_value("A", None) is None and win_value(None, None) is None
    assert first_position("A", "A") == 1.0 and first_position("B", "B") == 0.0 and first_position("A", "B") == 0.5
    assert first_position("A", None) is None


def test_both_orders_are_asked_with_the_reference_in_the_other_position() -> None:
    engine = FakeEngine(lambda messages, params: "Better: A", supports_regex=True)
    _compare([_rec(0, "my reply")], engine)
    assert sorted(c.request_id.split("/")[1][:2] for c in engine.calls) == ["ab", "ba"]  # each asked once
    shown = {c.request_id.split("/")[1][:2]: _replies(c.messages) for c in engine.calls}
    assert shown == {"ab": ("my reply", REFERENCE), "ba": (REFERENCE, "my reply")}
    assert all(c.params.regex == BETTER_REGEX for c in engine.calls)  # the answer constrained as measured


def test_win_is_one_half_or_zero_by_content_and_the_order_swap_cancels_position_bias() -> None:
    """Mutation check: a scorer that always prefers the arm's reply gives it 1 only because the second ask shows the
    reply as B (with the swap dropped, both asks would show it as A and read 0.5); a scorer that always names A, a
    pure position bias, gives 0.5 with every answer in the first position."""
    recs = [_rec(0, "GOOD reply"), _rec(1, "plain reply")]
    rank = {"GOOD reply": 2, REFERENCE: 1, "plain reply": 0}  # the fake scorer's taste, whatever the position
    out = _compare(recs, FakeEngine(_prefers(lambda a, b: "A" if rank[a] > rank[b] else "B")))
    assert (out["p0"]["independent_as_a"], out["p0"]["independent_as_b"]) == ("A", "B")
    assert out["p0"]["independent_win"] == 1.0 and out["p0"]["independent_first_position"] == 0.5
    assert out["p1"]["independent_win"] == 0.0  # the reference won both orders
    assert all(o["independent_status"] == "ok" for o in out.values())
    biased = _compare(recs, FakeEngine(lambda messages, params: "Better: A"))
    assert all(o["independent_win"] == 0.5 and o["independent_first_position"] == 1.0 for o in biased.values())
    assert win_share([{**r, **biased[r["id"]]} for r in recs]) == pytest.approx(0.5)


def test_an_unparsed_answer_is_failed_and_an_engine_failure_is_engine_error_never_scored() -> None:
    def answer(messages: list[dict[str, str]], params: Any) -> str:
        a, b = _replies(messages)
        if "crash" in a + b:
            raise EngineError("fake engine down")
        if "vague" in a:  # only the order with the arm's reply as A fails to parse
            return "Both are fine."
        return "Better: A"

    recs = [_rec(0, "vague reply"), _rec(1, "crash reply"), _rec(2, "fine reply"), {"id": "p3", "status": "failed"},
            {**_rec(4, "no reference"), "reference": ""}]
    out = _compare(recs, FakeEngine(answer))
    assert set(out) == {"p0", "p1", "p2", "p4"}  # the unanswered prompt is not compared
    assert out["p0"]["independent_status"] == "failed" and out["p0"]["independent_win"] is None
    assert out["p0"]["independent_as_a"] is None and out["p0"]["independent_as_b"] == "A"  # kept as answered
    assert out["p1"]["independent_status"] == "engine_error" and out["p1"]["independent_win"] is None
    assert "fake engine down" in out["p1"]["independent_error"]
    assert out["p4"]["independent_status"] == "no_reference" and out["p4"]["independent_win"] is None
    assert out["p2"]["independent_status"] == "ok" and out["p2"]["independent_win"] == 0.5
    joined = [{**r, **out.get(r["id"], {})} for r in recs]
    assert FIGURES["independent_win_share"](joined) == pytest.approx(0.5)  # p2 alone
    assert FIGURES["independent_unscored"](joined) == pytest.approx(75.0)  # p0, p1, p4 of the 4 compared
    assert FIGURES["independent_first_position"](joined) == pytest.approx(100.0)
    # a stray win on a record whose status is not ok is still not counted
    assert win_share([{**joined[1], "independent_win": 1.0}, joined[2]]) == pytest.approx(0.5)


def _scored(i: int, win: float | None, status: str = "ok") -> dict[str, Any]:
    return _rec(i, f"reply {i}", independent_win=win, independent_status=status, independent_first_position=(
        0.5 if win is not None else None), independent_as_a=None, independent_as_b=None)


def test_win_share_and_the_paired_difference_use_only_prompts_both_arms_have_ok() -> None:
    c = [_scored(0, 1.0), _scored(1, 0.5), _scored(2, 1.0), _scored(3, None, "failed")]
    a = [_scored(0, 0.0), _scored(1, 0.5), _scored(2, None, "engine_error"), _scored(3, 1.0)]
    assert win_share(c) == pytest.approx(2.5 / 3) and win_share(a) == pytest.approx(1.5 / 3)
    sc, sa = per_prompt(c, "independent_win", 0), per_prompt(a, "independent_win", 0)
    assert set(sc) == {(0, "p0"), (0, "p1"), (0, "p2")} and set(sa) == {(0, "p0"), (0, "p1"), (0, "p3")}
    d = paired_difference(sc, sa, n_boot=200, n_perm=200)
    assert d["n"] == 2 and d["diff"] == pytest.approx(0.5)  # p0: 1 - 0, p1: 0.5 - 0.5
    _, out = paired_section({"c": c, "a": a}, n_boot=100)
    assert out["pairs"]["c-a:independent_win"]["n"] == 2
    assert out["pairs"]["c-a:independent_win"]["diff"] == pytest.approx(0.5)


def test_report_shows_the_win_share_and_decides_the_goal_by_the_paired_interval() -> None:
    c = [_scored(i, 1.0 if i % 4 else 0.5) for i in range(12)]
    a = [_scored(i, 0.0 if i % 3 else 0.5) for i in range(12)]
    figs = {"c": summarise(c, n_boot=50), "a": summarise(a, n_boot=50)}
    table = skeptic_table(figs, {"c": c, "a": a}, {"c": "(c)", "a": "(a)"}, {}, 16)
    assert ("| independent: win share vs the real reply | independent: win share, length 0.67-1.5x the real reply's "
            "(replies so %) | independent: answers naming A % / not scored % |") in table
    assert "| 0.88 [" in table and "| 50.0 [50.0, 50.0] / 0.0 [0.0, 0.0] |" in table
    assert "Compared: c, a." in independent_section(figs, "judge-base")
    _, paired = paired_section({"c": c, "a": a}, n_boot=200)
    line = next(g for g in goals(figs, paired["pairs"]) if g.startswith("(c) beats (a) on the independent scorer"))
    assert ": met: (c) - (a) = " in line and "12 pairs" in line


def test_the_win_share_among_replies_of_about_the_real_replys_length() -> None:
    """A scorer that prefers long replies: the length-matched share (0.67-1.5x the real reply's length) counts only
    the replies within the band, beside their share, so a policy that wins by writing longer is seen doing so."""
    ref = len(REFERENCE.split())
    rs = [_scored(0, 1.0) | {"length": 3.0 * ref}, _scored(1, 1.0) | {"length": 3.0 * ref},
          _scored(2, 0.0) | {"length": float(ref)}, _scored(3, 0.5) | {"length": 1.4 * ref},
          _scored(4, 1.0) | {"length": 0.5 * ref}, _scored(5, None, "failed") | {"length": float(ref)}]
    for r in rs:
        r["reference_length"] = float(ref)
    assert win_share(rs) == pytest.approx(3.5 / 5) and matched_win_share(rs) == pytest.approx(0.25)
    f = summarise(rs, n_boot=20)["figures"]
    assert f["independent_matched_share"]["value"] == pytest.approx(40.0)  # 2 of the 5 scored replies
    table = skeptic_table({"c": summarise(rs, n_boot=20)}, {"c": rs}, {"c": "(c)"}, {}, 16)
    assert "| 0.25 [" in table and "(40.0 [" in table
    assert matched_win_share([_scored(0, 1.0) | {"length": 9.0 * ref}]) is None  # none within the band: no figure


def test_a_folder_rated_1_to_5_before_the_scorer_compared_reads_not_run() -> None:
    old = [_rec(0, "reply", independent_rating=3, independent_status="ok"),
           _rec(1, "reply", independent_rating=None, independent_status="failed")]
    figs = {"a": summarise(old, n_boot=20)}
    assert figs["a"]["figures"]["independent_win_share"]["value"] is None
    assert figs["a"]["figures"]["independent_unscored"]["value"] is None
    assert "| not run | not run |" in skeptic_table(figs, {"a": old}, {"a": "(a)"}, {}, 16)
    assert "not run" in independent_section(figs, "judge-base").lower()
    assert per_prompt(old, "independent_win", 0) == {}
