"""README.md's commands are the ones that exist: its "Commands" table against the Makefile's targets, the console
scripts of pyproject.toml and each CLI's own argparse parser (the subcommands a row lists are exactly the CLI's), and
every ``make`` / ``compeer-*`` command elsewhere in the README (code blocks and inline code) against the same, flags
included."""

from __future__ import annotations

import argparse
import importlib
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: a console script as a command's first word: bare or from the venv (``.venv/bin/compeer-reward``).
SCRIPT = re.compile(r"(?:\.venv/bin/)?(compeer-[a-z-]+)")
#: a table cell boundary: a ``|`` not escaped as ``\|`` (which stands for "or" inside a cell's code).
CELL = re.compile(r"(?<!\\)\|")


@cache
def scripts() -> dict[str, str]:
    """console script -> the module whose ``main`` it runs (``[project.scripts]``)."""
    with (ROOT / "pyproject.toml").open("rb") as fh:
        table = tomllib.load(fh)["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in table.items()}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@cache
def subcommands(script: str) -> dict[str, argparse.ArgumentParser]:
    """A CLI's subcommands and the parser of each, from the CLI's own ``make_parser()``; ``compeer-train`` is a
    dispatcher (``COMMANDS``: subcommand -> module), so each of its subcommands' parser comes from that module."""
    module = importlib.import_module(scripts()[script])
    if hasattr(module, "make_parser"):
        found = _subparsers(module.make_parser())
        assert found, f"{script}: {module.__name__}.make_parser() has no subcommands"
        return found
    parsers = {}
    for name, target in module.COMMANDS.items():
        parser = importlib.import_module(target).make_parser()
        parsers[name] = _subparsers(parser).get(name, parser)
    return parsers


@cache
def make_targets() -> tuple[set[str], set[str]]:
    """(every rule target of the Makefile, its .PHONY targets)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_./-]+)\s*:(?!=)", text, re.MULTILINE)}
    phony = re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", text, re.MULTILINE)
    assert phony, "Makefile: no .PHONY line"
    return targets, set(phony.group(1).replace("\\\n", " ").split())


def commands_table(text: str) -> list[tuple[str, list[str]]]:
    """The rows of the "Commands" section's table: (first cell, the other cells)."""
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in CELL.split(line.strip().strip("|"))]
            rows.append((cells[0], cells[1:]))
    return rows


def code_spans(text: str) -> list[str]:
    return [s.replace("\\|", "|") for s in re.findall(r"`([^`\n]+)`", text)]


def table_problems(text: str) -> list[str]:
    """What the Commands table gets wrong, as messages (empty: nothing)."""
    problems: list[str] = []
    targets, phony = make_targets()
    listed_targets: set[str] = set()
    listed: dict[str, set[str]] = {}
    for first, _ in commands_table(text):
        for span in code_spans(first):
            words = span.split()
            if words[0] == "make":
                target = words[1]
                listed_targets.add(target)
                if target not in targets:
                    problems.append(f"`{span}`: no target {target!r} in the Makefile")
                continue
            m = SCRIPT.fullmatch(words[0])
            if not m or m.group(1) not in scripts():
                problems.append(f"`{span}`: neither `make` nor a console script of pyproject.toml "
                                f"({sorted(scripts())})")
                continue
            script = m.group(1)
            for alternative in span[len(words[0]):].split("|"):
                if alternative.split():
                    listed.setdefault(script, set()).add(alternative.split()[0])
    for target in sorted(phony - listed_targets):
        problems.append(f"`make {target}` (.PHONY in the Makefile) is not in the Commands table")
    for script in scripts():
        have, documented = set(subcommands(script)), listed.get(script, set())
        if documented != have:
            problems.append(f"{script}: the table lists {sorted(documented)}, the CLI has {sorted(have)} "
                            f"(missing {sorted(have - documented)}, unknown {sorted(documented - have)})")
    return problems


def command_problems(command: str) -> list[str]:
    """What one shell command (one line of a code block, or inline code) gets wrong about make or a compeer CLI."""
    problems: list[str] = []
    for segment in re.split(r"&&|\|\||[;&|]", re.sub(r"(^|\s)#.*", "", command)):
        words = segment.split()
        if not words:
            continue
        if words[0] == "make":
            targets, _ = make_targets()
            for word in words[1:]:
                if "=" not in word and not word.startswith(("-", "[")) and word.strip("[]") not in targets:
                    problems.append(f"`{segment.strip()}`: no target {word!r} in the Makefile")
            continue
        m = SCRIPT.fullmatch(words[0])
        if not m:
            continue
        script = m.group(1)
        if script not in scripts():
            problems.append(f"`{segment.strip()}`: {script} is not a console script of pyproject.toml")
            continue
        if len(words) < 2 or words[1].startswith("-"):
            continue
        parsers = subcommands(script)
        if words[1] not in parsers:
            problems.append(f"`{segment.strip()}`: {script} has no subcommand {words[1]!r} ({sorted(parsers)})")
            continue
        options = set(parsers[words[1]]._option_string_actions)
        for word in words[2:]:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in options:
                problems.append(f"`{segment.strip()}`: {script} {words[1]} has no option {flag}")
    return problems


def readme_commands(text: str) -> list[str]:
    """Every command the README shows outside the Commands table's first column: code-block lines (continuation
    lines joined) and inline code."""
    table_rows = set(text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0].splitlines())
    commands: list[str] = []
    for i, part in enumerate(text.split("```")):
        if i % 2:  # inside a fence (its first line is the language)
            commands += part.replace("\\\n", " ").splitlines()[1:]
            continue
        for line in part.splitlines():
            if line in table_rows and line.startswith("| `"):
                line = "|".join(CELL.split(line)[2:])  # the first column is table_problems' to check
            commands += code_spans(line)
    return commands


def test_the_commands_table_matches_the_makefile_the_scripts_and_the_parsers() -> None:
    assert commands_table(README.read_text(encoding="utf-8")), "README.md: no Commands table"
    assert table_problems(README.read_text(encoding="utf-8")) == []


def test_every_command_in_the_readme_names_a_real_target_subcommand_and_flag() -> None:
    commands = readme_commands(README.read_text(encoding="utf-8"))
    assert any(c.lstrip().startswith("compeer-train grpo") for c in commands)  # the end-to-end block was read
    assert [p for c in commands for p in command_problems(c)] == []


def test_compeer_train_dispatches_to_the_parsers_that_define_its_subcommands() -> None:
    from compeer_cli.train import COMMANDS
    from policy_trainer.cli import make_parser as grpo_parser
    from reward_trainer.cli import make_parser as judge_parser

    assert set(_subparsers(judge_parser())) == {c for c, m in COMMANDS.items() if m == "reward_trainer.cli"}
    assert {c for c, m in COMMANDS.items() if m == "policy_trainer.cli"} == {"grpo"}
    assert grpo_parser().prog == "compeer-train grpo"


@pytest.mark.parametrize(("line", "expected"), [
    ("| `make runn` | x |", "no target 'runn'"),
    ("| `compeer-train judge \\| judge-eval \\| grpo` | x |", "missing ['judge-ablation', 'judge-calibrate', 'judge-contrast']"),
    ("| `compeer-eval esc \\| sage \\| serve` | x |", "unknown ['serve']"),
    ("| `compeer-rewards serve \\| score` | x |", "neither `make` nor a console script"),
])
def test_a_drifted_table_row_is_caught(line: str, expected: str) -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    script = line.split("`")[1].split()[0]
    same = [r for r in rows if r.split("`")[1].split()[0] == script]
    drifted = text.replace(same[0], line) if same else text.replace(rows[0], rows[0] + "\n" + line)
    assert any(expected in p for p in table_problems(drifted)), table_problems(drifted)


@pytest.mark.parametrize(("command", "expected"), [
    ("compeer-train judge-evaluate --data D", "no subcommand 'judge-evaluate'"),
    (".venv/bin/compeer-reward serve --adaptor runs/judge &", "has no option --adaptor"),
    ("compeer-eval gold --esconv F --out R --limit 2  # comment --nope", None),
    ("make run && make lintt", "no target 'lintt'"),
    ("compeer-judge serve", "not a console script"),
])
def test_a_drifted_command_is_caught(command: str, expected: str | None) -> None:
    problems = command_problems(command)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in p for p in problems), problems
