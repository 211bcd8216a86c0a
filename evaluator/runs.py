"""Resumable runs: a run folder holds ``manifest.json`` (what was asked) and ``items.jsonl`` (one finished item a
line, appended and flushed as each finishes).

Running the same command on the same folder again continues: finished items are skipped, items that ended in an
engine error are tried again, and the generations of a half-finished item come back from the run's call cache
(``cache/``), so a killed run loses at most the generation that was in flight. A folder made with another
configuration is refused (the message names the differing settings) unless ``--overwrite`` is given.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from evaluator.backends import EngineError

log = logging.getLogger(__name__)
T = TypeVar("T")

MANIFEST = "manifest.json"
ITEMS = "items.jsonl"
CACHE = "cache"
#: Item statuses a resumed run tries again (everything else is final: a parse failure is a result, not an error).
RETRY_STATUSES = frozenset({"engine_error"})


class RunError(ValueError):
    """A run folder that cannot be used as asked (another configuration, unreadable manifest)."""


class RunDir:
    """One run's folder: manifest, finished items, call cache, report files."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def open(cls, path: Path, harness: str, config: dict[str, Any], overwrite: bool = False) -> RunDir:
        """Create the folder, or reopen it to resume when its manifest has the same harness and configuration."""
        manifest = path / MANIFEST
        if manifest.exists() and overwrite:
            shutil.rmtree(path)
        if manifest.exists():
            try:
                old = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise RunError(f"{manifest}: unreadable ({exc}); use --overwrite or another --out") from exc
            if old.get("harness") != harness:
                raise RunError(f"{path} holds a {old.get('harness')!r} run, not {harness!r}; use another --out")
            old_cfg = old.get("config", {})
            diff = sorted(k for k in set(old_cfg) | set(config) if old_cfg.get(k) != config.get(k))
            if diff:
                raise RunError(f"{path} was run with other settings ({', '.join(diff)}); resume with the same "
                               "settings, or pass --overwrite / another --out")
            items = path / ITEMS
            if items.exists() and items.stat().st_size and not items.read_bytes().endswith(b"\n"):
                with items.open("a", encoding="utf-8") as fh:  # a line cut short by a kill stays alone on its line
                    fh.write("\n")
            log.info("resuming the run in %s", path)
        else:
            path.mkdir(parents=True, exist_ok=True)
            payload = {"harness": harness, "config": config, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                      time.gmtime())}
            tmp = manifest.with_suffix(".tmp")
            tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, manifest)
        return cls(path)

    @property
    def cache_dir(self) -> Path:
        return self.path / CACHE

    def manifest(self) -> dict[str, Any]:
        return dict(json.loads((self.path / MANIFEST).read_text(encoding="utf-8")))

    def records(self) -> dict[str, dict[str, Any]]:
        """The latest record of each item id (a line cut short by a kill is skipped)."""
        out: dict[str, dict[str, Any]] = {}
        path = self.path / ITEMS
        if not path.exists():
            return out
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: incomplete line (a killed run); the item runs again", path, n)
                continue
            out[str(rec["id"])] = rec
        return out

    def finished(self) -> dict[str, dict[str, Any]]:
        """Records whose status is final."""
        return {k: v for k, v in self.records().items() if v.get("status") not in RETRY_STATUSES}

    def append(self, record: dict[str, Any]) -> None:
        """Append one finished item and flush it to disk."""
        with (self.path / ITEMS).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


async def run_items(run: RunDir, items: Sequence[tuple[str, T]], fn: Callable[[T], Awaitable[dict[str, Any]]],
                    concurrency: int, desc: str) -> list[dict[str, Any]]:
    """Run ``fn`` on the items not finished yet, ``concurrency`` at a time, recording each as it finishes.

    An :class:`EngineError` ends that item as ``engine_error`` (tried again on resume); the others go on. Returns
    the records of all ``items`` in their order.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    done = run.finished()
    todo = [(i, x) for i, x in items if i not in done]
    sem = asyncio.Semaphore(concurrency)

    async def one(item_id: str, item: T) -> None:
        async with sem:
            try:
                record = await fn(item)
            except EngineError as exc:
                log.error("item %s: engine error: %s", item_id, exc)
                record = {"id": item_id, "status": "engine_error", "error": str(exc)}
        run.append(record)

    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=desc, unit="item", file=sys.stderr,
               dynamic_ncols=True, disable=None if os.environ.get("COMPEER_PROGRESS") != "1" else False)
    tasks = [asyncio.create_task(one(i, x)) for i, x in todo]
    try:
        for fut in asyncio.as_completed(tasks):
            await fut
            bar.update(1)
    finally:
        for t in tasks:
            t.cancel()
        bar.close()
    records = run.records()
    return [records[i] for i, _ in items if i in records]
