"""Annotation: the consensus rule (>= 2 of annotator A, B, adjudicator), Cohen's kappa, export and import."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cer.reasoning import render
from data_builder.annotate import agreement_report, consensus, label_studio_config, merge, read_labels
from data_builder.annotate import labels_kappa as kappa
from data_builder.cli import main
from data_builder.records import read_jsonl, write_jsonl


def test_consensus_rule() -> None:
    assert consensus([True, True, None]) is True  # annotators agree, no adjudicator needed
    assert consensus([True, False, False]) is False  # adjudicator sides with B
    assert consensus(["first", "second", "first"]) == "first"
    assert consensus(["first", "second", "neither"]) is None  # no two agree: dropped
    assert consensus([True, False, None]) is None  # disagreement, no adjudicator
    assert consensus([None, False, False]) is False  # A missing, B and C agree
    assert consensus([None, None, True]) is None


def test_kappa_matches_hand_computation() -> None:
    a = [True, True, False, False, True, True, False, True]
    b = [True, False, False, False, True, True, True, True]
    po = 6 / 8
    pa_t, pb_t = 5 / 8, 5 / 8
    pe = pa_t * pb_t + (1 - pa_t) * (1 - pb_t)
    assert kappa(a, b) == pytest.approx((po - pe) / (1 - pe))
    assert kappa(["first", "second"], ["first", "second"]) == pytest.approx(1.0)
    assert kappa([True, True, True], [True, True, True]) is None  # one label only: undefined, not invented
    assert kappa([True], [False]) is None
    with pytest.raises(ValueError):
        kappa([True], [True, False])


def _gen(i: int) -> dict:
    cand = render({"analysis": f"issue {i}, exploration", "emotion": "negative, sad, 4", "strategy": "Question",
                   "response": f"reply {i}"})
    return {"record": "generation", "dialogue_id": f"d{i}", "round_index": 1, "lang": "en",
            "history": [{"role": "seeker", "text": f"hello {i}"}], "reference": f"real {i}", "candidate": cand,
            "status": "ok"}


def test_export_then_import_with_csv_jsonl_and_label_studio(tmp_path: Path) -> None:
    gens = tmp_path / "gens.jsonl"
    write_jsonl(gens, [_gen(i) for i in range(4)] + [{**_gen(9), "candidate": "no tags"}])
    exp = tmp_path / "exp"
    assert main(["annotate", "export", "--quiet", "--out", str(exp), str(gens)]) == 0
    tasks = list(read_jsonl(exp / "tasks.jsonl"))
    assert len(tasks) == 4
    assert json.loads((exp / "manifest.json").read_text())["counts"]["skipped_not_cer"] == 1
    assert "<Choices name=\"preference\"" in (exp / "label_studio_config.xml").read_text()
    assert len(json.loads((exp / "label_studio_tasks.json").read_text())) == 4
    ids = [t["task_id"] for t in tasks]
    # annotator A: CSV as exported, filled in
    rows = list(csv.DictReader((exp / "tasks.csv").open(encoding="utf-8")))
    a_labels = [("True", "True", "False", "first"), ("True", "False", "True", "second"),
                ("False", "True", "True", "both_good"), ("True", "True", "True", "neither")]
    for row, (s1, s2, s3, p) in zip(rows, a_labels):
        row.update(step1=s1, step2=s2, step3=s3, preference=p, rationale="")
    with (tmp_path / "a.csv").open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    # annotator B: JSONL; disagrees on task 1 step2 and on task 3 preference
    b = [{"task_id": ids[0], "step1": "True", "step2": "True", "step3": "False", "preference": "first"},
         {"task_id": ids[1], "labels": {"step1": True, "step2": True, "step3": True, "preference": "second"}},
         {"task_id": ids[2], "step1": "false", "step2": "true", "step3": "true", "preference": "both good"},
         {"task_id": ids[3], "step1": "True", "step2": "True", "step3": "True", "preference": "first"}]
    write_jsonl(tmp_path / "b.jsonl", b)
    # adjudicator: Label Studio export; settles task 1 (step2 False) but not task 3 (says "second")
    ls = [{"data": {"task_id": ids[1]}, "annotations": [{"result": [
              {"from_name": "step2", "type": "choices", "value": {"choices": ["False"]}}]}]},
          {"data": {"task_id": ids[3]}, "annotations": [{"result": [
              {"from_name": "preference", "type": "choices", "value": {"choices": ["second"]}}]}]}]
    (tmp_path / "c.json").write_text(json.dumps(ls))
    imp = tmp_path / "imp"
    assert main(["annotate", "import", "--quiet", "--out", str(imp), "--annotator", str(tmp_path / "a.csv"),
                 "--annotator", str(tmp_path / "b.jsonl"), "--adjudicator", str(tmp_path / "c.json"),
                 str(exp / "tasks.jsonl")]) == 0
    items = {it["task_id"]: it for it in read_jsonl(imp / "items.jsonl")}
    assert set(items) == {ids[0], ids[1], ids[2]}
    assert items[ids[1]]["labels"] == {"step1": True, "step2": False, "step3": True, "preference": "second"}
    assert items[ids[2]]["labels"]["preference"] == "both_good" and items[ids[0]]["source"] == "annotated"
    m = json.loads((imp / "manifest.json").read_text())["counts"]
    assert m["kept"] == 3 and m["dropped"] == 1 and m["no_agreement"]["preference"] == 1
    assert m["agreed_without_adjudicator"] == 2 and m["adjudicated"] == 1
    assert m["annotators"]["step2"]["items"] == 4 and m["annotators"]["step2"]["agreement"] == pytest.approx(0.75)
    assert m["annotators"]["preference"]["kappa"] == pytest.approx(kappa(["first", "second", "both_good", "neither"],
                                                                           ["first", "second", "both_good", "first"]))


def test_import_needs_two_annotators(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "t.jsonl", [])
    assert main(["annotate", "import", "--out", str(tmp_path / "o"), "--annotator", str(tmp_path / "t.jsonl"),
                 str(tmp_path / "t.jsonl")]) == 2


def test_merge_and_report_direct() -> None:
    tasks = [{"task_id": "t1", "dialogue_id": "d", "history": [], "reference": "r", "candidate": "c"}]
    full = {"step1": True, "step2": True, "step3": True, "preference": "first"}
    kept, dropped, _ = merge(tasks, [{"t1": full}, {"t1": {**full, "step3": False}}, {}], [{}, {}, {}])
    assert not kept and dropped == [{"task_id": "t1", "no_agreement": ["step3"]}]
    rep = agreement_report({"t1": full}, {"t1": full})
    assert rep["step1"] == {"items": 1, "agreement": 1.0, "kappa": None}
    assert label_studio_config().startswith("<View>")


def test_read_labels_counts_invalid(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "x.jsonl", [{"task_id": "t", "step1": "maybe", "preference": "first"}, {"step1": "True"}])
    labels, _, invalid = read_labels(tmp_path / "x.jsonl")
    assert labels == {"t": {"preference": "first"}} and invalid == 2
