"""Silver labels by construction and the emitted datasets (columns, judge chats, splits by dialogue, ablation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_from_disk

from cer.modes import JudgeMode
from cer.policy_prompt import policy_messages
from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Preference
from data_builder.cli import main
from data_builder.contrast import POLICY_KINDS
from data_builder.emit import build_grpo_prompts, build_judge_sft, heldout_dialogues, make_ablation_sets
from data_builder.negatives import HACK_KINDS
from data_builder.records import read_jsonl, turns_of
from data_builder.silver import HACK_CANDIDATE, build_silver, load_config, round_intensity, support_stage
from judge.protocol import load_template, render_judge_chat

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"


@pytest.fixture()
def rounds(tmp_path: Path) -> list[dict]:
    assert main(["ingest", "--quiet", "--format", "esconv", "--out", str(tmp_path / "i"), str(FIX / "esconv.json")]) == 0
    assert main(["sample", "--quiet", "--rounds", "5", "--out", str(tmp_path / "s"), str(tmp_path / "i" / "dialogues.jsonl")]) == 0
    return list(read_jsonl(tmp_path / "s" / "rounds.jsonl"))


def test_stage_and_intensity_rules() -> None:
    cfg = load_config()
    assert support_stage("Question", 5, 5, cfg) == "exploration"
    assert support_stage("Providing Suggestions", 1, 5, cfg) == "action"
    assert [support_stage("Others", i, 7, cfg) for i in (1, 4, 7)] == ["exploration", "comforting", "action"]
    assert round_intensity({"initial_intensity": 5, "final_intensity": 1}, 3, 5) == 3
    assert round_intensity({"initial_intensity": 4, "final_intensity": None}, 3, 5) == 4
    assert round_intensity({}, 1, 1) is None


def _cer(items: list[dict]) -> list[dict]:
    return [it for it in items if "step1" in it["labels"]]


def test_silver_false_share_and_labels_match_construction(rounds: list[dict]) -> None:
    tax = load_taxonomy()
    items, counts = build_silver(rounds, tax, load_config(), false_share=0.25, seed=3)
    cer = _cer(items)
    assert len(cer) == len(rounds) and len(items) == counts["items"]
    # a false_share of each step's slots is corrupted; step 3 beside a hack is False besides
    hacked = sum(it["construction"]["pair"] in HACK_CANDIDATE for it in cer)
    assert hacked > 0
    for k, s in enumerate(("step1", "step2", "step3")):
        eligible = len(cer) - (hacked if s == "step3" else 0)
        assert sum(not it["labels"][s] for it in cer) == round(0.25 * eligible) + (hacked if s == "step3" else 0)
    by_round = {(r["dialogue_id"], r["round_index"]): r for r in rounds}
    for it in cer:
        r = by_round[(it["dialogue_id"], it["round_index"])]
        parsed = parse(it["candidate"])
        assert parsed.ok
        for s in ("step1", "step2", "step3"):
            assert it["labels"][s] == (s not in it["construction"]["corrupted"])
        # a true step 3 names the strategy the candidate's reply is annotated with; a false one another, or the
        # round's own beside a hack (which carries out no strategy)
        named = it["construction"]["reply_strategy"] or r["strategy"]
        if it["construction"]["pair"] in HACK_CANDIDATE:
            assert it["construction"]["corrupted"]["step3"] == "no_strategy" and not it["labels"]["step3"]
            assert named in parsed.parts["strategy"] and it["negative"] in HACK_KINDS + POLICY_KINDS
        else:
            assert (named in parsed.parts["strategy"]) == it["labels"]["step3"]
        if it["labels"]["step2"]:
            assert r["meta"]["emotion_type"] in parsed.parts["emotion"]
        pref, pair = it["labels"]["preference"], it["construction"]["pair"]
        if pair.startswith("gold_vs_"):
            assert pref == "first" and it["reference"] == r["reference"] and parsed.response != r["reference"]
        elif pair.endswith("_vs_gold"):
            assert pref == "second" and parsed.response == r["reference"] and it["reference"] != r["reference"]
        elif pair in ("off_vs_off", "off_vs_hack"):
            assert pref == "neither" and r["reference"] not in (it["reference"], parsed.response)
        else:
            assert pair == "continuation" and pref == "both_good"
        if pair in ("gold_vs_other_round", "other_round_vs_gold"):  # the reply of another round, same dialogue
            other = parsed.response if pair.startswith("gold") else it["reference"]
            assert other in {x["reference"] for x in rounds if x["dialogue_id"] == r["dialogue_id"]} - {r["reference"]}
        if it["lang"] == "zh":
            assert all("\u4e00" <= ch <= "\u9fff" for ch in parsed.response[:1])
    # two reply items per round on the same conversation: the real reply (True) and one that belongs elsewhere
    replies = [it for it in items if "reply" in it["labels"]]
    assert sum(it["labels"]["reply"] for it in replies) == len(rounds)
    for it in replies:
        r = by_round[(it["dialogue_id"], it["round_index"])]
        assert (parse(it["candidate"]).response == r["reference"]) == it["labels"]["reply"]
    # reproducible; the share and the reply items are configurable
    assert build_silver(rounds, tax, load_config(), 0.25, seed=3)[0] == items
    none_false, _ = build_silver(rounds, tax, load_config(), 0.0, seed=3, reply_items=False)
    assert all(it["labels"]["step1"] and it["labels"]["step2"] for it in none_false)
    assert all(it["labels"]["step3"] == (it["construction"]["pair"] not in HACK_CANDIDATE) for it in none_false)
    with pytest.raises(ValueError):
        build_silver(rounds, tax, load_config(), 1.5)


def test_wording_varies_independently_of_the_label(rounds: list[dict]) -> None:
    """Each step's phrasing is drawn for true and false steps alike: no phrasing only ever carries one label."""
    items, _ = build_silver(rounds * 6, load_taxonomy(), load_config(), false_share=0.4, seed=5, reply_items=False)
    cfg = load_config()
    openings = {p.split("{")[0] for p in cfg.templates["en"]["emotion"]}
    seen: dict[str, set[bool]] = {}
    for it in items:
        if it["lang"] != "en":
            continue
        text = parse(it["candidate"]).parts["emotion"]
        opening = max((o for o in openings if text.startswith(o)), key=len)
        seen.setdefault(opening, set()).add(it["labels"]["step2"])
    assert len(seen) >= 3 and all(labels == {True, False} for labels in seen.values())


def test_hard_negatives_from_dialogue_pools(tmp_path: Path) -> None:
    """With the dialogues given, a corrupted step 1 takes the situation of another dialogue with the same problem
    type, and continuation pairs come from the same supporter block."""
    d = [{"record": "dialogue", "id": f"d{i}", "lang": "en",
          "meta": {"problem_type": "job crisis", "situation": f"situation number {i}", "emotion_type": "anxiety"},
          "turns": [{"role": "seeker", "text": f"hello {i}"}, {"role": "supporter", "text": f"hi {i}", "strategy": "Question"},
                    {"role": "seeker", "text": f"I lost my job {i}"},
                    {"role": "supporter", "text": f"that is hard {i}", "strategy": "Reflection of Feelings"},
                    {"role": "supporter", "text": f"what happened {i}", "strategy": "Question"},
                    {"role": "seeker", "text": f"my boss {i}"},
                    {"role": "supporter", "text": f"try talking {i}", "strategy": "Providing Suggestions"},
                    {"role": "seeker", "text": f"ok {i}"},
                    {"role": "supporter", "text": f"good luck {i}", "strategy": "Others"}]} for i in range(6)]
    from data_builder.sample import make_round, rounds_of

    rounds = [make_round(x, rounds_of(x["turns"]), k) for x in d for k in range(1, 5)]
    items, counts = build_silver(rounds, load_taxonomy(), load_config(), false_share=1.0, seed=0, dialogues=d)
    cer = _cer(items)
    for it in cer:
        if it["construction"]["corrupted"].get("step1") == "similar_problem":
            analysis = parse(it["candidate"]).parts["analysis"]
            own = it["dialogue_id"][1:]
            assert "job crisis" in analysis and f"situation number {own}" not in analysis and "situation number" in analysis
    assert counts["corrupted_step1_similar_problem"] > 0 and counts["pair_continuation"] > 0
    cont = [it for it in cer if it["construction"]["pair"] == "continuation"]
    assert all({it["reference"], parse(it["candidate"]).response} == {f"that is hard {it['dialogue_id'][1:]}",
                                                                      f"what happened {it['dialogue_id'][1:]}"}
               for it in cont)


def test_silver_skips_rounds_without_gold(rounds: list[dict]) -> None:
    broken = [{**rounds[0], "strategy": None}, {**rounds[1], "meta": {**rounds[1]["meta"], "emotion_type": ""}}]
    items, counts = build_silver(broken + rounds[2:], load_taxonomy(), load_config(), reply_items=False)
    assert counts["skipped_no_strategy"] == 1 and counts["skipped_no_emotion"] == 1
    assert len(items) == len(rounds) - 2


def test_emit_columns_messages_and_dialogue_split(tmp_path: Path, rounds: list[dict]) -> None:
    items, _ = build_silver(rounds, load_taxonomy(), load_config(), seed=1, reply_items=False)
    persona = [{**it, "dialogue_id": it["dialogue_id"] + "#persona", "source": "persona"} for it in items]
    from data_builder.records import write_jsonl
    write_jsonl(tmp_path / "items.jsonl", items + persona)
    write_jsonl(tmp_path / "rounds.jsonl", rounds)
    out = tmp_path / "emit"
    assert main(["emit", "--quiet", "--heldout-fraction", "0.4", "--out", str(out), str(tmp_path / "items.jsonl"),
                 str(tmp_path / "rounds.jsonl")]) == 0
    template, tax = load_template(), load_taxonomy()
    held = set(json.loads((out / "heldout_dialogues.json").read_text()))
    assert len(held) == 2
    for mode in ("unified", "prm", "orm"):
        dd = load_from_disk(str(out / "judge_sft" / mode))
        assert set(dd) == {"train", "heldout"}
        assert dd["train"].column_names == ["messages", "dialogue_id", "history", "reference", "candidate", "labels",
                                            "mode", "source", "negative"]
        assert len(dd["train"]) + len(dd["heldout"]) == 2 * len(items)
        train_ids = {d.split("#")[0] for d in dd["train"]["dialogue_id"]}
        held_ids = {d.split("#")[0] for d in dd["heldout"]["dialogue_id"]}
        assert not train_ids & held_ids and held_ids == held
        row = dd["train"][0]
        verdicts = {**{s: row["labels"][s] for s in ("step1", "step2", "step3")},
                    "preference": Preference(row["labels"]["preference"])}
        src = next(it for it in items + persona if it["dialogue_id"] == row["dialogue_id"] and it["candidate"] == row["candidate"])
        expected = render_judge_chat(template, tax, JudgeMode(mode), turns_of(row["history"]), row["reference"],
                                     parse(row["candidate"]), verdicts, src["rationales"])
        assert row["messages"] == expected and row["mode"] == mode
        n_assistant = sum(m["role"] == "assistant" for m in row["messages"])
        assert n_assistant == {"unified": 4, "prm": 3, "orm": 1}[mode]
    g = load_from_disk(str(out / "grpo_prompts"))
    assert g["train"].column_names == ["dialogue_id", "history", "reference", "prompt"]
    r = g["train"][0]
    assert r["history"][-1]["role"] == "seeker" and r["prompt"] == policy_messages(turns_of(r["history"]))
    assert set(g["heldout"]["dialogue_id"]) <= held and not set(g["train"]["dialogue_id"]) & held


def test_heldout_is_stable_and_python_api(rounds: list[dict]) -> None:
    ids = [f"d{i}" for i in range(50)]
    h = heldout_dialogues(ids, 0.2, seed=0)
    assert len(h) == 10 and h == heldout_dialogues(list(reversed(ids)), 0.2, seed=0)
    assert heldout_dialogues(["a", "b"], 0.1) and heldout_dialogues(["a"], 0.1) == set()
    items, _ = build_silver(rounds, load_taxonomy(), load_config(), seed=1, reply_items=False)
    sets = build_judge_sft(items, modes=["unified"], heldout_fraction=0.2)
    assert len(sets["unified"]["train"]) + len(sets["unified"]["heldout"]) == len(items)
    empty = build_grpo_prompts([], heldout_fraction=0.2)
    assert len(empty["train"]) == 0 and empty["train"].column_names == ["dialogue_id", "history", "reference", "prompt"]


def test_ablation_sets_equal_size(rounds: list[dict]) -> None:
    items, _ = build_silver(rounds, load_taxonomy(), load_config(), seed=1)
    rw = [{**it, "dialogue_id": it["dialogue_id"] + "#rewrite", "source": "rewrite"} for it in items]
    pe = [{**it, "dialogue_id": it["dialogue_id"] + "#persona", "source": "persona"} for it in items]
    sets = make_ablation_sets(items, rw, pe, n_extra=6, modes=["prm"], heldout_fraction=0.2, seed=0)
    sizes = {k: len(v["prm"]["train"]) for k, v in sets.items()}
    assert len(set(sizes.values())) == 1
    held = [sorted(v["prm"]["heldout"]["candidate"]) for v in sets.values()]
    assert held[0] == held[1] == held[2]
    assert sets["D"]["prm"]["train"]["source"].count("duplicate") == 6
    assert sets["R"]["prm"]["train"]["source"].count("rewrite") == 6
    assert sets["P"]["prm"]["train"]["source"].count("persona") == 6
    heldout_bases = {d for d in sets["P"]["prm"]["heldout"]["dialogue_id"]}
    assert not {d.split("#")[0] for d in sets["P"]["prm"]["train"]["dialogue_id"]} & heldout_bases
    with pytest.raises(ValueError):
        make_ablation_sets(items, rw[:1], pe, n_extra=5)


def test_corruptions_stay_in_language_and_unknown_emotions_go_positive(rounds: list[dict]) -> None:
    odd = [{**r, "meta": {**r["meta"], "emotion_type": "wistful"}} for r in rounds]
    items, _ = build_silver(odd, load_taxonomy(), load_config(), false_share=1.0, seed=2, reply_items=False)
    cfg = load_config()
    positives = {n for pair in cfg.positive for n in pair}
    for it in items:
        emo = parse(it["candidate"]).parts["emotion"]
        assert any(p in emo for p in positives)
        if it["construction"]["corrupted"]["step1"] == "other_problem":
            analysis = parse(it["candidate"]).parts["analysis"]
            same_lang = {r["meta"]["problem_type"] for r in rounds if r["lang"] == it["lang"]}
            assert any(p in analysis for p in same_lang)
            if it["lang"] == "en":
                assert not any("\u4e00" <= ch <= "\u9fff" for ch in analysis)
