"""evaluator: parsers, input formats, metrics, and the ESC / SAGE / gold harnesses on FAKE engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluator import esc_eval, gold, sage
from evaluator.backends import GenParams, Message
from evaluator.inputs import InputError, cards_from_esconv, gold_turns, load_cards, load_profiles
from evaluator.metrics import bleu2, distinct_n, mean_length, rouge_l, strategy_figures, tokenize
from evaluator.prompts import first_message, load_prompts, parse_change, parse_score
from tests.unit.evaluator_fakes import fake_roles, last_user

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"
PROMPTS = load_prompts()
CER = ("<analysis>lonely at university; exploration</analysis><emotion>negative, loneliness, 4</emotion>"
       "<strategy>Reflection of Feelings: she needs to feel heard</strategy><response>That sounds lonely.</response>")


# --- parsers ------------------------------------------------------------------------------------------------
def test_score_parser_reads_only_the_last_score_line_in_range() -> None:
    assert parse_score("Reason: fine.\nScore: 3") == 3
    assert parse_score("Score: 1\nReason: changed my mind\nScore: 4") == 4
    assert parse_score("**Score:** 2/4") == 2
    assert parse_score("Score: 5") is None  # out of the 0-4 scale: unparsed, never clipped
    assert parse_score("I would give it a 3") is None
    assert parse_score("") is None


def test_change_parser_and_first_message() -> None:
    assert parse_change("Analysis: better.\nChange: +7") == 7
    assert parse_change("Change: -12") == -12  # the harness clamps, the parser reports what was said
    assert parse_change("Change: a lot") is None
    assert first_message("Seeker: I feel lost.\nSupporter: I hear you.") == "I feel lost."
    assert first_message("<<< \"I can't sleep.\"") == "I can't sleep."
    assert first_message("   \n") is None


def test_packaged_prompts_have_the_seven_dimensions_with_rubrics() -> None:
    assert [d.name for d in PROMPTS.dimensions] == ["Fluency", "Expression diversity", "Empathy", "Information",
                                                    "Humanoid", "Skill", "Overall"]
    assert all(len(d.rubric) == 5 and d.rubric[0].startswith("0:") for d in PROMPTS.dimensions)


def test_prompts_file_missing_a_key_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("model_system: hi\n")
    with pytest.raises(ValueError, match="missing keys"):
        load_prompts(str(bad))


# --- inputs -------------------------------------------------------------------------------------------------
ESC_EVAL_CARDS = [  # shaped exactly as ESC-Eval's data/card_high_en.json (int ids, Chinese categories)
    {"base": "Age: Not mentioned\nGender: Female\nOccupation: Not mentioned\nProblem: Her partner lied to her.",
     "res": "家庭生活", "source": "ESconv", "base_biaozhu": "年龄：未提及\n性别：女\n职业：未提及\n问题：她的伴侣对她撒谎。",
     "language": "english", "id": 32025},
    {"base": "年龄：20\n性别：男\n职业：学生\n问题：考试压力大。", "res": "工作学习", "source": "SoulChat",
     "base_biaozhu": "年龄：20\n性别：男\n职业：学生\n问题：考试压力大。", "language": "chinese", "id": 7},
]


def test_esc_eval_card_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    path.write_text(json.dumps(ESC_EVAL_CARDS, ensure_ascii=False))
    cards = load_cards(path)
    assert [(c.id, c.language, c.res) for c in cards] == [("32025", "english", "家庭生活"), ("7", "chinese", "工作学习")]
    assert cards[0].persona.startswith("Age: Not mentioned\nGender: Female")
    assert cards[0].to_json()["base_biaozhu"] == ESC_EVAL_CARDS[0]["base_biaozhu"]
    packaged = load_cards()
    assert len(packaged) == 8 and {c.language for c in packaged} == {"english", "chinese"}


@pytest.mark.parametrize("edit, message", [
    ({"language": "french"}, r"\[1\]\.language"),
    ({"id": 32025}, r"\[1\]\.id: duplicate"),
    ({"base": "", "base_biaozhu": "", "language": "english"}, r"\[1\]\.base"),
])
def test_bad_cards_name_the_item_and_field(tmp_path: Path, edit: dict, message: str) -> None:
    path = tmp_path / "cards.json"
    path.write_text(json.dumps([ESC_EVAL_CARDS[0], {**ESC_EVAL_CARDS[1], **edit}], ensure_ascii=False))
    with pytest.raises(InputError, match=message):
        load_cards(path)


def test_sage_profiles_are_read_and_checked(tmp_path: Path) -> None:
    profiles = load_profiles()
    assert len(profiles) == 4 and {p.language for p in profiles} == {"english", "chinese"}
    path = tmp_path / "p.jsonl"
    row = {"id": 3, "player": "Ana, 30", "scene": "lost her job", "main_cha": "calm", "cha_group": ["kind", "shy"],
           "task": "wants to be heard"}
    path.write_text(json.dumps(row) + "\n\n" + json.dumps({**row, "id": 4, "cha_group": "kind"}) + "\n")
    with pytest.raises(InputError, match=r":3\.cha_group"):
        load_profiles(path)
    path.write_text(json.dumps(row) + "\n")
    assert load_profiles(path)[0].cha_group == ("kind", "shy")


def test_cards_and_gold_turns_from_esconv() -> None:
    cards = cards_from_esconv(FIX / "esconv.json")
    data = json.loads((FIX / "esconv.json").read_text())
    assert len(cards) == len(data)
    assert cards[0].res == data[0]["problem_type"] and data[0]["situation"] in cards[0].base
    assert cards[0].base.startswith("Age: Not mentioned\nGender: Not mentioned\nOccupation: Not mentioned\nProblem: ")
    assert len(cards_from_esconv(FIX / "esconv.json", limit=2, seed=1)) == 2
    turns = gold_turns(FIX / "esconv.json")
    assert turns and all(t.history[-1].role.value == "seeker" for t in turns)
    assert turns[0].strategy == "Reflection of Feelings" and turns[0].id == "0-2"


# --- metrics ------------------------------------------------------------------------------------------------
def test_metrics_hand_computed() -> None:
    assert tokenize("I'm FINE, 我很好") == ["i", "'", "m", "fine", ",", "我", "很", "好"]
    # tokens: a b a | a b -> unigrams 5, distinct 2; bigrams (a b)(b a)(a b) -> 3, distinct 2
    assert distinct_n(["a b a", "a b"], 1) == pytest.approx(40.0)
    assert distinct_n(["a b a", "a b"], 2) == pytest.approx(200 / 3)
    assert distinct_n([""], 1) is None
    assert mean_length(["a b a", "a b"]) == 2.5
    assert bleu2(["the cat sat"], ["the cat sat"]) == pytest.approx(100.0)
    # LCS of (a b c d) and (a c d e) is 3: P = R = F = 3/4
    assert rouge_l(["a b c d"], ["a c d e"]) == pytest.approx(75.0)
    acc = strategy_figures(["Question", None, "Information"], ["Question", "Others", "Question"])
    assert acc == {"accuracy": pytest.approx(100 / 3), "n": 3, "unnamed": 1}


def test_bleu2_from_kept_pair_statistics_is_nltks_corpus_bleu() -> None:
    """bleu2 sums per-pair statistics it keeps (so a bootstrap does not count every pair's n-grams again): on ESConv
    turns, random subsets with repeats (a bootstrap's resamples), no match at all and an empty reply, it
    equals NLTK's corpus_bleu (weights 0.5/0.5, smoothing 1) on the same tokens."""
    import random

    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu

    def nltk_bleu2(hyps: list[str], refs: list[str]) -> float:
        return 100.0 * float(corpus_bleu([[tokenize(r)] for r in refs], [tokenize(h) for h in hyps],
                                         weights=(0.5, 0.5), smoothing_function=SmoothingFunction().method1))

    esconv = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder" / "esconv.json"  # five real dialogues
    turns = [u["content"] for d in json.loads(esconv.read_text()) for u in d["dialog"]]
    rng = random.Random(0)
    for _ in range(25):
        idx = [rng.randrange(len(turns) - 1) for _ in range(rng.randrange(1, 30))]
        hyps, refs = [turns[i] for i in idx], [turns[i + 1] for i in idx]
        assert bleu2(hyps, refs) == nltk_bleu2(hyps, refs)
    for hyps, refs in ((["zzz qqq"], ["the cat sat"]), ([""], ["the cat sat"]), (["the the the"], ["the cat"])):
        assert bleu2(hyps, refs) == nltk_bleu2(hyps, refs)


# --- harnesses on fakes -------------------------------------------------------------------------------------
def judge_script(bad_dimension: str | None = None):  # type: ignore[no-untyped-def]
    def script(messages: list[Message], params: GenParams) -> str:
        user = last_user(messages)
        if bad_dimension and f"Dimension: {bad_dimension}\n" in user:
            return "I cannot rate this."
        return "Reason: kind and clear.\nScore: 3" if "Dimension: Empathy" not in user else "Reason: warm.\nScore: 4"
    return script


async def test_esc_dialogue_runs_the_rounds_and_reports_unparsed(tmp_path: Path) -> None:
    roles, engines = fake_roles(lambda m, p: "I hear you.", lambda m, p: "Seeker: I feel alone.",
                                judge_script("Skill"), tmp_path)
    card = load_cards()[0]
    rec = await esc_eval.run_card(card, roles, PROMPTS, esc_eval.EscConfig(rounds=3))
    assert rec["status"] == "ok" and [t["role"] for t in rec["dialogue"]] == ["seeker", "supporter"] * 3
    assert rec["dialogue"][0]["text"] == "I feel alone."
    assert rec["scores"]["Empathy"]["score"] == 4 and rec["scores"]["Fluency"]["reason"] == "kind and clear."
    assert rec["scores"]["Skill"] == {"score": None, "reason": "", "attempts": 3}  # 1 + 2 retries, then unparsed
    assert rec["unparsed"] == ["Skill"]
    # the seeker sees the card in its system prompt, the greeting first and its own turns as assistant
    sim_msgs = engines["simulator"].calls[-1][0]
    assert card.persona in sim_msgs[0]["content"] and sim_msgs[1]["role"] == "user"
    assert [m["role"] for m in sim_msgs[2:]] == ["assistant", "user"] * 2
    # the scorer got the regex (it supports one); the model did not ask for one
    assert engines["scorer"].calls[0][1].regex is not None and engines["model"].calls[0][1].regex is None
    summary = esc_eval.summarise([rec], PROMPTS)
    assert summary["dimensions"]["Skill"] == {"mean": None, "n": 0, "unparsed": 1, "modal_share": None}
    assert summary["dimensions"]["Empathy"]["mean"] == 4 and summary["average_percent"] is None
    assert summary["unparsed_total"] == 1 and summary["replies"]["replies"] == 3


async def test_esc_cer_model_and_failed_simulator(tmp_path: Path) -> None:
    roles, _ = fake_roles(lambda m, p: CER, lambda m, p: "  ", judge_script(), tmp_path)
    rec = await esc_eval.run_card(load_cards()[0], roles, PROMPTS, esc_eval.EscConfig(rounds=2, model_format="cer"))
    assert rec["status"] == "simulator_failed" and rec["scores"] == {}
    roles, engines = fake_roles(lambda m, p: CER, lambda m, p: "I feel alone.", judge_script(), tmp_path / "b")
    rec = await esc_eval.run_card(load_cards()[0], roles, PROMPTS, esc_eval.EscConfig(rounds=1, model_format="cer"))
    reply = rec["dialogue"][1]
    assert reply["text"] == "That sounds lonely." and reply["format_ok"] and reply["strategy"] == "Reflection of Feelings"
    assert "<analysis>" in engines["model"].calls[0][0][0]["content"]  # the CER policy prompt
    summary = esc_eval.summarise([rec], PROMPTS)
    assert summary["average_percent"] == pytest.approx(100 * (6 * 3 + 4) / (7 * 4)) and summary["cer"]["format_ok_rate"] == 100.0


def _scored(empathy: list[int]) -> list[dict]:
    """Finished ESC records scoring Empathy as given and every other dimension 2."""
    return [{"status": "ok", "unparsed": [], "dialogue": [{"role": "supporter", "text": "I hear you."}],
             "scores": {d.name: {"score": e if d.name == "Empathy" else 2} for d in PROMPTS.dimensions}}
            for e in empathy]


def test_a_scorer_that_gives_one_score_everywhere_is_named_in_the_reports(tmp_path: Path) -> None:
    """ESC-Eval's figures are only as good as its scorer: a dimension on which >= 90% of the dialogues got the same
    score cannot tell runs apart, and both reports say so rather than leaving the mean to speak."""
    from evaluator.report import _esc_section

    flat = esc_eval.summarise(_scored([4] * 6), PROMPTS)
    assert flat["dimensions"]["Empathy"]["modal_share"] == 1.0
    assert esc_eval.flat_dimensions(flat) == [d.name for d in PROMPTS.dimensions]  # the 2s everywhere too
    spread = esc_eval.summarise(_scored([4, 4, 4, 4, 4, 3]), PROMPTS)
    assert spread["dimensions"]["Empathy"]["modal_share"] == pytest.approx(5 / 6)
    assert "Empathy" not in esc_eval.flat_dimensions(spread)
    assert esc_eval.flat_dimensions(esc_eval.summarise(_scored([4] * 4), PROMPTS)) == []  # too few to say
    # a summary written before modal_share: a mean at an end of the scale is one score everywhere
    old = {"dimensions": {"Fluency": {"mean": 4.0, "n": 50, "unparsed": 0},
                          "Empathy": {"mean": 0.0, "n": 50, "unparsed": 0},
                          "Skill": {"mean": 3.86, "n": 50, "unparsed": 0}}}
    assert esc_eval.flat_dimensions(old) == ["Fluency", "Empathy"]
    assert esc_eval.flat_note("a", spread) is not None and esc_eval.flat_note("b", {"dimensions": {}}) is None
    section = "\n".join(_esc_section({"flat": flat, "spread": spread}, tmp_path))
    assert "- flat: the scorer gave one score to at least 90% of the dialogues on Fluency, " in section
    assert "- spread: the scorer gave one score to at least 90% of the dialogues on Fluency, Expression" in section
    assert "Empathy" not in section.split("- spread:")[1].splitlines()[0]


def sage_script(changes: list[str]):  # type: ignore[no-untyped-def]
    asked = []

    def script(messages: list[Message], params: GenParams) -> str:  # retries of the last answer repeat it
        if "Change:" in last_user(messages):
            asked.append(1)
            return f"Analysis: noted.\nChange: {changes[min(len(asked), len(changes)) - 1]}"
        return "I am not sure what to do."
    return script


@pytest.mark.parametrize("changes, status, trajectory", [
    (["+10"] * 6, "success", [40, 50, 60, 70, 80, 90, 100]),
    (["-25", "-10", "-10", "-10"], "failure", [40, 30, 20, 10, 0]),  # -25 clamped to -10; 10 is not below 10
    (["+3", "-2"], "max_rounds", [40, 43, 41]),
    (["+3", "lots"], "unparsed", [40, 43]),
])
async def test_sage_emotion_score(tmp_path: Path, changes: list[str], status: str, trajectory: list[int]) -> None:
    roles, engines = fake_roles(lambda m, p: "That sounds hard.", sage_script(changes), judge_script(), tmp_path)
    rec = await sage.run_profile(load_profiles()[0], roles, PROMPTS, sage.SageConfig(max_rounds=len(changes)))
    assert rec["status"] == status and rec["trajectory"] == trajectory
    assert rec["final_score"] == (None if status == "unparsed" else trajectory[-1])
    if status == "failure":
        assert rec["analyses"][0] == {"round": 0, "change": -10, "raw_change": -25, "analysis": "noted."}
    assert not engines["scorer"].calls  # SAGE needs no scorer


async def test_sage_summary_counts(tmp_path: Path) -> None:
    recs = []
    for i, changes in enumerate((["+10"] * 6, ["-10"] * 4, ["x"])):
        roles, _ = fake_roles(lambda m, p: "ok", sage_script(changes), judge_script(), tmp_path / str(i))
        recs.append(await sage.run_profile(load_profiles()[i], roles, PROMPTS, sage.SageConfig(max_rounds=6)))
    s = sage.summarise(recs)
    assert (s["successes"], s["failures"], s["unparsed"], s["scored"]) == (1, 1, 1, 2)
    assert s["mean_final_score"] == pytest.approx((100 + 0) / 2)


async def test_gold_turns_scored_against_references(tmp_path: Path) -> None:
    roles, _ = fake_roles(lambda m, p: CER, lambda m, p: "", judge_script(), tmp_path)
    items = gold_turns(FIX / "esconv.json")[:3]
    recs = [await gold.run_turn(g, roles, PROMPTS, gold.GoldConfig()) for g in items]
    s = gold.summarise(recs, "cer")
    expected = 100 * sum(1 for g in items if g.strategy == "Reflection of Feelings") / sum(1 for g in items if g.strategy)
    assert s["strategy"]["accuracy"] == pytest.approx(expected)
    assert s["bleu_2"] == pytest.approx(bleu2(["That sounds lonely."] * 3, [g.reference for g in items]))
    assert s["format_ok_rate"] == 100.0 and s["answered"] == 3
