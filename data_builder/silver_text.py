"""The silver stage's configuration (``data/silver.yaml``) and its wording: step texts and judge rationales.

Every part has several phrasings, picked at random per item for true and corrupted steps alike, so a judge cannot
tell a label from the wording. The tables (stages, emotion families, negative kinds and their weights, preference
pair weights) are configuration, not code.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cer.taxonomy import Taxonomy

EmotionEntry = tuple[str, str]  # (English name, Chinese name)


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


@lru_cache(maxsize=4)
def load_config(path: str | None = None) -> SilverConfig:
    """Load ``silver.yaml`` (the packaged one when ``path`` is None)."""
    text = (Path(path).read_text(encoding="utf-8") if path else
            resources.files("data_builder").joinpath("data/silver.yaml").read_text(encoding="utf-8"))
    data = yaml.safe_load(text)
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


def rationale(cfg: SilverConfig, key: str, rng: random.Random, **fields: Any) -> str:
    """One phrasing of the rationale ``key`` (a ``rationales`` entry of the config), filled with ``fields``."""
    return rng.choice(cfg.rationales[key]).format(**fields)


def pick(weights: Mapping[str, float], allowed: set[str], rng: random.Random) -> str | None:
    """A kind drawn by weight among the ``allowed`` ones; None when none of them has weight."""
    kinds = [k for k in weights if k in allowed and weights[k] > 0]
    if not kinds:
        return None
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
