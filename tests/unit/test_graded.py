"""Graded rewards: the rules (:mod:`cer.rewards`), the judge reading label probabilities through retries, the wire
fields on both fronts, the cache (round trip, records written before graded rewards) and ``/get_reward``'s choice.
The engine is the FAKE one (tests/fake_engine.py) with fake logprobs (:func:`verdict_logprobs`)."""

from __future__ import annotations

from typing import Any

import pytest

from cer import rewards
from cer.modes import JudgeMode
from cer.reasoning import parse
from cer.rewards import RewardKind
from cer.taxonomy import load_taxonomy
from cer.verdicts import Preference
from judge.conversation import Judge, judgment_rewards
from judge.engines.base import GenParams, Message
from judge.protocol import JudgeSettings, load_template
from reward_server.cache import MemoryCache, cache_key
from reward_server.config import GetRewardSettings
from reward_server.grpc import convert
from reward_server.http.convert import group_from_json
from tests.fake_engine import FakeEngine, verdict_logprobs
from tests.unit.fakes import scripted_judge
from tests.unit.test_dialogue_scoring import PROMPT
from tests.unit.test_reward_service import GOOD, body, make_service

# the fake judge writes True / second with probability 0.8 (the other labels share 0.2)
STEP_08 = 2 * 0.8 - 1
PREF_08 = 2 * (0.8 + 0.2 / 3) - 1  # second + both_good favourable, first + neither not
GRADED_08 = {"steps": [pytest.approx(STEP_08)] * 3, "preference": pytest.approx(PREF_08), "format": 1.0,
             "reply": None, "total": pytest.approx(3 * STEP_08 + PREF_08 + 1.0)}


def test_graded_rules() -> None:
    assert rewards.graded_step_reward(0.8) == pytest.approx(0.6) and rewards.graded_step_reward(None) is None
    probs = {Preference.SECOND: 0.5, Preference.BOTH_GOOD: 0.2, Preference.FIRST: 0.2, Preference.NEITHER: 0.1}
    assert rewards.graded_preference_reward(probs) == pytest.approx(0.4)
    full, no_emotion = parse(GOOD), parse(GOOD.replace("<emotion>negative; shame; 4</emotion>", ""))
    g = rewards.graded_candidate_rewards(full, JudgeMode.UNIFIED, [0.8, 0.5, 1.0], probs)
    assert (g.steps, g.preference, g.format) == (pytest.approx([0.6, 0.0, 1.0]), pytest.approx(0.4), 1.0)
    assert g.total == pytest.approx(3.0)
    # a missing part counts -1 as in the discrete rule; a judged component without probabilities has no reward
    g = rewards.graded_candidate_rewards(no_emotion, JudgeMode.UNIFIED, [0.8, None, 1.0], probs)
    assert g.steps[1] == -1.0 and g.format == -1.0 and g.total == pytest.approx(0.6 - 1 + 1 + 0.4 - 1)
    assert rewards.graded_candidate_rewards(full, JudgeMode.UNIFIED, [0.8, None, 1.0], probs).total is None
    assert rewards.graded_candidate_rewards(full, JudgeMode.UNIFIED, [0.8, 0.5, 1.0], None).total is None
    assert rewards.graded_candidate_rewards(full, JudgeMode.PRM, [1.0, 1.0, 0.0], None).total == pytest.approx(2.0)
    assert rewards.graded_candidate_rewards(full, JudgeMode.ORM, [], probs).total == pytest.approx(1.4)
    reply = rewards.graded_candidate_rewards(full, JudgeMode.REPLY, [], None, reply_p_true=0.9)
    assert (reply.reply, reply.total, reply.format) == (pytest.approx(0.8), pytest.approx(0.8), None)


def _fail_first_step1() -> Any:
    """FAKE judge: the scripted one, but the first answer to step 1 is unparsable (a retry follows)."""
    base, seen = scripted_judge(), set()

    def respond(messages: list[Message], params: GenParams) -> str:
        if len(messages) == 2 and "first" not in seen:
            seen.add("first")
            return "Rationale: no verdict line"
        return base(messages, params)

    return respond


async def test_judge_reads_label_probabilities_through_retries() -> None:
    engine = FakeEngine(_fail_first_step1(), logprobs=verdict_logprobs(0.8))
    await engine.start()
    judge = Judge(engine, load_template(), load_taxonomy(), JudgeSettings(max_retries=1))
    assert judge.graded
    history = group_from_json(body([GOOD])).history
    j = await judge.judge(history, "That must be frustrating.", parse(GOOD), JudgeMode.UNIFIED)
    asked = {c.params.logprobs for c in engine.calls}
    assert len(engine.calls) == 5 and asked == {20}  # the retry asks too; unmasked logprobs: 20 by default
    assert [j.p_true(c) for c in ("step1", "step2", "step3")] == pytest.approx([0.8] * 3)
    assert j.preference_probs() == pytest.approx({Preference.FIRST: 0.2 / 3, Preference.SECOND: 0.8,
                                                  Preference.BOTH_GOOD: 0.2 / 3, Preference.NEITHER: 0.2 / 3})
    discrete, graded = judgment_rewards(j, parse(GOOD), JudgeMode.UNIFIED)
    assert discrete.total == 5.0 and graded.total == pytest.approx(GRADED_08["total"])
    # off by setting, or an engine without logprobs: nothing is asked and there is no graded total
    for settings, maker in [(JudgeSettings(verdict_probs=False), verdict_logprobs()), (JudgeSettings(), None)]:
        plain = FakeEngine(scripted_judge(), logprobs=maker)
        await plain.start()
        judge = Judge(plain, load_template(), load_taxonomy(), settings)
        j = await judge.judge(history, "That must be frustrating.", parse(GOOD), JudgeMode.UNIFIED)
        assert not judge.graded and {c.params.logprobs for c in plain.calls} == {None} and j.probs == {}
        assert judgment_rewards(j, parse(GOOD), JudgeMode.UNIFIED)[1].total is None


async def test_wire_fields_on_both_fronts_and_info() -> None:
    async for s in make_service(logprobs=verdict_logprobs(0.8)):
        b = body([GOOD])
        http = (await s.http.post("/v1/score", json=b)).json()
        grpc_json = convert.group_response_from_pb(await s.grpc_score(b)).to_json()
        for res in (http["results"][0], grpc_json["results"][0]):
            assert res["rewards"]["total"] == 5.0 and res["graded_rewards"] == GRADED_08
            assert [st["p_true"] for st in res["steps"]] == pytest.approx([0.8] * 3)
            assert res["preference"]["probs"] == pytest.approx({"first": 0.2 / 3, "second": 0.8,
                                                                "both_good": 0.2 / 3, "neither": 0.2 / 3})
        assert http["meta"]["graded"] and grpc_json["meta"]["graded"]
        assert (await s.http.get("/v1/info")).json()["graded"]
        assert convert.info_from_pb(await s.stub.Info(convert.pb.InfoRequest())).graded
        # an invalid candidate has no graded rewards
        assert (await s.http.post("/v1/score", json=body([""]))).json()["results"][0]["graded_rewards"] is None
    async for s in make_service():  # an engine without logprobs: no graded rewards, said so
        res = (await s.http.post("/v1/score", json=body([GOOD]))).json()
        assert res["results"][0]["graded_rewards"] is None and not res["meta"]["graded"]
        assert res["results"][0]["steps"][0]["p_true"] is None and res["results"][0]["preference"]["probs"] is None
        assert not (await s.http.get("/v1/info")).json()["graded"]


async def test_cache_round_trip_and_records_from_before_graded_rewards() -> None:
    cache = MemoryCache()
    async for s in make_service(logprobs=verdict_logprobs(0.8), cache=cache):
        b = body([GOOD])
        first = (await s.http.post("/v1/score", json=b)).json()["results"][0]
        again = (await s.http.post("/v1/score", json=b)).json()["results"][0]
        assert again["cache_hit"] and again["graded_rewards"] == first["graded_rewards"] == GRADED_08
        assert again["preference"]["probs"] == first["preference"]["probs"]
        # a record an older server wrote under this key (no format, no probabilities) is a miss, judged again
        req = group_from_json(b)
        key = cache_key(s.core.judge, JudgeMode.UNIFIED, req.history, req.reference, parse(GOOD))
        assert key is not None
        old = {"verdicts": {"step1": True, "step2": True, "step3": True, "preference": "second"},
               "judged": ["preference", "step1", "step2", "step3"], "texts": ["x"] * 4, "generations": 4}
        await cache.set_many({key: old})
        calls = len(s.engine.calls)
        fresh = (await s.http.post("/v1/score", json=b)).json()["results"][0]
        assert not fresh["cache_hit"] and len(s.engine.calls) == calls + 4 and fresh["graded_rewards"] == GRADED_08
        assert (await cache.get_many([key]))[0]["format"] == 2  # and the record is rewritten in the new format


def _no_preference_logprobs(text: str, params: GenParams) -> Any:
    """FAKE logprobs, missing on the preference round."""
    return None if "compared" in text else verdict_logprobs(0.8)(text, params)


async def test_get_reward_returns_graded_totals_by_default() -> None:
    query = {"query": [PROMPT + GOOD], "prompts": [PROMPT], "labels": ["That must be frustrating."]}
    async for s in make_service(logprobs=verdict_logprobs(0.8), server={"get_reward": GetRewardSettings()}):
        assert (await s.http.post("/get_reward", json=query)).json()["rewards"] == [GRADED_08["total"]]
    async for s in make_service(logprobs=verdict_logprobs(0.8),
                                server={"get_reward": GetRewardSettings(kind=RewardKind.DISCRETE)}):
        assert (await s.http.post("/get_reward", json=query)).json()["rewards"] == [5.0]
    async for s in make_service(server={"get_reward": GetRewardSettings()}):  # graded asked, none served: said so
        r = await s.http.post("/get_reward", json=query)
        assert r.status_code == 422 and r.json()["error"]["field"].startswith("get_reward.kind")
    async for s in make_service(logprobs=_no_preference_logprobs, server={"get_reward": GetRewardSettings()}):
        r = await s.http.post("/get_reward", json=query)  # a missing graded total is never filled in
        assert r.status_code == 502 and "no graded reward" in r.json()["error"]["message"]
