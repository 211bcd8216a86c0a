"""A tiny judge SFT set in data_builder's emit schema, rendered with the serving judge's own
``render_judge_chat`` (no second prompt implementation). Imported by the reward_trainer tests; its own test
checks the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.reasoning import CerOutput, parse
from cer.taxonomy import load_taxonomy
from cer.verdicts import Preference
from judge.protocol import load_template, render_judge_chat

_ISSUES = [("exams", "anxious", "I failed my maths exam and my parents will be angry."),
           ("work", "sad", "My manager criticised me in front of everyone today."),
           ("friends", "lonely", "My best friend moved away and I have nobody to talk to."),
           ("sleep", "tired", "I have not slept properly for weeks because of stress.")]
_PREFS = [Preference.SECOND, Preference.FIRST, Preference.BOTH_GOOD, Preference.NEITHER]


def judge_item(i: int) -> dict[str, Any]:
    """One judge item: history, reference, CER candidate and gold labels (every third step label False)."""
    topic, emotion, opening = _ISSUES[i % len(_ISSUES)]
    wrong = i % 3 == 0
    history = [{"role": "seeker", "text": opening}, {"role": "supporter", "text": f"That sounds hard. Tell me more ({i})."},
               {"role": "seeker", "text": f"It is about {topic}, and I keep thinking about it."}]
    cand = CerOutput(
        analysis=f"The seeker's core issue is {topic}; stage: {'action' if wrong else 'exploration'}.",
        emotion=f"negative, {'joyful' if wrong else emotion}, intensity {2 + i % 3}",
        strategy="Question: ask what worries them most." if i % 2 else "Reflection of Feelings: name the feeling.",
        response=f"It sounds like {topic} is weighing on you. What worries you most right now?",
    )
    labels = {"step1": not wrong, "step2": not wrong, "step3": i % 4 != 1, "preference": _PREFS[i % 4].value}
    return {"dialogue_id": f"d{i}", "history": history, "reference": "I am sorry to hear that. How do you feel?",
            "candidate": cand.render(), "labels": labels, "source": "fixture"}


def rows_for(mode: JudgeMode, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the emit schema for ``mode``: ``messages`` = render_judge_chat with the gold verdicts."""
    template, taxonomy = load_template(), load_taxonomy()
    rows = []
    for it in items:
        gold = {k: (v if isinstance(v, bool) else Preference(v)) for k, v in it["labels"].items()}
        turns = [Turn(Role(t["role"]), t["text"]) for t in it["history"]]
        messages = render_judge_chat(template, taxonomy, mode, turns, it["reference"], parse(it["candidate"]), gold,
                                     {c: f"checking {c} against the conversation." for c in gold})
        rows.append({**it, "messages": messages, "mode": mode.value})
    return rows


def write_judge_sft(root: Path, n_train: int = 6, n_heldout: int = 4,
                    modes: tuple[str, ...] = ("unified", "prm", "orm")) -> Path:
    """Save ``root/<mode>/`` DatasetDicts (train / heldout, split by dialogue) and return ``root``."""
    from datasets import Dataset, DatasetDict

    items = [judge_item(i) for i in range(n_train + n_heldout)]
    for mode in modes:
        m = JudgeMode(mode)
        DatasetDict({"train": Dataset.from_list(rows_for(m, items[:n_train])),
                     "heldout": Dataset.from_list(rows_for(m, items[n_train:]))}).save_to_disk(str(root / mode))
    return root


def test_fixture_matches_emit_schema(tmp_path: Path) -> None:
    from reward_trainer.data import REQUIRED_COLUMNS, load_judge_set

    write_judge_sft(tmp_path, 2, 2)
    for mode in ("unified", "prm", "orm"):
        dsd = load_judge_set(tmp_path, mode)
        assert set(REQUIRED_COLUMNS) <= set(dsd["train"].column_names)
        roles = [m["role"] for m in dsd["train"][0]["messages"]]
        assert roles[0] == "system" and roles.count("assistant") == {"unified": 4, "prm": 3, "orm": 1}[mode]
