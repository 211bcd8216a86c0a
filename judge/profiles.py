"""YAML profiles of a trainer's config dataclass, loaded one way for every trainer (issue 28).

A trainer's config (``reward_trainer.config.JudgeSFTConfig``, ``policy_trainer.config.CompeerGRPOConfig``: TRL's
``SFTConfig`` / ``GRPOConfig`` plus the project's fields) is built from a profile, a flat YAML mapping of field names
to values (a file path, or the name of one shipped in the trainer's ``profiles/`` folder), with command-line
overrides on top. :class:`ProfileLoader` is that one loader: the same flags (``--config``, ``--set KEY=VALUE``,
``--help-fields``), the same checks and one error type, :class:`ConfigError`, with one message style:

* an unknown profile: ``--config 'x': no such file and no shipped profile of that name (shipped: a, b)``;
* an unknown key (in a profile or ``--set``): ``<source>: 'lerning_rate' is not a config field (did you mean
  'learning_rate'?); see `<command> --help-fields```;
* a bad value: ``<source>: max_steps: expected an integer, got 'abc'`` (checked against the field's default's type
  before the config is built; the config's own ``__post_init__`` checks follow, their ValueError re-raised as
  :class:`ConfigError` naming the source).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A mistake in a trainer's profile or overrides: an unknown profile, an unknown key or a bad value."""


_KINDS = {bool: "true or false", int: "an integer", float: "a number"}


@dataclass(frozen=True)
class ProfileLoader:
    """Loads the config dataclass ``cls`` of one trainer command from a profile and overrides.

    ``directory`` holds the shipped profiles (``<name>.yaml``); ``command`` (``compeer-train grpo``) is named in
    messages; fields of ``base`` (TRL's config) are documented by TRL, so ``--help-fields`` lists the others.
    """

    cls: type
    directory: Path
    command: str
    base: type | None = None

    def names(self) -> list[str]:
        """The shipped profiles, by name."""
        return sorted(p.stem for p in self.directory.glob("*.yaml"))

    def fields(self) -> set[str]:
        """Every field a profile or an override may set."""
        return {f.name for f in dataclasses.fields(self.cls) if f.init}

    def resolve(self, spec: str) -> Path:
        """A profile file path, or the name of a shipped profile; ConfigError when it is neither."""
        path = Path(spec)
        if path.is_file():
            return path
        shipped = self.directory / f"{spec}.yaml"
        if shipped.is_file():
            return shipped
        raise ConfigError(f"--config {spec!r}: no such file and no shipped profile of that name "
                          f"(shipped: {', '.join(self.names())})")

    def read(self, spec: str) -> dict[str, Any]:
        """The checked mapping a profile holds (unknown keys and bad values raise ConfigError)."""
        path = self.resolve(spec)
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"--config {spec!r}: expected a YAML mapping of {self.cls.__name__} fields")
        return self.check(data, f"profile {path}")

    def override(self, item: str) -> tuple[str, Any]:
        """``KEY=VALUE`` of ``--set``, VALUE read as YAML (numbers, booleans, lists and null work), checked; the
        VALUE of a text field stays the text as given (YAML 1.1 would read ``off``, ``on``, ``yes`` or ``no`` as a
        boolean)."""
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        key = key.strip()
        value = yaml.safe_load(raw)
        if isinstance(value, bool) and isinstance(self._defaults().get(key), str):
            value = raw.strip()
        return next(iter(self.check({key: value}, "--set").items()))

    def _defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(self.cls)}

    def check(self, values: Mapping[str, Any], source: str) -> dict[str, Any]:
        """``values`` with every key a field and every value of the field's kind (YAML 1.1 reads ``2e-5`` as a
        string: such a value of a float field becomes a float); ConfigError naming ``source`` otherwise."""
        names = self.fields()
        for key in values:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: {key!r} is not a config field{hint}; see `{self.command} --help-fields`")
        defaults = self._defaults()
        return {key: _of_kind(key, value, defaults.get(key), source) for key, value in values.items()}

    def build(self, values: Mapping[str, Any], source: str = "config") -> Any:
        """The config from a mapping, checked; its own ``__post_init__`` ValueError comes back as ConfigError."""
        checked = self.check(values, source)
        try:
            return self.cls(**checked)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def load(self, spec: str, overrides: Mapping[str, Any] | None = None) -> Any:
        """The config of a profile (a path or a shipped name) with ``overrides`` on top (later wins)."""
        values = self.read(spec)
        values.update(self.check(overrides or {}, "override"))
        return self.build(values, f"--config {spec}")

    def describe(self) -> str:
        """One line per field with its help text, the fields of ``base`` left out (TRL documents them)."""
        skip = {f.name for f in dataclasses.fields(self.base)} if self.base else set()
        return "\n".join(f"{f.name}: {str(f.metadata.get('help', '')).replace('%%', '%')}"
                         for f in dataclasses.fields(self.cls) if f.init and f.name not in skip)

    def add_flags(self, parser: argparse.ArgumentParser, *, required: bool = False,
                  aliases: Sequence[str] = ()) -> None:
        """``--config``, ``--set KEY=VALUE`` (repeatable) and ``--help-fields`` (plus hidden ``aliases`` of it)."""
        parser.add_argument("--config", required=required,
                            help=f"YAML profile: a file, or a shipped name ({', '.join(self.names())})")
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                            help="override any config field (VALUE read as YAML); repeatable; later wins")
        parser.add_argument("--help-fields", *aliases, dest="help_fields", action="store_true",
                            help="list the config fields with their help and exit")

    def overrides(self, items: Sequence[str], flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``--set`` items, then the values of a command's own flags (``flags``, None left out) on top."""
        values: dict[str, Any] = dict(self.override(item) for item in items)
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        return values


def _of_kind(key: str, value: Any, default: Any, source: str) -> Any:
    kind = type(default)
    if isinstance(default, str) and isinstance(value, bool):  # a profile's `key: off` (YAML 1.1 reads it as false)
        raise ConfigError(f"{source}: {key}: expected text, got the boolean {value!r}: quote the value "
                          f"(YAML reads off, on, yes and no as booleans)")
    if default is None or kind not in _KINDS or value is None or (kind is float and not isinstance(value, bool)
                                                                  and isinstance(value, int)):
        return value
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    elif type(value) is kind:
        return value
    raise ConfigError(f"{source}: {key}: expected {_KINDS[kind]}, got {value!r}")


__all__ = ["ConfigError", "ProfileLoader"]
