"""Dialogue scoring, OpenRLHF's /get_reward and the veRL reward function, in-process: the core behind both fronts
with a FAKE engine (scripted judge) and a FAKE embedder. Requests are shaped as each framework sends them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import uvicorn

from cer.modes import JudgeMode
from cer.rewards import RewardKind
from judge.engines.base import GenParams, Message
from reward_server import verl
from reward_server.config import GetRewardSettings
from reward_server.get_reward import map_query, parse_chat
from reward_server.grpc import dialogue_convert
from reward_server.http.app import create_app
from reward_server.http.dialogues import dialogue_request
from reward_server.types import Limits
from tests.fake_engine import verdict_logprobs
from tests.unit.fakes import scripted_judge
from tests.unit.test_reward_service import GOOD, Service, make_service

SEEKER1 = "I failed my driving test again."
SEEKER2 = "I panicked at the roundabout."
PLAIN = "That sounds really stressful. What happened at the roundabout?"
DIALOGUE: dict[str, Any] = {"turns": [
    {"role": "seeker", "text": SEEKER1},
    {"role": "supporter", "text": GOOD, "reference": "That must be frustrating."},
    {"role": "seeker", "text": SEEKER2},
    {"role": "supporter", "text": PLAIN},
]}


def judge_with(reply: str = "True", broken_reply: bool = False) -> Any:
    """FAKE judge: the scripted judge, but a reply round answers ``reply`` (or nothing parsable)."""
    base = scripted_judge()

    def respond(messages: list[Message], params: GenParams) -> str:
        if "Is this a good next supporter turn" in messages[-1]["content"]:
            return "Rationale: hmm." if broken_reply else f"Rationale: fits.\nVerdict: {reply}"
        return base(messages, params)

    return respond


@pytest.fixture
async def svc() -> AsyncIterator[Service]:
    # the judge is sure of every verdict it writes: graded rewards equal the discrete ones
    async for s in make_service(judge_with(), server={"get_reward": GetRewardSettings()},
                                logprobs=verdict_logprobs(1.0)):
        yield s


async def test_dialogue_scored_identically_over_both_fronts(svc: Service) -> None:
    r = await svc.http.post("/v1/dialogues:score", json=DIALOGUE)
    assert r.status_code == 200, r.text
    body = r.json()
    cer, plain = body["turns"]
    assert (cer["index"], cer["mode"], cer["status"]) == (1, "unified", "ok")
    assert cer["rewards"] == {"steps": [1.0, 1.0, 1.0], "preference": 1.0, "format": 1.0, "reply": None, "total": 5.0}
    assert cer["reply"] is None
    # a plain reply: judged point-wise, no step, preference or format score
    assert (plain["index"], plain["mode"], plain["status"]) == (3, "reply", "ok")
    assert plain["steps"] == [] and plain["preference"] is None
    assert plain["reply"] == {"verdict": True, "valid": True, "judged": True, "p_true": 1.0}
    assert plain["rewards"] == plain["graded_rewards"] == {"steps": [], "preference": None, "format": None,
                                                           "reply": 1.0, "total": 1.0}
    agg = body["aggregate"]
    assert (agg["turns"], agg["scorable"], agg["scored"], agg["mean_total"], agg["min_total"]) == (2, 2, 2, 3.0, 1.0)
    assert agg["components"] == {"step1": 1.0, "step2": 1.0, "step3": 1.0, "preference": 1.0, "format": 1.0,
                                 "reply": 1.0}
    assert agg["by_mode"] == {"unified": {"scored": 1, "mean_total": 5.0, "min_total": 5.0},
                              "reply": {"scored": 1, "mean_total": 1.0, "min_total": 1.0}}
    assert body["meta"]["mode"] == "unified" and body["meta"]["judge_rounds"] == 5 and body["meta"]["graded"]

    pb_req = dialogue_convert.dialogue_request_to_pb(dialogue_request(DIALOGUE))
    via_grpc = dialogue_convert.dialogue_response_from_pb(await svc.stub.ScoreDialogue(pb_req)).to_json()
    assert [dict(t, cache_hit=None) for t in via_grpc["turns"]] == [dict(t, cache_hit=None) for t in body["turns"]]
    assert via_grpc["aggregate"] == agg


async def test_each_turn_is_judged_against_the_reply_history_before_it(svc: Service) -> None:
    await svc.http.post("/v1/dialogues:score", json=DIALOGUE)
    firsts = [c.messages[1]["content"] for c in svc.engine.calls if len(c.messages) == 2]
    assert len(firsts) == 2
    cer_round = next(m for m in firsts if "Step 1" in m)
    reply_round = next(m for m in firsts if "Is this a good next supporter turn" in m)
    assert SEEKER1 in cer_round and SEEKER2 not in cer_round
    # the later turn sees the earlier supporter turn as its reply only, never its reasoning
    assert "Supporter: That sounds so discouraging." in reply_round and "exploration" not in reply_round
    assert reply_round.index(SEEKER1) < reply_round.index(SEEKER2) < reply_round.index(PLAIN)


async def test_reply_verdicts_false_and_unparsable() -> None:
    async for s in make_service(judge_with(reply="False")):
        res = (await s.http.post("/v1/dialogues:score", json=DIALOGUE)).json()
        assert res["turns"][1]["rewards"]["total"] == -1.0 and res["aggregate"]["min_total"] == -1.0
    async for s in make_service(judge_with(broken_reply=True), max_retries=1):
        res = (await s.http.post("/v1/dialogues:score", json=DIALOGUE)).json()
        plain = res["turns"][1]
        assert plain["status"] == "parse_failed" and plain["rewards"]["total"] is None
        assert plain["reply"] == {"verdict": None, "valid": False, "judged": True, "p_true": None}
        assert res["aggregate"]["scored"] == 1 and res["aggregate"]["mean_total"] == 5.0
        assert "reply" not in res["aggregate"]["components"]


async def test_score_group_serves_mode_reply(svc: Service) -> None:
    history = [{"role": t["role"], "text": t["text"]} for t in DIALOGUE["turns"][:3]]  # history turns: no reference
    body = {"history": history, "candidates": [PLAIN, GOOD], "options": {"mode": "reply"}}
    res = (await svc.http.post("/v1/score", json=body)).json()["results"]
    assert [r["rewards"]["total"] for r in res] == [1.0, 1.0]
    assert res[0]["format"]["missing"] == ["analysis", "emotion", "strategy", "response"]
    assert res[1]["format"] == {"ok": True, "missing": []}
    assert "That sounds so discouraging." in svc.engine.calls[-1].messages[-1]["content"]  # the reply part of GOOD
    assert JudgeMode.REPLY.value in (await svc.http.get("/v1/info")).json()["modes"]


@pytest.mark.parametrize(("turns", "field", "words"), [
    ([], "turns", "at least 1"),
    ([{"role": "seeker", "text": "hi"}] * 66, "turns", "limit of 65"),
    ([{"role": "seeker", "text": "hi"}, {"role": "supporter", "text": " "}], "turns[1].text", "empty"),
    ([{"role": "seeker", "text": "x" * 8001}, {"role": "supporter", "text": "ok"}], "turns[0].text", "8000"),
    ([{"role": "seeker", "text": "hi", "reference": "r"}, {"role": "supporter", "text": "ok"}], "turns[0].reference",
     "supporter"),
    ([{"role": "helper", "text": "hi"}], "turns[0].role", "seeker"),
    ([{"role": "seeker", "text": "hi"}], "turns", "no supporter turn"),
])
async def test_bad_dialogue_names_field_and_limit(svc: Service, turns: list[Any], field: str, words: str) -> None:
    r = await svc.http.post("/v1/dialogues:score", json={"turns": turns})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert (err["code"], err["field"]) == ("INVALID_ARGUMENT", field) and words in err["message"], err


async def test_bad_dialogue_over_grpc(svc: Service) -> None:
    req = dialogue_convert.dialogue_request_to_pb(dialogue_request({"turns": [{"role": "seeker", "text": "hi"}] * 66}))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await svc.stub.ScoreDialogue(req)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.value.details().startswith("turns: ")


async def test_one_bad_turn_does_not_lose_the_others(svc: Service) -> None:
    turns = [dict(t) for t in DIALOGUE["turns"]]
    del turns[1]["reference"]  # a CER turn in mode unified needs one
    res = (await svc.http.post("/v1/dialogues:score", json={"turns": turns})).json()
    bad, good = res["turns"]
    assert bad["status"] == "invalid_input" and bad["error"]["field"] == "turns[1].reference"
    assert good["status"] == "ok" and good["rewards"]["total"] == 1.0
    assert (res["aggregate"]["turns"], res["aggregate"]["scorable"], res["aggregate"]["scored"]) == (2, 1, 1)
    prm = (await svc.http.post("/v1/dialogues:score", json={"turns": turns, "options": {"mode": "prm"}})).json()
    assert [t["rewards"]["total"] for t in prm["turns"]] == [4.0, 1.0]


# ---- OpenRLHF: POST /get_reward ---------------------------------------------------------------------------------
SYSTEM = "<|im_start|>system\nYou are an emotional-support assistant.<|im_end|>\n"


def chatml_prompt(*turns: tuple[str, str]) -> str:
    """What ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` writes for a
    ChatML model (SmolLM2, Qwen2.5)."""
    return SYSTEM + "".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in turns) + "<|im_start|>assistant\n"


PROMPT = chatml_prompt(("user", SEEKER1), ("assistant", GOOD), ("user", SEEKER2))


def test_query_mapping() -> None:
    m = map_query(PROMPT + GOOD + "<|im_end|>", PROMPT, "That must be frustrating.")
    assert [(t.role.value, t.text) for t in m.history] == [
        ("seeker", SEEKER1), ("supporter", "That sounds so discouraging."), ("seeker", SEEKER2)]
    assert m.response == GOOD and m.reference == "That must be frustrating."
    assert map_query(PROMPT + PLAIN, None, "").response == PLAIN  # split at the last assistant header; no label
    llama = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user"
             f"<|end_header_id|>\n\n{SEEKER1}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert [t.text for t in parse_chat(llama)] == [SEEKER1]
    # a prompt the query does not start with (a decode round trip may change whitespace): split at the header
    assert map_query(PROMPT + PLAIN, PROMPT.replace("\n", " \n"), None).history == m.history
    for query, prompt, why in [("plain text", None, "assistant header"), ("plain text", "other", "assistant header"),
                               (PROMPT, PROMPT, "empty"), ("Hello " + PLAIN, "Hello ", "chat format")]:
        with pytest.raises(ValueError, match=why):
            map_query(query, prompt, None)


async def test_get_reward_with_openrlhf_request(svc: Service) -> None:
    body = {"query": [PROMPT + GOOD + "<|im_end|>", PROMPT + GOOD.replace("4", "5") + "<|im_end|>"],
            "prompts": [PROMPT, PROMPT], "labels": ["That must be frustrating.", "That must be frustrating."]}
    r = await svc.http.post("/get_reward", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rewards"] == [5.0, 5.0] and out["scores"] == [1.0, 1.0]
    assert out["extra_logs"] == {"compeer_scored": [1.0, 1.0]} and out["statuses"] == ["ok", "ok"]
    assert len(svc.engine.calls) == 8  # one group of two candidates, 4 rounds each


async def test_get_reward_never_invents_a_reward() -> None:
    good = PROMPT + GOOD
    async for s in make_service(judge_with(broken_reply=True), max_retries=0,
                                server={"get_reward": GetRewardSettings(mode=JudgeMode.REPLY,
                                                                        kind=RewardKind.DISCRETE)}):
        r = await s.http.post("/get_reward", json={"query": [good, "not a chat"], "prompts": [PROMPT, None]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "query[1]"
        r = await s.http.post("/get_reward", json={"query": [good], "prompts": [PROMPT], "labels": [None]})
        assert r.status_code == 502 and r.json()["error"] == {
            "code": "UNSCORED", "field": "query[0]", "message": r.json()["error"]["message"]}
        assert "parse_failed" in r.json()["error"]["message"]
    async for s in make_service(judge_with(), server={"get_reward": GetRewardSettings(failure_reward=-7.0)},
                                logprobs=verdict_logprobs(1.0)):
        r = await s.http.post("/get_reward", json={"query": [good, "not a chat"], "prompts": [PROMPT, None],
                                                   "labels": ["That must be frustrating.", None]})
        out = r.json()
        assert out["rewards"] == [5.0, -7.0] and out["scores"] == [1.0, 0.0]
        assert out["extra_logs"]["compeer_scored"] == [1.0, 0.0] and out["statuses"] == ["ok", "invalid_input"]
        assert "assistant header" in out["errors"]["1"]


async def test_get_reward_limits(svc: Service) -> None:
    for body, field in [({"query": ["a"] * 257}, "query"), ({"prompts": []}, "query"),
                        ({"query": ["a"], "prompts": ["a", "b"]}, "prompts"), ({"query": [3]}, "query[0]")]:
        r = await svc.http.post("/get_reward", json=body)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, (body, r.text)
    assert Limits().max_queries == 256


# ---- veRL: compute_score ---------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_verl_compute_score_over_http(svc: Service) -> None:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(svc.core), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        history = [{"role": "system", "content": "be kind"}, {"role": "user", "content": SEEKER1},
                   {"role": "assistant", "content": "I'm sorry. What happened?"}, {"role": "user", "content": SEEKER2}]
        # exactly as veRL's naive reward manager calls it (keyword arguments, extra_info from the dataset row)
        score = await asyncio.to_thread(verl.compute_score, data_source="esconv", solution_str=GOOD,
                                        ground_truth="That must be frustrating.",
                                        extra_info={"history": history, "num_turns": None}, url=url)
        assert score["score"] == 5.0 and score["status"] == "ok"
        plain = await asyncio.to_thread(verl.compute_score, "esconv", PLAIN, None, {"history": history},
                                        url=url, mode="reply")
        assert plain["score"] == 1.0 and plain["reply_reward"] == 1.0
        with pytest.raises(verl.CompeerRewardError, match="reference"):  # unified needs the reference
            await asyncio.to_thread(verl.compute_score, "esconv", GOOD, "", {"history": history}, url=url)
        failed = await asyncio.to_thread(verl.compute_score, "esconv", GOOD, "", {"history": history}, url=url,
                                         failure_reward=-5.0)
        assert failed["score"] == -5.0 and failed["scored"] == 0.0
        with pytest.raises(verl.CompeerRewardError, match="history"):
            await asyncio.to_thread(verl.compute_score, "esconv", GOOD, "ref", {}, url=url)
        # veRL's batch reward manager: lists, one /v1/score:batch call
        batch = await asyncio.to_thread(verl.compute_score_batch, data_sources=["esconv"] * 3,
                                        solution_strs=[GOOD, PLAIN, GOOD],
                                        ground_truths=["That must be frustrating.", None, ""],
                                        extra_infos=[{"history": history}, {"history": history}, {}],
                                        url=url, failure_reward=-9.0)
        assert [b["score"] for b in batch] == [5.0, -9.0, -9.0]  # unified: the plain reply lacks its parts and the reference, the 3rd its history
        with pytest.raises(verl.CompeerRewardError, match="item 1"):
            await asyncio.to_thread(verl.compute_score_batch, ["esconv"] * 2, [GOOD, GOOD],
                                    ["That must be frustrating.", ""], [{"history": history}] * 2, url=url)
    finally:
        server.should_exit = True
        await task
