"""cer/: the CER format parser, verdict parsing (property tests) and the reward rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cer import rewards
from cer.reasoning import PARTS, parse, render
from cer.taxonomy import load_taxonomy
from cer.verdicts import Kind, Preference, parse_verdicts

_text = st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), min_size=1,
                max_size=60).filter(lambda s: s.strip())


@given(st.fixed_dictionaries({p: _text for p in PARTS}))
def test_render_parse_roundtrip(parts: dict[str, str]) -> None:
    parsed = parse(render(parts))
    assert parsed.ok
    assert parsed.parts == {p: parts[p].strip() for p in PARTS}


@given(st.fixed_dictionaries({p: _text for p in PARTS}), st.sampled_from(PARTS))
def test_dropping_a_part_is_reported(parts: dict[str, str], dropped: str) -> None:
    text = "".join(f"<{p}>{parts[p]}</{p}>" for p in PARTS if p != dropped)
    parsed = parse(text)
    assert not parsed.ok
    assert parsed.missing == [dropped]


def test_order_duplicates_and_empty_parts_are_malformed() -> None:
    assert parse("<emotion>e</emotion><analysis>a</analysis><strategy>s</strategy><response>r</response>").missing \
        == ["emotion"]
    dup = "<analysis>a</analysis><analysis>b</analysis><emotion>e</emotion><strategy>s</strategy><response>r</response>"
    assert parse(dup).missing == ["analysis"]
    assert parse("<analysis> </analysis><emotion>e</emotion><strategy>s</strategy><response>r</response>").missing \
        == ["analysis"]
    assert parse("plain reply, no tags").missing == list(PARTS)


@given(st.lists(st.sampled_from(["True", "False"]), min_size=1, max_size=4), _text)
def test_last_verdict_lines_win(labels: list[str], noise: str) -> None:
    # Earlier "Verdict:" lines (e.g. a quoted one) are overridden by the final ones.
    text = f"Verdict: {'False' if labels[0] == 'True' else 'True'}\n{noise}\n" + "\n".join(
        f"Rationale: r{i}\nVerdict: {lab}" for i, lab in enumerate(labels))
    got = parse_verdicts(text, [Kind.STEP] * len(labels))
    assert got == [lab == "True" for lab in labels]


@settings(max_examples=200)
@given(st.text(max_size=200))
def test_parser_never_raises_and_returns_one_slot_per_kind(text: str) -> None:
    got = parse_verdicts(text, [Kind.STEP, Kind.PREFERENCE])
    assert len(got) == 2
    assert got[0] in (None, True, False)
    assert got[1] is None or isinstance(got[1], Preference)


def test_verdict_labels_and_missing_lines() -> None:
    assert parse_verdicts("Rationale: x\nVerdict: both good", [Kind.PREFERENCE]) == [Preference.BOTH_GOOD]
    assert parse_verdicts("Rationale: x\nVerdict: maybe", [Kind.STEP]) == [None]
    assert parse_verdicts("no verdict at all", [Kind.STEP]) == [None]
    # Fewer lines than components: the earliest components are the unparsed ones.
    assert parse_verdicts("Verdict: second", [Kind.STEP, Kind.PREFERENCE]) == [None, Preference.SECOND]
    # A label of the wrong kind does not count.
    assert parse_verdicts("Verdict: True", [Kind.PREFERENCE]) == [None]


def test_reward_rules() -> None:
    assert rewards.step_reward(True) == 1 and rewards.step_reward(False) == -1 and rewards.step_reward(None) is None
    assert rewards.preference_reward(Preference.SECOND) == 1
    assert rewards.preference_reward(Preference.BOTH_GOOD) == 1
    assert rewards.preference_reward(Preference.FIRST) == -1
    assert rewards.preference_reward(Preference.NEITHER) == -1
    assert rewards.format_reward(True) == 1 and rewards.format_reward(False) == -1
    assert rewards.total_reward([1, -1, 1, 1, 1]) == 3
    assert rewards.total_reward([1, None, 1]) is None


def test_reply_mode_rewards_and_total_ranges() -> None:
    from cer.modes import JudgeMode

    reply_only = parse("<response>That sounds hard.</response>")
    r = rewards.candidate_rewards(reply_only, JudgeMode.REPLY, [], None, reply=False)
    assert (r.steps, r.preference, r.format, r.reply, r.total) == ([], None, None, -1.0, -1.0)
    assert rewards.candidate_rewards(reply_only, JudgeMode.REPLY, [], None, reply=None).total is None
    assert rewards.candidate_rewards(parse("no tags"), JudgeMode.REPLY, [], None, reply=True).total == -1.0
    assert [rewards.total_range(m) for m in JudgeMode] == [(-5, 5), (-5, 5), (-4, 4), (-2, 2), (-1, 1)]


def test_taxonomy_aliases() -> None:
    tax = load_taxonomy()
    assert len(tax.names) == 8
    assert tax.normalise("Questions") == "Question"
    assert tax.normalise("direct guidance") == "Providing Suggestions"
    assert tax.normalise("Approval and Reassurance") == "Affirmation and Reassurance"
    assert tax.normalise("Other") == "Others"
    assert tax.normalise("telepathy") is None


def test_favourable_preferences_are_the_positive_reward() -> None:
    from cer.verdicts import FAVOURABLE, favourable

    assert FAVOURABLE == {Preference.SECOND, Preference.BOTH_GOOD}
    for p in Preference:
        assert favourable(p) == (rewards.preference_reward(p) == rewards.PREF_WIN)


def test_tags_are_one_pattern() -> None:
    from cer.reasoning import TAG, strip_tags

    assert {m.group(2) for m in TAG.finditer("<Analysis>a</ANALYSIS><emotion><strategy></response>")} == {
        "Analysis", "ANALYSIS", "emotion", "strategy", "response"}
    assert strip_tags("<analysis>I hear you</analysis> <response>oops") == "I hear you   oops"


def test_modes_are_defined_once() -> None:
    from cer.modes import TRAINED_MODES, JudgeMode, RewardJudgeMode

    assert [m.value for m in JudgeMode] == ["unified", "single_pass", "prm", "orm", "reply"]
    assert TRAINED_MODES == (JudgeMode.UNIFIED, JudgeMode.PRM, JudgeMode.ORM, JudgeMode.REPLY)
    assert RewardJudgeMode.UNIFIED.judge_modes == (JudgeMode.UNIFIED,)
    assert RewardJudgeMode.SINGLE_PASS.judge_modes == (JudgeMode.SINGLE_PASS,)
    assert RewardJudgeMode.PRM_ORM.judge_modes == (JudgeMode.PRM, JudgeMode.ORM)
