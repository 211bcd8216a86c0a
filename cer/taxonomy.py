"""The strategy taxonomy and the step-1/step-2 label sets, loaded from YAML (configuration, not code)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Strategy:
    """One support strategy with the other names corpora use for it."""

    name: str
    aliases: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class Taxonomy:
    """Strategies plus the support stages, sentiments and intensity range the reasoning steps use."""

    strategies: tuple[Strategy, ...]
    stages: tuple[str, ...]
    sentiments: tuple[str, ...]
    intensity: tuple[int, int]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.strategies]

    def normalise(self, name: str) -> str | None:
        """Map a strategy name or alias (case- and space-insensitive) to its canonical name, else None."""
        key = _key(name)
        for s in self.strategies:
            if key == _key(s.name) or key in {_key(a) for a in s.aliases}:
                return s.name
        return None


def named_strategy(step3: str, taxonomy: Taxonomy) -> str | None:
    """The strategy a step-3 text names: the first taxonomy strategy (name or alias, any case) it mentions, longer
    names first where two start at the same place; None when it names none. The one rule for what strategy a CER
    output chose (the dataset pipeline, the evaluator, the end-to-end loop)."""
    low = step3.lower()
    names = sorted(((n, s.name) for s in taxonomy.strategies for n in (s.name, *s.aliases)), key=lambda x: -len(x[0]))
    hits = [(low.find(n.lower()), canon) for n, canon in names if n.lower() in low]
    return min(hits)[1] if hits else None


def strategy_accuracy(predicted: Sequence[str | None], gold: Sequence[str | None]) -> float | None:
    """Strategy accuracy (times 100): of the items with a gold strategy, the share whose predicted strategy (e.g.
    :func:`named_strategy` of its step 3) is that strategy; a prediction of None counts as wrong. None when no item
    has a gold strategy (never a made-up 0)."""
    pairs = [(p, g) for p, g in zip(predicted, gold, strict=True) if g]
    return 100.0 * sum(1 for p, g in pairs if p == g) / len(pairs) if pairs else None


def _key(name: str) -> str:
    return " ".join(name.replace("-", " ").lower().split())


def _from_mapping(data: dict, source: str) -> Taxonomy:
    try:
        strategies = tuple(
            Strategy(str(s["name"]), tuple(str(a) for a in s.get("aliases", [])), str(s.get("description", "")))
            for s in data["strategies"]
        )
        lo, hi = data.get("intensity", [1, 5])
        tax = Taxonomy(strategies, tuple(data["stages"]), tuple(data["sentiments"]), (int(lo), int(hi)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"taxonomy {source}: expected keys strategies[name, aliases], stages, sentiments: {exc}") from exc
    if not tax.strategies:
        raise ValueError(f"taxonomy {source}: 'strategies' is empty")
    return tax


@lru_cache(maxsize=8)
def load_taxonomy(path: str | None = None) -> Taxonomy:
    """Load a taxonomy YAML; ``None`` loads the packaged default (ESConv's eight strategies)."""
    if path is None:
        text = resources.files("cer").joinpath("data/taxonomy.yaml").read_text(encoding="utf-8")
        return _from_mapping(yaml.safe_load(text), "default")
    return _from_mapping(yaml.safe_load(Path(path).read_text(encoding="utf-8")), path)
