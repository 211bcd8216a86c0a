"""What every stage shares: the manifest, the summary table, the progress bar and common CLI options."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

MANIFEST = "manifest.json"
T = TypeVar("T")


class StageError(RuntimeError):
    """A stage cannot go on (bad input in --strict mode, missing inputs, bad options); the CLI exits with 2."""


def command_line(argv: list[str] | None) -> str:
    """The command that made an output, as a shell-quoted line (recorded in every manifest)."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["compeer-data", *args])


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (first 16 hex digits), recorded for each stage input."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


@dataclass
class StageRun:
    """One stage execution: collects counts and parameters, then writes ``DIR/manifest.json``."""

    stage: str
    out: Path
    argv: list[str] | None
    inputs: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        """A file of this stage's output folder, remembered as an output."""
        if name not in self.outputs:
            self.outputs.append(name)
        return self.out / name

    def finish(self, quiet: bool = False) -> dict[str, Any]:
        """Write the manifest (atomically) and print the summary table; returns the manifest."""
        manifest = {
            "stage": self.stage,
            "command": command_line(self.argv),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "inputs": [{"path": str(p), "sha256": file_digest(p)} for p in self.inputs if Path(p).is_file()],
            "params": self.params,
            "counts": self.counts,
            "outputs": self.outputs,
        }
        tmp = self.out / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, ensure_ascii=False, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.out / MANIFEST)
        if not quiet:
            print(summary_table([manifest]))
        return manifest


def _flatten(counts: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in counts.items():
        if isinstance(v, Mapping):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def summary_table(manifests: Iterable[Mapping[str, Any]]) -> str:
    """A plain-text table: one block per stage, one row per count (nested counts flattened with dots)."""
    rows: list[tuple[str, str, str]] = []
    for m in manifests:
        for key, value in _flatten(m.get("counts", {})):
            shown = f"{value:.4f}" if isinstance(value, float) else str(value)
            rows.append((str(m.get("stage", "?")), key, shown))
    if not rows:
        return "(no counts)"
    widths = [max(len(r[i]) for r in [("stage", "count", "value"), *rows]) for i in range(3)]
    line = "+".join("-" * (w + 2) for w in widths)
    fmt = " | ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    out = [fmt.format("stage", "count", "value"), line]
    last = None
    for r in rows:
        out.append(fmt.format(r[0] if r[0] != last else "", r[1], r[2]))
        last = r[0]
    return "\n".join(out)


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """Load ``folder/manifest.json``."""
    return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """A tqdm progress bar on stderr (hidden when stderr is not a terminal unless COMPEER_PROGRESS=1)."""
    force = os.environ.get("COMPEER_PROGRESS") == "1"
    yield from tqdm(items, desc=desc, total=total, unit="it", file=sys.stderr, disable=None if not force else False,
                    dynamic_ncols=True, leave=False)


def add_common(parser: argparse.ArgumentParser) -> None:
    """--out, INPUT..., --limit, --seed, --quiet: on every stage."""
    parser.add_argument("--out", required=True, type=Path, help="output folder (created); gets manifest.json")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="input files (the previous stage's records)")
    parser.add_argument("--limit", type=int, default=None, help="process at most this many input records")
    parser.add_argument("--seed", type=int, default=0, help="random seed (every random choice derives from it)")
    parser.add_argument("--quiet", action="store_true", help="do not print the summary table")


def limited(items: list[T], limit: int | None) -> list[T]:
    """The first ``limit`` items (all when None); a negative limit is an error."""
    if limit is None:
        return items
    if limit < 0:
        raise StageError(f"--limit {limit}: must be >= 0")
    return items[:limit]


def stable_unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (sha256), for order-independent seeded choices."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def stable_seed(*parts: object) -> int:
    """A deterministic 63-bit seed from the parts."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") >> 1
