"""Pools of supporter replies and situations that the silver and contrast stages draw their negatives from.

A *reply* is the first supporter turn of a round (as :mod:`data_builder.sample` defines rounds), with its annotated
strategy; its *continuation* is the next turn when the supporter went on in the same block. Built from dialogue
records when given (every round of every dialogue), otherwise from the round records alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from data_builder.records import Record
from data_builder.sample import rounds_of


@dataclass(frozen=True)
class Reply:
    """A supporter turn somewhere in the corpus."""

    dialogue_id: str
    round_index: int
    text: str
    strategy: str | None


@dataclass
class Pools:
    """Replies by dialogue, continuations, and dialogues by language and problem type."""

    by_dialogue: dict[str, list[Reply]] = field(default_factory=dict)
    continuation: dict[tuple[str, int], Reply] = field(default_factory=dict)
    by_problem: dict[tuple[str, str], list[Reply]] = field(default_factory=dict)
    by_lang: dict[str, list[Reply]] = field(default_factory=dict)
    situations: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)

    def other_rounds(self, dialogue_id: str, round_index: int, gold: str, min_distance: int) -> list[Reply]:
        """Replies of the same dialogue at least ``min_distance`` rounds away whose text differs from ``gold``."""
        return [x for x in self.by_dialogue.get(dialogue_id, [])
                if abs(x.round_index - round_index) >= min_distance and x.text.strip() != gold.strip()]

    def other_dialogue_replies(self, dialogue_id: str, lang: str, problem: str | None) -> list[Reply]:
        """Replies of other dialogues of the language, of the same problem type when there are any."""
        same = [x for x in self.by_problem.get((lang, problem or ""), []) if x.dialogue_id != dialogue_id]
        return same or [x for x in self.by_lang.get(lang, []) if x.dialogue_id != dialogue_id]

    def similar_situations(self, dialogue_id: str, lang: str, problem: str, situation: str) -> list[str]:
        """Situations of other dialogues with the same problem type and another situation text."""
        return sorted({s for d, s in self.situations.get((lang, problem), [])
                       if d != dialogue_id and s and s != situation})

    def problems(self, lang: str) -> list[str]:
        """The problem types seen in a language."""
        return sorted(p for (lg, p) in self.situations if lg == lang and p)


def build_pools(rounds: list[Record], dialogues: list[Record]) -> Pools:
    """Pools from ``dialogues`` (all their rounds) or, when there are none, from ``rounds``."""
    pools = Pools()
    info: dict[str, tuple[str, str, str]] = {}  # dialogue id -> (lang, problem type, situation)
    by_dialogue: dict[str, list[Reply]] = defaultdict(list)
    if dialogues:
        for d in dialogues:
            meta = d.get("meta", {})
            info[d["id"]] = (d.get("lang", "en"), str(meta.get("problem_type") or "").strip(),
                             " ".join(str(meta.get("situation") or "").split()))
            turns = d["turns"]
            for k, j in enumerate(rounds_of(turns), start=1):
                by_dialogue[d["id"]].append(Reply(d["id"], k, turns[j]["text"], turns[j].get("strategy")))
                if j + 1 < len(turns) and turns[j + 1]["role"] == "supporter":
                    nxt = turns[j + 1]
                    pools.continuation[(d["id"], k)] = Reply(d["id"], k, nxt["text"], nxt.get("strategy"))
    else:
        for r in rounds:
            meta = r.get("meta", {})
            info[r["dialogue_id"]] = (r.get("lang", "en"), str(meta.get("problem_type") or "").strip(),
                                      " ".join(str(meta.get("situation") or "").split()))
            by_dialogue[r["dialogue_id"]].append(Reply(r["dialogue_id"], r["round_index"], r["reference"],
                                                       r.get("strategy")))
    pools.by_dialogue = dict(by_dialogue)
    by_problem: dict[tuple[str, str], list[Reply]] = defaultdict(list)
    by_lang: dict[str, list[Reply]] = defaultdict(list)
    situations: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for did, (lang, problem, situation) in sorted(info.items()):
        replies = pools.by_dialogue.get(did, [])
        by_problem[(lang, problem)].extend(replies)
        by_lang[lang].extend(replies)
        situations[(lang, problem)].append((did, situation))
    pools.by_problem, pools.by_lang, pools.situations = dict(by_problem), dict(by_lang), dict(situations)
    return pools
