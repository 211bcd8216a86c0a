"""The strategy taxonomy and the step-1/step-2 label sets, loaded from YAML (configuration, not code)."""

from __future__ import annotations

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
