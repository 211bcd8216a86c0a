"""OpenRLHF pointed at the service unchanged: its remote reward model client (replayed from openrlhf 0.9.1-0.11.2,
``tests/unit/openrlhf_replay.py``) against ``POST /get_reward`` under uvicorn, with a FAKE engine and embedder."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvicorn

from cer.modes import JudgeMode
from reward_server.auth import Guard
from reward_server.config import GetRewardSettings, SecuritySettings
from reward_server.core import RewardCore
from reward_server.http import dialogues
from reward_server.http.app import create_app
from tests.conftest import free_port
from tests.fake_engine import verdict_logprobs
from tests.unit import openrlhf_replay as openrlhf
from tests.unit.test_dialogue_scoring import GOOD, PROMPT, judge_with
from tests.unit.test_reward_service import Service, make_service

LABEL = "That must be frustrating."
QUERY = PROMPT + GOOD + "<|im_end|>"
TOKEN = "tok-openrlhf-" + "0123456789abcdef" * 2


@contextlib.asynccontextmanager
async def serve_http(core: RewardCore, guard: Guard | None = None) -> AsyncIterator[str]:
    """The HTTP front of ``core`` under uvicorn on a free port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(core, guard), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off", access_log=False))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def openrlhf_target(delay: float = 0.0, guard: bool = False,
                          **get_reward: Any) -> AsyncIterator[tuple[str, Service]]:
    """A service on the scripted judge (sure of every verdict) and its ``/get_reward`` URL."""
    async for s in make_service(judge_with(), delay=delay, logprobs=verdict_logprobs(1.0),
                                server={"get_reward": GetRewardSettings(**get_reward)}):
        g = Guard.from_settings(SecuritySettings(auth_tokens=TOKEN), s.core.metrics) if guard else None
        async with serve_http(s.core, g) as url:
            yield f"{url}/get_reward", s


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openrlhf, "RETRY_SLEEP_S", 0.01)


async def test_one_query_calls_are_judged_as_openrlhf_sends_them() -> None:
    async with openrlhf_target() as (url, _):
        rm = openrlhf.RewardEndpoints([url])
        samples = await asyncio.gather(*(openrlhf.reward_of_one_sample(rm.fetch_rewards_v0_11_2, q, PROMPT, LABEL)
                                         for q in (QUERY, PROMPT + GOOD.replace("4", "5") + "<|im_end|>")))
        for out in samples:
            assert out["reward"] == [5.0] and out["scores"] == [1.0]
            assert out["extra_logs"] == {"compeer_scored": [1.0]}


async def test_an_empty_shard_is_answered_200_with_empty_lists() -> None:
    async with openrlhf_target() as (url, _):
        # openrlhf 0.9.1-0.11.0 with two URLs: the first gets the query, the second {"query": [], ...}
        answers = await openrlhf.fetch_rewards_v0_9([url, url], [QUERY], [PROMPT], [LABEL])
        assert answers[0]["rewards"] == [5.0]
        assert answers[1] == {"rewards": [], "scores": [], "extra_logs": {"compeer_scored": []}, "statuses": [],
                              "errors": {}}
        out = await openrlhf.reward_of_one_sample(
            lambda *a: openrlhf.fetch_rewards_v0_9([url, url], *a), QUERY, PROMPT, LABEL)
        assert out["reward"] == [5.0]


async def test_several_urls_rotate_and_all_answer() -> None:
    async with openrlhf_target() as (url_a, _), openrlhf_target() as (url_b, _):
        rm = openrlhf.RewardEndpoints([url_a, url_b])  # openrlhf 0.11.2: one query a call, URLs in turn
        outs = [await openrlhf.reward_of_one_sample(rm.fetch_rewards_v0_11_2, QUERY, PROMPT, LABEL)
                for _ in range(4)]
        assert [o["reward"] for o in outs] == [[5.0]] * 4
        # openrlhf 0.11.1 and newer with more URLs than queries: nothing is sent to the rest
        assert len(await rm.fetch_rewards_v0_11_2([QUERY] * 3, [PROMPT] * 3, [LABEL] * 3)) == 2


async def test_with_tokens_on_openrlhf_own_client_is_refused() -> None:
    # OpenRLHF's HTTP client sends no headers: every call is 401 and, after its 5 tries, the sample has no reward
    # (the shipped reward function, reward_server/openrlhf.py, sends the token)
    async with openrlhf_target(guard=True) as (url, _):
        with pytest.raises(RuntimeError, match="5 times"):
            await openrlhf.fetch_rewards_v0_9([url], [QUERY], [PROMPT], [LABEL])
        rm = openrlhf.RewardEndpoints([url])
        assert (await openrlhf.reward_of_one_sample(rm.fetch_rewards_v0_11_2, QUERY, PROMPT, LABEL))["reward"] is None
        async with aiohttp.ClientSession() as session, session.post(url, json={"query": [QUERY]}) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "UNAUTHENTICATED"


async def test_the_server_deadline_ends_before_the_client_timeout() -> None:
    assert GetRewardSettings().timeout_s < 180  # OpenRLHF's aiohttp.ClientTimeout(total=180)
    async with openrlhf_target(delay=5.0, timeout_s=0.3) as (url, svc):
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as session, session.post(url, json={"query": [QUERY], "prompts": [PROMPT],
                                                                               "labels": [LABEL]}) as r:
            body = await r.json()
        assert r.status == 504 and body["error"]["code"] == "DEADLINE_EXCEEDED" and body["error"]["field"] == "query"
        assert time.perf_counter() - t0 < 3.0
        assert svc.engine.cancelled


async def test_a_client_that_hangs_up_has_its_judging_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialogues, "DISCONNECT_POLL_S", 0.05)
    async with openrlhf_target(delay=30.0) as (url, svc):
        # OpenRLHF's client timeout, shortened: the client gives up and closes the connection
        with pytest.raises(RuntimeError, match="5 times"):
            await openrlhf.fetch_rewards_v0_9([url], [QUERY], [PROMPT], [LABEL], total_timeout_s=0.3)
        for _ in range(100):
            if svc.core.metrics.failures.labels("client_disconnected")._value.get() >= 5:
                break
            await asyncio.sleep(0.05)
        assert svc.core.metrics.failures.labels("client_disconnected")._value.get() == 5
        assert svc.engine.queue_depth() == 0  # nothing is still judging for the abandoned calls
        assert len(svc.engine.cancelled) >= 5


# ---- the shipped reward function: --reward.remote_url /path/to/reward_server/openrlhf.py ----------------------------
REWARD_FUNC = str(Path(__file__).resolve().parents[2] / "reward_server" / "openrlhf.py")


async def test_the_shipped_reward_func_sends_the_token_openrlhf_cannot(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    reward_func = openrlhf.load_reward_func(REWARD_FUNC)  # as OpenRLHF loads it
    fetch = functools.partial(openrlhf.reward_via_func, reward_func)
    async with openrlhf_target(guard=True) as (url, _):
        monkeypatch.setenv("COMPEER_REWARD_URL", url.removesuffix("/get_reward"))
        monkeypatch.setenv("COMPEER_REWARD_TOKEN", TOKEN)
        out = await openrlhf.reward_of_one_sample(fetch, QUERY, PROMPT, LABEL)
        assert out == {"reward": [5.0], "scores": [1.0], "extra_logs": {"compeer_scored": [1.0]}}
        monkeypatch.delenv("COMPEER_REWARD_TOKEN")
        with caplog.at_level(logging.ERROR, logger="compeer.openrlhf"):
            assert (await openrlhf.reward_of_one_sample(fetch, QUERY, PROMPT, LABEL))["reward"] is None
        assert "HTTP 401 UNAUTHENTICATED" in caplog.text and GOOD not in caplog.text  # said at ERROR, no dialogue


async def test_the_shipped_reward_func_names_the_service_error(monkeypatch: pytest.MonkeyPatch) -> None:
    reward_func = openrlhf.load_reward_func(REWARD_FUNC)
    async for s in make_service(judge_with(broken_reply=True), max_retries=0, logprobs=verdict_logprobs(1.0),
                                server={"get_reward": GetRewardSettings(mode=JudgeMode.REPLY)}):
        async with serve_http(s.core) as base:
            monkeypatch.setenv("COMPEER_REWARD_URL", base)
            with pytest.raises(Exception, match=r"HTTP 502 UNSCORED \(field query\[0\]\).*parse_failed") as e:
                await asyncio.to_thread(reward_func, [QUERY], [PROMPT], [None])
            assert type(e.value).__name__ == "CompeerRewardError"
            with pytest.raises(Exception, match=r"HTTP 422 INVALID_ARGUMENT \(field query\[0\]\)"):
                await asyncio.to_thread(reward_func, ["no chat"], [None], [None])
            assert await asyncio.to_thread(reward_func, [], [], []) == {  # an empty shard
                "rewards": [], "scores": [], "extra_logs": {"compeer_scored": []}, "statuses": [], "errors": {}}


async def test_the_shipped_reward_func_needs_only_the_standard_library() -> None:
    # OpenRLHF's workers load the file by path; here in a Python without site-packages (no compeer, no aiohttp)
    async with openrlhf_target(guard=True) as (url, _):
        code = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('reward_func', "
                "sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
                "assert 'reward_server' not in sys.modules and 'aiohttp' not in sys.modules; "
                "print(json.dumps(m.reward_func([sys.argv[2]], [sys.argv[3]], [sys.argv[4]])))")
        env = {"COMPEER_REWARD_URL": url.removesuffix("/get_reward"), "COMPEER_REWARD_TOKEN": TOKEN}
        proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-S", "-c", code, REWARD_FUNC, QUERY,
                                                    PROMPT, LABEL, env=env, cwd="/", stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out)["rewards"] == [5.0]
