"""Settings defined once: dataclass fields with help metadata, from which command-line flags and environment
variable names are generated (the pattern of vLLM's ``EngineArgs.add_cli_args`` and TRL's ``HfArgumentParser``,
extended to nested dataclasses and environment variables).

A settings class is a dataclass whose fields are made with :func:`setting` (or :func:`nested` for a nested settings
dataclass). Each leaf field becomes one flag and one environment variable:

* flag: ``--<name>`` (underscores become dashes), with the nested field's ``prefix`` in front; a bool that defaults
  to False is a switch ``--<name>``, one that defaults to True a switch ``--no-<name>``; ``flag=`` overrides the name.
* environment: ``COMPEER_<NAME>`` of the positive flag name (``--no-line-bound`` reads ``COMPEER_LINE_BOUND``);
  ``env=`` overrides it (e.g. ``REDIS_URL``). A set variable replaces the default; a flag on the command line wins.
* ``cli=False`` keeps a field out of both (values the program fills in itself).
* ``bare=True``: under a prefix the flag is the prefix alone (``--scorer`` for the field ``model`` of the settings
  added with ``prefix="scorer-"``; ``--model`` without one).
* ``secret=True`` gives a field its environment variable but no flag (a value on a command line shows in ``ps``
  and shell histories): ``--help`` names the variable in its group's description.
* ``aliases={"--old-flag": value}``: a deprecated switch that sets the field to ``value``; ``env_aliases=
  {"COMPEER_OLD": {"true": value, "false": other}}``: a deprecated environment variable (a true / false word is read
  as ``true`` / ``false``). Both keep working, hidden from ``--help``, and log a warning once naming the new
  spelling (:func:`warn_deprecated`).

:func:`add_arguments` adds the flags of a settings class to an ``argparse`` parser (under a ``prefix``, for one set of
flags per role, and with per-role ``defaults``); :func:`from_namespace` builds the (nested) settings object back from
the parsed namespace. Defaults live only in the dataclass (or the ``defaults`` a caller states).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import logging
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("judge.settings")

ENV_PREFIX = "COMPEER_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def setting(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None, env: str | None = None,
            choices: Sequence[str] | None = None, cli: bool = True, secret: bool = False, bare: bool = False,
            default_factory: Callable[[], Any] | Any = dataclasses.MISSING, aliases: Mapping[str, Any] | None = None,
            env_aliases: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """A dataclass field with its help text and, optionally, its flag name, env name and choices; ``secret``: read
    from the environment only; ``bare``: under a prefix, the flag is the prefix alone; ``aliases`` /
    ``env_aliases``: deprecated flags / environment variables that still set it (the module docstring)."""
    metadata = {"help": help, "flag": flag, "env": env, "choices": tuple(choices) if choices else None, "cli": cli,
                "secret": secret, "bare": bare, "aliases": tuple((aliases or {}).items()),
                "env_aliases": tuple((k, tuple(v.items())) for k, v in (env_aliases or {}).items())}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def nested(factory: Callable[[], Any], *, prefix: str = "", help: str = "") -> Any:
    """A field holding a nested settings dataclass; its flags get ``prefix`` (e.g. ``openai-``)."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True, "prefix": prefix, "help": help})


@dataclass(frozen=True)
class Option:
    """One generated flag: where its value goes (``path`` of field names), its flag, env name, type and help."""

    path: tuple[str, ...]
    flag: str
    env: str
    kind: type
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] | None
    group: str = ""
    secret: bool = False
    many: bool = False
    #: deprecated switches: (flag, the value it sets)
    aliases: tuple[tuple[str, Any], ...] = ()
    #: deprecated environment variables: (name, ((word, the value it sets), ...))
    env_aliases: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    @property
    def dest(self) -> str:
        """The argparse attribute of the value: the positive flag name with underscores."""
        return self.flag.removeprefix("--").removeprefix("no-").replace("-", "_")

    @property
    def negated(self) -> bool:
        """A bool that defaults to True: the flag turns it off."""
        return self.kind is bool and self.default is True

    def parse(self, raw: str) -> Any:
        """A value of this option from its string form (an env variable; a list: items split on commas or
        whitespace); ValueError naming the env name."""
        if self.many:
            return [self.parse_item(x) for x in raw.replace(",", " ").split()]
        return self.parse_item(raw)

    def parse_item(self, raw: str) -> Any:
        """One value (of a list: one item) from its string form; ValueError naming the env name."""
        if self.optional and raw.strip().lower() in ("", "none", "null"):
            return None
        if self.kind is bool:
            word = raw.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ValueError(f"{self.env}={raw!r}: expected true or false")
            return word in _TRUE
        try:
            value = self.kind(raw)
        except ValueError as exc:
            raise ValueError(f"{self.env}={raw!r}: expected {self._type_name()}") from exc
        if self.choices and str(_plain(value)) not in self.choices:
            raise ValueError(f"{self.env}={raw!r}: expected one of {', '.join(self.choices)}")
        return value

    def _type_name(self) -> str:
        return "one of " + ", ".join(self.choices) if self.choices else self.kind.__name__


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _leaf_type(hint: Any) -> tuple[type, bool]:
    """``(type, optional)`` of a field annotation: ``int``, ``float | None``, an Enum ... (a list: its items' type)"""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list and len(args) == 1 and isinstance(args[0], type):
        return args[0], False
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    if isinstance(hint, type):
        return hint, False
    raise TypeError(f"settings field type {hint!r} is not supported (use a scalar, an Enum or one of them | None)")


def options(cls: type, prefix: str = "", path: tuple[str, ...] = (), group: str = "") -> list[Option]:
    """Every flag of settings class ``cls`` (nested settings included), in field order; ``group`` titles the flags
    of ``cls`` in ``--help`` (a nested field's ``help``, else the class name)."""
    hints = typing.get_type_hints(cls)
    out: list[Option] = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("nested"):
            out += options(hints[f.name], prefix + meta.get("prefix", ""), (*path, f.name),
                           meta.get("help") or hints[f.name].__name__)
            continue
        if "help" not in meta:
            raise TypeError(f"{cls.__name__}.{f.name} has no help: define it with judge.settings.setting(...)")
        if not meta.get("cli", True):
            continue
        kind, optional = _leaf_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no default: every setting needs one")
        choices = meta.get("choices") or (tuple(str(m.value) for m in kind) if issubclass(kind, enum.Enum) else None)
        name = prefix.rstrip("-") if meta.get("bare") and prefix else prefix + f.name.replace("_", "-")
        flag = meta.get("flag") or (f"--no-{name}" if kind is bool and default is True else f"--{name}")
        env = meta.get("env") or ENV_PREFIX + flag.removeprefix("--").removeprefix("no-").replace("-", "_").upper()
        out.append(Option((*path, f.name), flag, env, kind, optional, default, meta["help"], choices,
                          group or cls.__name__, bool(meta.get("secret")), typing.get_origin(hints[f.name]) is list,
                          tuple(meta.get("aliases", ())), tuple(meta.get("env_aliases", ()))))
    return out


def add_arguments(parser: argparse.ArgumentParser, cls: type, environ: Mapping[str, str] | None = None,
                  title: str = "", prefix: str = "", defaults: Mapping[str, Any] | None = None) -> list[Option]:
    """Add one flag per option of ``cls`` to ``parser``, in one argument group per settings class; a set environment
    variable replaces a default.

    ``prefix`` goes in front of every flag (and environment) name (``scorer-``: ``--scorer-backend``,
    ``COMPEER_SCORER_BACKEND``); ``defaults`` replaces the defaults of top-level fields by name (one role's own,
    e.g. a shorter ``max_tokens``). The help of each flag ends with its default and its environment variable.
    Raises ValueError for an environment value that does not parse (naming the variable and what it expects).
    """
    env = os.environ if environ is None else environ
    given = dict(defaults or {})
    opts = [dataclasses.replace(o, default=given.pop(o.path[0])) if len(o.path) == 1 and o.path[0] in given else o
            for o in options(cls, prefix, group=title)]
    if given:
        raise TypeError(f"defaults for no setting of {cls.__name__}: {', '.join(given)}")
    groups: dict[str, Any] = {}
    for o in opts:
        group = groups.get(o.group)
        if group is None:
            group = groups[o.group] = parser.add_argument_group(o.group)
        default = o.parse(env[o.env]) if o.env in env else _env_alias(o, env)
        if o.secret:  # no flag: the value comes from the environment (or the default) only
            parser.set_defaults(**{o.dest: default})
            group.description = f"{group.description or ''}environment only: env {o.env}: {o.help}. "
        elif o.negated:
            group.add_argument(o.flag, dest=o.dest, action="store_false", default=default,
                               help=_escaped(f"turn off: {o.help} (on by default; env {o.env}=false)"))
            if o.flag.startswith("--no-"):  # ``--<name>`` turns it back on (an alias: a script may say so)
                group.add_argument("--" + o.flag.removeprefix("--no-"), dest=o.dest, action="store_true",
                                   help=argparse.SUPPRESS)
        elif o.kind is bool:
            group.add_argument(o.flag, dest=o.dest, action="store_true", default=default,
                               help=_escaped(f"{o.help} (off by default; env {o.env}=true)"))
            # ``--no-<name>`` turns it back off (an alias: a script may say so explicitly)
            group.add_argument("--no-" + o.flag.removeprefix("--"), dest=o.dest, action="store_false",
                               help=argparse.SUPPRESS)
        else:
            group.add_argument(o.flag, dest=o.dest, type=_converter(o), default=default,
                               nargs="*" if o.many else None,
                               metavar=("{" + ",".join(o.choices) + "}") if o.choices else None,
                               help=_escaped(f"{o.help} (default: {_plain(o.default)}; env {o.env})"))
        for alias, value in o.aliases:  # deprecated switches: hidden, they warn once and set the value
            group.add_argument(alias, dest=o.dest, nargs=0, const=value, help=argparse.SUPPRESS,
                               action=_deprecated_switch(o.flag))
    return opts


def _escaped(text: str) -> str:
    """A help text as argparse prints it literally (it %-formats help strings: a plain "99.5%" breaks ``--help``)."""
    return text.replace("%", "%%")


_warned: set[str] = set()


def warn_deprecated(old: str, new: str) -> None:
    """Log once per process that the spelling ``old`` is deprecated, naming ``new``."""
    if old not in _warned:
        _warned.add(old)
        log.warning("%s is deprecated and will be removed: use %s", old, new)


def _deprecated_switch(canonical: str) -> type[argparse.Action]:
    """The argparse action of a deprecated flag: it sets its setting to ``const`` and warns once, naming the
    setting's own flag ``canonical``."""

    class DeprecatedSwitch(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                     option_string: str | None = None) -> None:
            warn_deprecated(str(option_string), f"{canonical} {_plain(self.const)}")
            setattr(namespace, self.dest, self.const)

    return DeprecatedSwitch


def _env_alias(o: Option, env: Mapping[str, str]) -> Any:
    """The value a set deprecated environment variable of ``o`` gives (warning once), else ``o``'s default."""
    for name, table in o.env_aliases:
        if name in env:
            raw = env[name].strip().lower()
            word = "true" if raw in _TRUE else "false" if raw in _FALSE else raw
            values = dict(table)
            if word not in values:
                raise ValueError(f"{name}={env[name]!r}: expected one of {', '.join(values)}")
            warn_deprecated(f"env {name}", f"{o.env}={_plain(values[word])}")
            return values[word]
    return o.default


def _converter(o: Option) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return o.parse_item(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(f"{o.env}=", "")) from None

    convert.__name__ = o.kind.__name__
    return convert


def from_namespace(cls: Any, namespace: argparse.Namespace, prefix: str = "") -> Any:
    """Build ``cls`` (and its nested settings) from the values :func:`add_arguments` parsed into ``namespace``
    (with the same ``prefix``)."""
    values: dict[tuple[str, ...], Any] = {o.path: getattr(namespace, o.dest) for o in options(cls, prefix)}
    return _build(cls, (), values)


def _build(cls: Any, path: tuple[str, ...], values: dict[tuple[str, ...], Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        here = (*path, f.name)
        if f.metadata.get("nested"):
            kwargs[f.name] = _build(hints[f.name], here, values)
        elif here in values:
            kwargs[f.name] = values[here]
    return cls(**kwargs)


__all__ = ["ENV_PREFIX", "Option", "add_arguments", "from_namespace", "nested", "options", "setting", "warn_deprecated"]
