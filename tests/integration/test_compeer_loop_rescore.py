"""``compeer-loop rescore`` with a real engine: a loop folder's two answered evaluation records compared again by a
named base served bare (``base:smollm2-135m``, the one the CPU default install converts; transformers engine on the
CPU, the engine ``compeer-loop eval`` scores with), through the CLI. ~15 s on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compeer_loop import cli
from compeer_loop.plan import LoopSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HISTORY = [{"role": "seeker", "text": "I lost my job last week and I cannot sleep."}]


def test_rescore_with_a_real_named_base(tmp_path: Path) -> None:
    root, out = tmp_path / "loop", tmp_path / "rescored"
    (root / "eval" / "a").mkdir(parents=True)
    plan = LoopSettings(prompts="/data", arms=["a"], eval_policies=["a"], device="cpu", eval_concurrency=2)
    (root / "plan.json").write_text(json.dumps(plan.to_json()))
    rows = [{"id": f"p{i}", "status": "ok", "history": HISTORY, "text": text, "rouge_l": 1.0,
             "reference": "I am so sorry. Losing a job is a shock; what has kept you awake at night?",
             "independent_status": "ok", "independent_win": 1.0, "independent_scorer": "an-older-scorer"}
            for i, text in enumerate(("That sounds so hard. What keeps you up?", "ok."))]
    rows.append({"id": "p2", "status": "engine_error", "history": HISTORY, "text": ""})
    (root / "eval" / "a" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    assert cli.main(["rescore", "--root", str(root), "--out", str(out), "--scorer", "base:smollm2-135m"]) == 0
    records = [json.loads(line) for line in (out / "eval" / "a" / "records.jsonl").read_text().splitlines()]
    assert records[2] == rows[2] and [r["rouge_l"] for r in records[:2]] == [1.0, 1.0]
    for r in records[:2]:
        assert r["independent_scorer"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert r["independent_status"] in ("ok", "failed")
        assert (r["independent_win"] is None) == (r["independent_status"] != "ok")
        assert r["independent_win"] in (None, 0.0, 0.5, 1.0)
    manifest = json.loads((out / "eval" / "a" / "compared" / "manifest.json").read_text())
    assert manifest["config"]["scorer"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert json.loads((out / "plan.json").read_text())["independent_scorer"] == "base:smollm2-135m"
    done = json.loads((out / "rescored.json").read_text())
    assert done["status"] == "done" and sum(done["policies"]["a"]["independent_status"].values()) == 2
