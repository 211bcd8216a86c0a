"""End to end: every data_builder stage on the fixtures, LLM stages on the REAL default local model
(SmolLM2-135M-Instruct) through the transformers backend, with --limit small enough for one CPU thread.

The 135M model rarely writes the requested formats; the test checks that the pipeline records those
failures (never invents outputs), caches every call, and still emits well-formed datasets from the silver and
annotated items.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_from_disk

from cer.reasoning import parse
from data_builder.cli import main
from data_builder.records import read_jsonl, write_jsonl

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data_builder"
LLM = ["--backend", "transformers", "--model", "default", "--max-retries", "0", "--concurrency", "4"]


def _run(*args: str) -> None:
    assert main([*args, "--quiet"]) == 0, args


def _counts(d: Path) -> dict:
    m = json.loads((d / "manifest.json").read_text())
    assert m["command"].startswith("compeer-data ")
    return m["counts"]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_all_stages_on_fixtures_with_the_default_model(tmp_path: Path) -> None:
    cache = ["--cache-dir", str(tmp_path / "llm-cache")]
    o = lambda name: str(tmp_path / name)
    # 1. ingest, every format
    _run("ingest", "--format", "esconv", "--out", o("ing_esconv"), str(FIX / "esconv.json"))
    _run("ingest", "--format", "esconv-raw", "--out", o("ing_raw"), str(FIX / "esconv_raw.json"))
    _run("ingest", "--format", "jsonl", "--out", o("ing_jsonl"), str(FIX / "dialogues.jsonl"))
    _run("ingest", "--format", "sio", "--out", o("ing_sio"), str(FIX / "sio.jsonl"))
    assert _counts(tmp_path / "ing_raw")["unmapped_strategies"] == {"Empathic Humour": 2}
    # 2. filter (real model judge)
    _run("filter", *LLM, *cache, "--limit", "2", "--max-tokens", "32", "--out", o("filter"),
         o("ing_esconv") + "/dialogues.jsonl")
    f = _counts(tmp_path / "filter")
    assert f["read"] == 2 and f["kept"] + f["dropped"] == 2
    assert sum(f["reasons"].values()) == 2 and f["llm"]["calls"] == 2
    # 3. sample
    _run("sample", "--rounds", "2", "--out", o("sample"), o("filter") + "/dialogues.jsonl",
         o("ing_raw") + "/dialogues.jsonl", o("ing_jsonl") + "/dialogues.jsonl", o("ing_sio") + "/dialogues.jsonl")
    rounds = list(read_jsonl(tmp_path / "sample" / "rounds.jsonl"))
    assert rounds and all(r["history"][-1]["role"] == "seeker" for r in rounds)
    # 4. generate (real model, CER format or recorded failure)
    _run("generate", *LLM, *cache, "--limit", "2", "--max-tokens", "64", "--out", o("gen"), o("sample") + "/rounds.jsonl")
    g = _counts(tmp_path / "gen")
    assert g["rounds"] == 2 and g["generated"] + g["failed"] == 2
    assert all(parse(x["candidate"]).ok for x in read_jsonl(tmp_path / "gen" / "generations.jsonl"))
    assert all(x["candidate"] is None and x["status"] == "failed" for x in read_jsonl(tmp_path / "gen" / "failed.jsonl"))
    # the same command again is served from the cache: no generation
    _run("generate", *LLM, *cache, "--limit", "2", "--max-tokens", "64", "--out", o("gen"), o("sample") + "/rounds.jsonl")
    g2 = _counts(tmp_path / "gen")
    assert g2["llm"]["generations"] == 0 and g2["llm"]["cache_hits"] == g["llm"]["generations"]
    # 5. silver
    _run("silver", "--no-reply-items", "--out", o("silver"), o("sample") + "/rounds.jsonl")
    s = _counts(tmp_path / "silver")
    # a quarter of each step's slots, and step 3 beside every hack candidate besides
    n, hacked = s["items"], s["step3_false_beside_a_hack"]
    assert n > 0 and s["step_false"] == 2 * round(0.25 * n) + round(0.25 * (n - hacked)) + hacked
    # 6. annotate: export generations + a few silver items, two annotators and an adjudicator, import
    _run("annotate", "export", "--out", o("ann"), o("gen") + "/generations.jsonl", o("silver") + "/items.jsonl")
    tasks = list(read_jsonl(tmp_path / "ann" / "tasks.jsonl"))
    assert len(tasks) == _counts(tmp_path / "ann")["tasks"] >= s["items"]
    silver = {(i["dialogue_id"], i["round_index"], i["candidate"]): i["labels"] for i in read_jsonl(tmp_path / "silver" / "items.jsonl")}
    a, b, c = [], [], []
    for k, t in enumerate(tasks):
        lab = silver.get((t["dialogue_id"], t["round_index"], t["candidate"]),
                         {"step1": True, "step2": True, "step3": False, "preference": "first"})
        a.append({"task_id": t["task_id"], **lab})
        b.append({"task_id": t["task_id"], **lab, "step2": (not lab["step2"]) if k % 3 == 0 else lab["step2"]})
        c.append({"task_id": t["task_id"], **lab} if k % 2 == 0 else {"task_id": t["task_id"]})
    for name, rows in (("a", a), ("b", b), ("c", c)):
        write_jsonl(tmp_path / f"{name}.jsonl", rows)
    _run("annotate", "import", "--out", o("ann_in"), "--annotator", o("a.jsonl"), "--annotator", o("b.jsonl"),
         "--adjudicator", o("c.jsonl"), o("ann") + "/tasks.jsonl")
    ai = _counts(tmp_path / "ann_in")
    disagree = {t["task_id"] for k, t in enumerate(tasks) if k % 3 == 0}
    unresolved = {t["task_id"] for k, t in enumerate(tasks) if k % 3 == 0 and k % 2 == 1}
    assert ai["kept"] == len(tasks) - len(unresolved) and ai["adjudicated"] == len(disagree) - len(unresolved)
    assert ai["annotators"]["step1"]["agreement"] == 1.0
    # 7. persona (real model DISC + real embeddings), and plain rewriting of one short dialogue
    _run("persona", *LLM, *cache, "--limit", "2", "--disc-max-tokens", "48", "--max-tokens", "40", "--out", o("persona"),
         o("ing_jsonl") + "/dialogues.jsonl")
    p = _counts(tmp_path / "persona")
    assert p["disc_ok"] + p["disc_failed"] == 2 and p["kept"] + p["dropped"] == p["rewrite_jobs"]
    _run("persona", *LLM, *cache, "--mode", "rewrite", "--limit", "1", "--max-tokens", "40", "--out", o("rewrite"),
         o("ing_sio") + "/dialogues.jsonl")
    r = _counts(tmp_path / "rewrite")
    assert r["rewrite_jobs"] == 1 and r["kept"] + r["dropped"] == 1
    for d in read_jsonl(tmp_path / "rewrite" / "dialogues.jsonl"):
        assert d["id"].endswith("#rewrite") and d["meta"]["drift"]["min_similarity"] >= 0.5
    # 8. emit
    _run("emit", "--heldout-fraction", "0.25", "--out", o("emit"), o("silver") + "/items.jsonl",
         o("ann_in") + "/items.jsonl", o("sample") + "/rounds.jsonl")
    e = _counts(tmp_path / "emit")
    assert e["sources"] == {"annotated": ai["kept"], "silver": s["items"]}
    for mode in ("unified", "prm", "orm"):
        dd = load_from_disk(str(tmp_path / "emit" / "judge_sft" / mode))
        assert len(dd["train"]) > 0 and len(dd["heldout"]) > 0
        assert not set(dd["train"]["dialogue_id"]) & set(dd["heldout"]["dialogue_id"])
        assert dd["train"][0]["messages"][0]["role"] == "system"
    gp = load_from_disk(str(tmp_path / "emit" / "grpo_prompts"))
    assert len(gp["train"]) + len(gp["heldout"]) == len(rounds)
    # summary over every stage folder
    dirs = [o(x) for x in ("ing_esconv", "filter", "sample", "gen", "silver", "ann", "ann_in", "persona", "rewrite", "emit")]
    assert main(["summary", *dirs]) == 0
