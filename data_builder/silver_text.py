"""The silver stage's configuration (``data/silver.yaml``) and its wording: step texts and judge rationales.

Every part has several phrasings, picked at random per item for true and corrupted steps alike, so a judge cannot
tell a label from the wording. The tables (stages, emotion families, negative kinds and their weights, preference
pair weights) are configuration, not code.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cer.taxonomy import Taxonomy

EmotionEntry = tuple[str, str]  # (English name, Chinese name)
#: The two disjoint pools of rule-made hack texts: ``train`` for training items, ``eval`` for evaluation items.
REPLY_POOLS: tuple[str, ...] = ("train", "eval")


@dataclass(frozen=True)
class LabellerRules:
    """The thresholds and word lists of the policy-hack labeller (``silver.yaml`` ``policy_labeller``)."""

    stage_nouns: tuple[str, ...]
    judge_markers: tuple[str, ...]
    min_repeat_sentence_words: int
    min_truncated_words: int
    min_echo_words: int
    echo_share: float
    max_short_words: int
    min_repeat_prompts: int
    dismissive_patterns: tuple[str, ...]
    stopwords: frozenset[str]


@dataclass(frozen=True)
class SilverConfig:
    """The construction tables of ``silver.yaml``."""

    strategy_stage: dict[str, str]
    families: dict[str, list[EmotionEntry]]
    positive: list[EmotionEntry]
    negatives: dict[str, dict[str, float]]
    preference: dict[str, float]
    min_round_distance: int
    reply: dict[str, float]
    templates: dict[str, dict[str, Any]]
    rationales: dict[str, list[str]]
    hacks: dict[str, float]
    degenerate_rules: dict[str, float]
    policy_share: float
    #: the share of rounds with a policy-made ``misfit`` reply on their own prompt whose preference pair is the real
    #: reply against it (:meth:`data_builder.negatives.HackMaker.misfit`)
    misfit_share: float
    #: language -> hack kind -> pool (``train`` | ``eval``) -> texts
    negative_replies: dict[str, dict[str, dict[str, list[str]]]]
    labeller: LabellerRules

    def hack_texts(self, lang: str, kind: str, pool: str) -> list[str]:
        """The rule-made texts of a hack kind in a language (English when it has none) and pool."""
        if pool not in REPLY_POOLS:
            raise ValueError(f"reply pool {pool!r}: expected one of {', '.join(REPLY_POOLS)}")
        by_kind = self.negative_replies.get(lang) or self.negative_replies["en"]
        return list(by_kind.get(kind, {}).get(pool, []))

    def emotion_entry(self, name: str) -> tuple[str | None, EmotionEntry | None]:
        """(family, (en, zh)) of an emotion name in either language; (None, None) when unknown."""
        key = name.strip().lower()
        for fam, entries in self.families.items():
            for en, zh in entries:
                if key in (en.lower(), zh):
                    return fam, (en, zh)
        for en, zh in self.positive:
            if key in (en.lower(), zh):
                return "positive", (en, zh)
        return None, None


def _weights(data: Any, what: str) -> dict[str, float]:
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{what}: a mapping of kind -> weight")
    out = {str(k): float(v) for k, v in data.items()}
    if min(out.values()) < 0 or sum(out.values()) <= 0:
        raise ValueError(f"{what}: weights must be >= 0 and not all 0")
    return out


def _phrasings(value: Any) -> list[str]:
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def _labeller(data: Mapping[str, Any]) -> LabellerRules:
    return LabellerRules(
        stage_nouns=tuple(str(x) for x in data["stage_nouns"]),
        judge_markers=tuple(str(x) for x in data["judge_markers"]),
        min_repeat_sentence_words=int(data["min_repeat_sentence_words"]),
        min_truncated_words=int(data["min_truncated_words"]), min_echo_words=int(data["min_echo_words"]),
        echo_share=float(data["echo_share"]), max_short_words=int(data["max_short_words"]),
        min_repeat_prompts=int(data["min_repeat_prompts"]),
        dismissive_patterns=tuple(str(x) for x in data["dismissive_patterns"]),
        stopwords=frozenset(str(x).lower() for x in data["stopwords"]))


@lru_cache(maxsize=4)
def load_config(path: str | None = None) -> SilverConfig:
    """Load ``silver.yaml`` (the packaged one when ``path`` is None)."""
    text = (Path(path).read_text(encoding="utf-8") if path else
            resources.files("data_builder").joinpath("data/silver.yaml").read_text(encoding="utf-8"))
    data = yaml.safe_load(text)
    for share in ("policy_share", "misfit_share"):
        if not 0.0 <= float(data.get(share, 0.0)) <= 1.0:
            raise ValueError(f"silver config {path or 'default'}: {share} must be within [0, 1]")
    try:
        templates = {lang: {k: (v if k in ("sentiments", "stages") else _phrasings(v)) for k, v in t.items()}
                     for lang, t in data["templates"].items()}
        return SilverConfig(
            strategy_stage=dict(data["strategy_stage"]),
            families={k: [(str(e[0]), str(e[1])) for e in v] for k, v in data["emotion_families"].items()},
            positive=[(str(e[0]), str(e[1])) for e in data["positive_emotions"]],
            negatives={step: _weights(w, f"negatives.{step}") for step, w in data["negatives"].items()},
            preference=_weights(data["preference"], "preference"),
            min_round_distance=int(data.get("min_round_distance", 2)),
            reply=_weights(data["reply"], "reply"),
            templates=templates,
            rationales={k: _phrasings(v) for k, v in data["rationales"].items()},
            hacks=_weights(data["hacks"], "hacks"),
            degenerate_rules=_weights(data["degenerate_rules"], "degenerate_rules"),
            policy_share=float(data.get("policy_share", 0.0)),
            misfit_share=float(data.get("misfit_share", 0.0)),
            negative_replies={lang: {kind: {pool: _phrasings(texts[pool]) for pool in REPLY_POOLS}
                                     for kind, texts in kinds.items()}
                              for lang, kinds in data["negative_replies"].items()},
            labeller=_labeller(data["policy_labeller"]),
        )
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"silver config {path or 'default'}: malformed ({exc})") from exc


@dataclass
class Facts:
    """What the steps of one round state (true or corrupted)."""

    problem: str
    situation: str
    stage: str
    sentiment: str
    emotion: str
    intensity: int | None
    strategy: str


def render_steps(f: Facts, lang: str, taxonomy: Taxonomy, cfg: SilverConfig, rng: random.Random) -> dict[str, str]:
    """The three step texts of ``f`` in ``lang`` (``en`` or ``zh``), each in a phrasing drawn from ``rng``."""
    t = cfg.templates.get(lang, cfg.templates["en"])
    desc = {s.name: s.description for s in taxonomy.strategies}.get(f.strategy, "")
    # the phrasings put their own punctuation after a situation or a description
    situation = rng.choice(t["situation"]).format(situation=f.situation.rstrip(" .。")) if f.situation else ""
    analysis = rng.choice(t["analysis"]).format(problem=f.problem, situation=situation,
                                                stage=t["stages"].get(f.stage, f.stage))
    sentiment = t["sentiments"].get(f.sentiment, f.sentiment)
    if f.intensity is not None:
        emotion = rng.choice(t["emotion"]).format(sentiment=sentiment, emotion=f.emotion, intensity=f.intensity)
    else:
        emotion = rng.choice(t["emotion_no_intensity"]).format(sentiment=sentiment, emotion=f.emotion)
    strategy = rng.choice(t["strategy"]).format(strategy=f.strategy, description=desc,
                                                description_lc=desc[:1].lower() + desc[1:].rstrip("."))
    return {"analysis": analysis, "emotion": emotion, "strategy": strategy}


@dataclass(frozen=True)
class RationaleFields:
    """What a rationale phrasing may name (``{field}``), filled by the silver stage for every item: the one list of
    them (:data:`RATIONALE_FIELDS`). ``stage``, ``emotion`` and ``strategy`` are what the candidate shows (perhaps
    corrupted), ``gold_*`` the round's annotation, ``reply_strategy`` the strategy the candidate's reply carries out."""

    problem: str
    stage: str
    gold_stage: str
    emotion: str
    gold_emotion: str
    strategy: str
    reply_strategy: str

    @classmethod
    def of(cls, gold: Facts, shown: Facts, reply_strategy: str) -> RationaleFields:
        """The fields of an item whose round is ``gold`` and whose candidate shows ``shown``."""
        return cls(problem=gold.problem, stage=shown.stage, gold_stage=gold.stage, emotion=shown.emotion,
                   gold_emotion=gold.emotion, strategy=shown.strategy, reply_strategy=reply_strategy)


#: the names of :class:`RationaleFields`
RATIONALE_FIELDS = tuple(f.name for f in dataclass_fields(RationaleFields))


def with_rationales(cfg: SilverConfig, path: str) -> SilverConfig:
    """``cfg`` with some ``rationales`` entries replaced by those of the YAML mapping at ``path`` (``key: phrasing``
    or ``key: [phrasings]``), e.g. for a judge trained on other rationale wording. A key the config does not have, or
    a phrasing naming a field outside :data:`RATIONALE_FIELDS`, is a ValueError naming it."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not data:
        raise ValueError(f"rationales {path}: expected a non-empty mapping of rationale keys to phrasings")
    dummy = {f: f"<{f}>" for f in RATIONALE_FIELDS}
    out: dict[str, list[str]] = {}
    for key, value in data.items():
        if key not in cfg.rationales:
            raise ValueError(f"rationales {path}: unknown key {key!r}; known: {', '.join(sorted(cfg.rationales))}")
        out[key] = _phrasings(value)
        for phrasing in out[key]:
            try:
                phrasing.format(**dummy)
            except (KeyError, IndexError) as e:
                raise ValueError(f"rationales {path}: {key!r} names the field {e}; allowed: "
                                 f"{', '.join(RATIONALE_FIELDS)}") from None
    return replace(cfg, rationales={**cfg.rationales, **out})


def rationale(cfg: SilverConfig, key: str, rng: random.Random, **fields: Any) -> str:
    """One phrasing of the rationale ``key`` (a ``rationales`` entry of the config), filled with ``fields``."""
    return rng.choice(cfg.rationales[key]).format(**fields)


def pick(weights: Mapping[str, float], allowed: set[str], rng: random.Random) -> str | None:
    """A kind drawn by weight among the ``allowed`` ones; None when none of them has weight."""
    kinds = [k for k in weights if k in allowed and weights[k] > 0]
    if not kinds:
        return None
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
