"""The service's cache key is the judge library's (:meth:`judge.conversation.Judge.judgment_key`): every input that
decides a judgment changes it (the messages sent, the sampling, the engine and its weights, the bounds, the
taxonomy, the template), nothing else does (request id, deadline, client, unrelated settings and their order), and
both fronts share entries through the one core. The engine is the FAKE one (tests/fake_engine.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from cer.dialogue import Role, Turn
from cer.modes import JudgeMode
from cer.reasoning import parse
from judge.engines.base import EngineConfig
from judge.engines.settings import VllmSettings
from judge.engines.vllm_engine import VllmEngine
from judge.generation import content_key
from judge.protocol import JudgeSettings
from judge.settings import options
from reward_server.cache import KEY_PREFIX, MemoryCache, cache_key
from reward_server.config import ServerConfig
from reward_server.core import RewardCore
from reward_server.grpc import convert
from reward_server.types import Limits
from tests.fake_engine import FakeEngine, verdict_logprobs
from tests.unit.test_reward_service import GOOD, HISTORY, body, make_service

TEMPLATES = Path(__file__).resolve().parents[2] / "judge" / "templates"
ENGINE = EngineConfig(backend="fake", model_id="fake-judge", revision="r1")
REQUEST: dict[str, Any] = {"history": [Turn(Role(t["role"]), t["text"]) for t in HISTORY],
                           "reference": "That must be frustrating.", "candidate": GOOD, "mode": JudgeMode.UNIFIED}


def key(engine: dict[str, Any] | None = None, judge: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None, line_bound: bool = False, **request: Any) -> str:
    """The cache key of one candidate on a server built from these settings (a regex-taking engine with logprobs)."""
    fake = FakeEngine(config=dataclasses.replace(ENGINE, **(engine or {})), supports_regex=True,
                      supports_line_bound=line_bound, logprobs=verdict_logprobs(), supports_prefix=True)
    config = ServerConfig(engine=fake.config, judge=JudgeSettings(**(judge or {})), **(server or {}))
    core = RewardCore(config, fake, None, MemoryCache())
    r = {**REQUEST, **request}
    k = cache_key(core.judge, r["mode"], r["history"], r["reference"], parse(r["candidate"]))
    assert k is not None
    return k


def test_every_judge_setting_that_changes_an_answer_is_in_the_cache_key() -> None:
    """Servers sharing one Redis with different retry temperatures or rationale bounds must not share entries."""
    base = key()
    # every judge setting can change what a judgment says (verdict_probs: whether it has label probabilities)
    changed = {"max_tokens_per_component": 64, "temperature": 0.5, "top_p": 0.9, "seed": 3, "max_retries": 1,
               "retry_temperature": 1.0, "rationale_max_chars": 50, "constrain": False, "verdict_probs": False,
               "independent_rounds": True, "answer_prefix": True, "verdict_top_k": 5, "verdict_temperature": 2.0}
    assert {o.path[-1] for o in options(JudgeSettings)} == set(changed)
    for name, value in changed.items():
        assert key(judge={name: value}) != base, name


def test_what_reaches_the_engine_and_who_answers_are_in_the_key(tmp_path: Path) -> None:
    """The issue's hole: the taxonomy, the backend and the bounds were not in the hand-picked key."""
    taxonomy = yaml.safe_load((Path(__file__).resolve().parents[2] / "cer" / "data" / "taxonomy.yaml").read_text())
    taxonomy["strategies"] = taxonomy["strategies"][:4]
    (tmp_path / "tax.yaml").write_text(yaml.safe_dump(taxonomy))
    template = yaml.safe_load((TEMPLATES / "unifireward-v2.yaml").read_text())
    (tmp_path / "same-text.yaml").write_text(yaml.safe_dump({**template, "version": "unifireward-v2-copy"}))
    (tmp_path / "other-system.yaml").write_text(yaml.safe_dump({**template, "system": template["system"] + " Be brief."}))
    base = key()
    variants = {
        "taxonomy": key(server={"taxonomy": str(tmp_path / "tax.yaml")}),
        "template version": key(server={"template": str(tmp_path / "same-text.yaml")}),
        "template text": key(server={"template": str(tmp_path / "other-system.yaml")}),
        "backend": key(engine={"backend": "openai"}),
        "model": key(engine={"model_id": "other-judge"}),
        "weights digest": key(engine={"revision": "weights-sha256:0123456789abcdef"}),
        "adapter": key(engine={"adapter_id": "lora@sha256:0123456789ab"}),
        "engine seed": key(engine={"seed": 1}),
        "dtype": key(engine={"dtype": "bfloat16"}),
        "resolved precision": key(engine={"precision": "cuda:bfloat16"}),
        "line bound": key(line_bound=True),
        "history": key(history=[*REQUEST["history"][:-1], Turn(Role.SEEKER, "I panicked on the motorway.")]),
        "reference": key(reference="That sounds hard."),
        "candidate step": key(candidate=GOOD.replace("exploration", "comforting")),
        "candidate reply": key(candidate=GOOD.replace("discouraging", "hard")),
        "mode": key(mode=JudgeMode.PRM),
    }
    assert base not in variants.values() and len(set(variants.values())) == len(variants), variants
    # the vLLM engine ends an over-long line by re-generating (max_tokens) or masking (line): same GenParams, so its
    # identity says which
    bounds = {VllmEngine(EngineConfig(backend="vllm", rationale_bound=b)).identity()["rationale_bound"]
              for b in ("counted", "max_tokens", "line")}
    assert bounds == {"counted", "max_tokens", "line"}
    # the transformers engine's bound (the same setting) reaches the key through what it is sent: with ``line`` it
    # takes the line bound (the "line bound" variant above), with ``counted`` the bound stays in the regex
    from judge.engines.hf.engine import TransformersEngine

    takes = {b: TransformersEngine(EngineConfig(backend="transformers", rationale_bound=b)).supports_line_bound
             for b in ("line", "counted")}
    assert takes == {"line": True, "counted": False}


def test_nothing_else_changes_the_key() -> None:
    base = key()
    same = [
        key(server={"grpc_port": 1, "http_port": 2, "cache_ttl_s": 5.0, "default_timeout_s": 3.0,
                    "max_in_flight_groups": 2, "limits": Limits(max_candidates=3)}),
        key(engine={"max_model_len": 8192, "vllm": VllmSettings(gpu_memory_utilization=0.5, max_num_batched_tokens=16384)}),
        # text the judge is not shown differently: whitespace in the history and around the candidate's tags
        key(history=[Turn(t.role, f"  {t.text.replace(' ', '  ')} ") for t in REQUEST["history"]]),
        key(candidate=GOOD.replace("</analysis><emotion>", "</analysis>\n\n<emotion>")),
    ]
    assert set(same) == {base}
    # the key's hash does not depend on the order settings were given in
    assert content_key({"a": 1, "b": {"c": 2, "d": 3}}) == content_key({"b": {"d": 3, "c": 2}, "a": 1})


async def test_fronts_share_entries_and_differently_configured_replicas_do_not(tmp_path: Path) -> None:
    """Request ids, deadlines, clients and output options stay out of the key: an entry written through HTTP is read
    through gRPC; a replica with another taxonomy on the same cache misses."""
    shared = MemoryCache()
    async for s in make_service(cache=shared):
        first = (await s.http.post("/v1/score", json=body([GOOD]), headers={"x-request-id": "a", "user-agent": "x"}))
        assert first.json()["results"][0]["cache_hit"] is False
        again = convert.group_response_from_pb(await s.grpc_score(
            body([GOOD], timeout_ms=9000, include_judgment=True, include_similarity=False), timeout=30)).to_json()
        assert again["results"][0]["cache_hit"] is True and again["meta"]["cache_hits"] == 1
        assert len(s.engine.calls) == 4
        assert list(shared._data) and all(k.startswith(KEY_PREFIX) for k in shared._data)
    taxonomy = yaml.safe_load((Path(__file__).resolve().parents[2] / "cer" / "data" / "taxonomy.yaml").read_text())
    taxonomy["strategies"] = taxonomy["strategies"][:4]
    (tmp_path / "tax.yaml").write_text(yaml.safe_dump(taxonomy))
    async for other in make_service(cache=shared, server={"taxonomy": str(tmp_path / "tax.yaml")}):
        res = (await other.http.post("/v1/score", json=body([GOOD]))).json()
        assert res["results"][0]["cache_hit"] is False and len(other.engine.calls) == 4


def test_the_key_namespace_is_versioned() -> None:
    """v1 keys were picked by hand; v2 keys are the judge's: no v1 entry can be read as a v2 one."""
    assert KEY_PREFIX == "compeer:judge:v2:" and key().startswith(KEY_PREFIX)


async def test_a_candidate_with_nothing_to_judge_has_no_key_and_is_never_a_cache_hit() -> None:
    """Every component of an untagged reply fails by rule: no round reaches the engine, so there is no judgment to
    cache. Such candidates of two different conversations once shared one key (engine, template and no rounds), so the
    second was reported as a cache hit."""
    fake = FakeEngine(config=ENGINE, supports_regex=True, logprobs=verdict_logprobs())
    core = RewardCore(ServerConfig(engine=fake.config), fake, None, MemoryCache())
    untagged = parse("just some words, no tags")
    assert core.judge.judgment_key(REQUEST["history"], "ref", untagged, JudgeMode.UNIFIED) is None
    assert cache_key(core.judge, JudgeMode.UNIFIED, [], None, untagged) is None
    cache = MemoryCache()
    async for s in make_service(cache=cache):
        for history in (HISTORY, HISTORY[:1]):
            res = (await s.http.post("/v1/score", json={**body(["no tags here", GOOD]), "history": history})).json()
            bare, good = res["results"]
            assert not bare["cache_hit"] and bare["rewards"]["total"] == -5.0 and not any(
                st["judged"] for st in bare["steps"])
            assert not good["cache_hit"]
        again = (await s.http.post("/v1/score", json=body(["no tags here", GOOD]))).json()
        assert [r["cache_hit"] for r in again["results"]] == [False, True]
        assert again["meta"]["cache_hits"] == 1
        assert len(cache._data) == 2  # the tagged reply under each history; nothing for the untagged one
