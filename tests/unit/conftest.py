"""Fixtures shared by unit test modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_builder.cli import main
from data_builder.records import read_jsonl

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"


@pytest.fixture()
def corpus(tmp_path: Path) -> tuple[list[dict], list[dict]]:
    """The data_builder fixture corpus (English and Chinese ESConv-format dialogues): 5 sampled rounds a dialogue and
    the ingested dialogues; the ingest output is at ``tmp_path/i/dialogues.jsonl``."""
    assert main(["ingest", "--quiet", "--format", "esconv", "--out", str(tmp_path / "i"), str(FIX / "esconv.json")]) == 0
    dialogues = str(tmp_path / "i" / "dialogues.jsonl")
    assert main(["sample", "--quiet", "--rounds", "5", "--out", str(tmp_path / "s"), dialogues]) == 0
    return list(read_jsonl(tmp_path / "s" / "rounds.jsonl")), list(read_jsonl(dialogues))
