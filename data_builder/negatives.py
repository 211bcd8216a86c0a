"""Replies a policy writes to game the judge ("hacks"), as negatives for the judge's training and evaluation data.

Four kinds (:data:`HACK_KINDS`), built by rule from ``silver.yaml`` ``negative_replies`` or taken from what policies
really wrote (``compeer-data policy-negatives``, :mod:`data_builder.policy_negatives`):

- ``degenerate``: a fragment a policy really writes (a support-stage label such as "I would place this in the
  comforting stage.", "Okay.", the judge's own rationale words, an empty-ish reply) or the real reply cut off
  mid-sentence (rule ``truncated``);
- ``generic``: a one-size-fits-all empathy template that ignores the conversation;
- ``dismissive``: a dismissive or blaming reply;
- ``echo``: the seeker's last sentence given back, verbatim or lightly wrapped.

Every rule-made text comes from one of two disjoint pools (:data:`data_builder.silver_text.REPLY_POOLS`): ``train``
for the training items, ``eval`` for the evaluation items (silver on valid, contrast groups), so a judge cannot do
well on valid by memorising the training templates. None of these replies carries out a support strategy: a step 3
naming one beside them is False. Policy-made ones are kinds prefixed ``policy_`` and keep where they came from.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cer.taxonomy import Taxonomy
from data_builder.records import Record, read_jsonl
from data_builder.silver_text import SilverConfig, pick

HACK_KINDS: tuple[str, ...] = ("degenerate", "generic", "dismissive", "echo")
POLICY_PREFIX = "policy_"
#: a policy-made reply that names (and carries out) a strategy of another support stage than its round's; only ever
#: used on its own prompt (:meth:`HackMaker.misfit`), never built by rule
POLICY_MISFIT = POLICY_PREFIX + "misfit"
POLICY_NEGATIVE = "policy_negative"
#: pool -> (prompt splits whose policy texts may be used on their own prompt, splits whose conversation-free texts
#: may be used detached on any round). ESConv's GRPO logs hold no completion texts, so training may use the texts
#: policies wrote on valid prompts only detached from their conversations, and only those sharing no content word
#: with them (docs/data_builder.md).
POLICY_SPLITS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "train": (frozenset({"train"}), frozenset({"train", "valid"})),
    "eval": (frozenset({"valid"}), frozenset({"valid"})),
}
WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
SENTENCE = re.compile(r"[^.!?。！？]+[.!?。！？]*")
END_PUNCT = ".!?。！？…\"'”’)"
MIN_TRUNCATE_WORDS = 6
MAX_ECHO_WORDS = 25


@dataclass(frozen=True)
class Negative:
    """A negative reply: its kind, text, the rule that made or marked it, and where a policy-made one came from."""

    kind: str
    text: str
    rule: str
    source: str  # "rule" | "policy"
    origin: dict[str, Any] = field(default_factory=dict)

    def meta(self) -> dict[str, Any]:
        """The record of this negative kept in an item's or a group's metadata (no conversation text)."""
        return {"kind": self.kind, "source": self.source, "rule": self.rule, **self.origin}


def words(text: str) -> list[str]:
    """The words of a text, in lower case (letters, with inner apostrophes)."""
    return [w.lower().replace("’", "'") for w in WORD.findall(text)]


def content_words(text: str, stopwords: frozenset[str]) -> set[str]:
    """Words of three letters or more that are not stop words (what ties a reply to a conversation)."""
    return {w for w in words(text) if len(w) >= 3 and w not in stopwords}


def sentences(text: str) -> list[str]:
    """The sentences of a text (split after end punctuation), stripped, empty ones dropped."""
    return [s.strip() for s in SENTENCE.findall(text) if s.strip()]


def normalise(text: str) -> str:
    """Lower case words joined by single spaces: how texts are compared (punctuation and case ignored)."""
    return " ".join(words(text)) or text.strip()


def seeker_echo(history: list[dict[str, Any]], lang: str) -> str | None:
    """The seeker's last sentence of at least three words (or the whole last turn), cut to 25 words; None without a
    seeker turn."""
    last = next((t["text"] for t in reversed(history) if t["role"] == "seeker" and t["text"].strip()), None)
    if last is None:
        return None
    parts = sentences(last)
    long = [s for s in parts if (len(s) >= 6 if lang == "zh" else len(s.split()) >= 3)]
    chosen = (long or parts or [last.strip()])[-1]
    return " ".join(chosen.split()[:MAX_ECHO_WORDS])


def truncate(text: str, lang: str, rng: random.Random) -> str | None:
    """``text`` cut off mid-sentence after 25-60% of its words (characters for Chinese), end punctuation removed;
    None when it is too short to cut."""
    units = text.split() if lang != "zh" else list(text.strip())
    joiner = " " if lang != "zh" else ""
    if len(units) < MIN_TRUNCATE_WORDS:
        return None
    k = rng.randint(max(2, len(units) // 4), max(2, (3 * len(units)) // 5))
    cut = joiner.join(units[:k]).rstrip(" ,;:-" + END_PUNCT + "，；：")
    return cut if cut and cut != text.strip() else None


def _lower_first(text: str) -> str:
    first = text.split(" ", 1)[0]
    return text if first == "I" or first.startswith("I'") else text[:1].lower() + text[1:]


@dataclass
class PolicyPool:
    """Policy-made negative replies (``compeer-data policy-negatives`` output), by prompt and by kind."""

    records: list[Record]
    by_prompt: dict[tuple[str, int, str], list[Record]] = field(default_factory=dict)
    by_kind: dict[str, list[Record]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by_prompt: dict[tuple[str, int, str], list[Record]] = defaultdict(list)
        by_kind: dict[str, list[Record]] = defaultdict(list)
        for rec in self.records:
            by_prompt[(rec["dialogue_id"], int(rec["round_index"]), rec["kind"])].append(rec)
            by_kind[rec["kind"]].append(rec)
        self.by_prompt, self.by_kind = dict(by_prompt), dict(by_kind)

    @classmethod
    def load(cls, paths: list[str | Path]) -> PolicyPool:
        """The ``policy_negative`` records of JSONL files."""
        return cls([rec for p in paths for rec in read_jsonl(p) if rec.get("record") == POLICY_NEGATIVE])

    def same_prompt(self, dialogue_id: str, round_index: int, kind: str, splits: frozenset[str]) -> list[Record]:
        """Texts of ``kind`` a policy wrote on this very prompt, when the prompt is of one of ``splits``."""
        return [x for x in self.by_prompt.get((dialogue_id, round_index, kind), []) if x["split"] in splits]

    def detached(self, kind: str, splits: frozenset[str]) -> list[Record]:
        """Conversation-free texts of ``kind`` (no content word of their own conversation) written on prompts of
        ``splits``: usable beside any conversation."""
        return [x for x in self.by_kind.get(kind, []) if x["split"] in splits and x["conversation_free"]]


@dataclass
class HackMaker:
    """Builds hacks for rounds from one pool (``train`` | ``eval``) and, optionally, policy-made texts."""

    cfg: SilverConfig
    taxonomy: Taxonomy
    pool: str
    policy: PolicyPool | None = None

    def rule_made(self, kind: str, r: Record, stage: str, rng: random.Random) -> Negative | None:
        """A rule-made hack of ``kind`` for round ``r`` (whose support stage is ``stage``); None when it cannot be
        built (no text in the pool, no seeker sentence to echo)."""
        lang = r.get("lang", "en")
        texts = self.cfg.hack_texts(lang, kind, self.pool)
        if kind == "degenerate":
            cut = truncate(r["reference"], lang, rng)
            rule = pick(self.cfg.degenerate_rules, {"fragment"} | ({"truncated"} if cut else set()), rng)
            if rule == "truncated" and cut:
                return Negative(kind, cut, "truncated", "rule")
        echo = seeker_echo(r["history"], lang) if kind == "echo" else ""
        if not texts or echo is None:
            return None
        local = self.cfg.templates.get(lang, self.cfg.templates["en"])["stages"].get(stage, stage)
        text = rng.choice(texts).format(stage=local, Stage=local[:1].upper() + local[1:],
                                        strategy=rng.choice(self.taxonomy.names), echo=echo,
                                        echo_lc=_lower_first(echo))
        return Negative(kind, text, {"degenerate": "fragment", "echo": "wrapped"}.get(kind, "template"), "rule")

    def policy_made(self, kind: str, r: Record, rng: random.Random) -> Negative | None:
        """A policy-made hack of ``kind``: one written on this prompt if any, else a conversation-free one written
        elsewhere (by :data:`POLICY_SPLITS` of the pool); None without one."""
        if self.policy is None:
            return None
        own, detached = POLICY_SPLITS[self.pool]
        same = self.policy.same_prompt(r["dialogue_id"], r["round_index"], kind, own)
        found = same or self.policy.detached(kind, detached)
        if not found:
            return None
        rec = rng.choice(found)
        origin: dict[str, Any] = {k: rec[k] for k in ("run", "policy", "prompt_id", "split") if k in rec}
        return Negative(POLICY_PREFIX + kind, rec["text"], rec["rule"], "policy", {**origin, "same_prompt": bool(same)})

    def misfit(self, r: Record, rng: random.Random, share: float = 1.0) -> Negative | None:
        """With probability ``share``, a policy-made ``misfit`` reply written on this very prompt (of the pool's own
        splits), its ``origin`` naming the ``strategy`` it carries out; None without one (and then ``rng`` is not
        drawn from, so the rounds of prompts without one are built as without the policy's file)."""
        if self.policy is None:
            return None
        found = self.policy.same_prompt(r["dialogue_id"], r["round_index"], POLICY_MISFIT.removeprefix(POLICY_PREFIX),
                                        POLICY_SPLITS[self.pool][0])
        if not found or (share < 1.0 and rng.random() >= share):
            return None
        rec = rng.choice(found)
        origin: dict[str, Any] = {k: rec[k] for k in ("run", "policy", "prompt_id", "split", "strategy") if k in rec}
        return Negative(POLICY_MISFIT, rec["text"], rec["rule"], "policy", {**origin, "same_prompt": True})

    def draw(self, r: Record, stage: str, rng: random.Random) -> Negative | None:
        """A hack for round ``r``: the kind by ``hacks`` weights, policy-made with probability ``policy_share`` when
        one is available, else rule-made; None when no kind can be built."""
        for _ in range(len(self.cfg.hacks)):
            kind = pick(self.cfg.hacks, set(HACK_KINDS), rng)
            if kind is None:
                return None
            if rng.random() < self.cfg.policy_share and (neg := self.policy_made(kind, r, rng)):
                return neg
            if neg := self.rule_made(kind, r, stage, rng):
                return neg
        return None
