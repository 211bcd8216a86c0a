"""Shared by the deploy unit tests: repository paths and a small Dockerfile reader."""

from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions of each stage: [(INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    logical, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    stages: list[list[tuple[str, str]]] = []
    for entry in logical:
        instr, _, args = entry.strip().partition(" ")
        if instr.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr.upper(), args.strip()))
    return stages


def stage_names(path: Path) -> list[str]:
    """``FROM x AS name`` names, in order (an unnamed stage is '')."""
    names = []
    for stage in dockerfile_stages(path):
        parts = stage[0][1].split()
        names.append(parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else "")
    return names


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instr, args in stage:
        if instr == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env
