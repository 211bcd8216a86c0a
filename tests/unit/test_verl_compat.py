"""veRL pointed at the service unchanged: ``reward_server/verl.py`` loaded and called as veRL 0.9.1's reward loop does
(``tests/unit/verl_replay.py``: ``get_custom_reward_fn``, the ``naive`` and ``rate_limited`` managers, the batch's
``reward_extra_info``, the legacy ``batch`` manager), against the service under uvicorn on a FAKE engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from reward_server import verl
from reward_server.auth import Guard
from reward_server.config import SecuritySettings
from reward_server.types import Limits
from tests.fake_engine import verdict_logprobs
from tests.unit import verl_replay
from tests.unit.test_dialogue_scoring import GOOD, PLAIN, SEEKER1, SEEKER2, judge_with
from tests.unit.test_openrlhf_compat import TOKEN, serve_http
from tests.unit.test_reward_service import make_service

VERL_FILE = str(Path(__file__).resolve().parents[2] / "reward_server" / "verl.py")
REF = "That must be frustrating."
HISTORY = [{"role": "system", "content": "be kind"}, {"role": "user", "content": SEEKER1},
           {"role": "assistant", "content": "I'm sorry. What happened?"}, {"role": "user", "content": SEEKER2}]
#: the fake judge writes True / second with probability 0.8: graded total 3 x 0.6 + (2 x (0.8 + 0.2/3) - 1) + 1
GRADED = 3 * 0.6 + (2 * (0.8 + 0.2 / 3) - 1) + 1.0


@contextlib.asynccontextmanager
async def verl_target(guard: bool = False, logprobs: Any = True, **limits: Any) -> AsyncIterator[str]:
    async for s in make_service(judge_with(), logprobs=verdict_logprobs(0.8) if logprobs else None,
                                server={"limits": Limits(**limits)}):
        g = Guard.from_settings(SecuritySettings(auth_tokens=TOKEN), s.core.metrics) if guard else None
        async with serve_http(s.core, g) as url:
            yield url


def reward_fn(name: str, **reward_kwargs: Any) -> Any:
    """What veRL builds from ``reward.custom_reward_function.{path,name,reward_kwargs}``."""
    return verl_replay.get_custom_reward_fn({"custom_reward_function": {
        "path": VERL_FILE, "name": name, "reward_kwargs": reward_kwargs}})


@pytest.mark.parametrize("name", ["compute_score", "compute_score_async"])
async def test_the_naive_manager_gets_the_graded_reward_and_its_components(name: str) -> None:
    async with verl_target() as url:
        fn = reward_fn(name, url=url)
        out = await verl_replay.naive_run_single(fn, "esconv", GOOD, REF, {"history": HISTORY})
        assert out["reward_score"] == pytest.approx(GRADED)
        info = out["reward_extra_info"]
        assert info["status"] == "ok" and info["scored"] == 1.0 and info["discrete_total"] == 5.0
        assert info["graded_total"] == pytest.approx(GRADED) and info["step_reward"] == pytest.approx(1.8)
        assert info["format_reward"] == 1.0 and info["reply_reward"] is None
        assert set(info) == set(verl.KEYS)
        discrete = await verl_replay.naive_run_single(reward_fn(name, url=url, reward_kind="discrete"), "esconv",
                                                      GOOD, REF, {"history": HISTORY})
        assert discrete["reward_score"] == 5.0 and discrete["reward_extra_info"]["step_reward"] == 3.0


async def test_failures_raise_naming_the_status_or_give_the_failure_reward_with_the_same_keys() -> None:
    async with verl_target() as url:
        fn = reward_fn("compute_score_async", url=url)
        with pytest.raises(Exception, match="reference") as e:  # unified needs the reference: status invalid_input
            await verl_replay.naive_run_single(fn, "esconv", GOOD, "", {"history": HISTORY})
        assert type(e.value).__name__ == "CompeerRewardError"
        fn = reward_fn("compute_score_async", url=url, failure_reward=-5.0)
        outs = await asyncio.gather(
            verl_replay.naive_run_single(fn, "esconv", GOOD, REF, {"history": HISTORY}),
            verl_replay.naive_run_single(fn, "esconv", GOOD, "", {"history": HISTORY}),
            verl_replay.naive_run_single(fn, "esconv", GOOD, REF, {}))
        batch = verl_replay.aggregate(outs)  # veRL's reward loop: the keys of the first response, for all
        assert [o["reward_score"] for o in outs] == [pytest.approx(GRADED), -5.0, -5.0]
        assert list(batch["status"]) == ["ok", "invalid_input", "invalid_input"]
        assert list(batch["scored"]) == [1.0, 0.0, 0.0]
    async with verl_target(logprobs=False) as url:  # graded asked of a server without: said, even with a failure reward
        with pytest.raises(Exception, match="reward_kind graded: this server serves no graded rewards"):
            await verl_replay.naive_run_single(reward_fn("compute_score", url=url, failure_reward=-5.0), "esconv",
                                               GOOD, REF, {"history": HISTORY})


async def test_a_token_and_the_rate_limited_manager() -> None:
    async with verl_target(guard=True) as url:
        ok = await verl_replay.rate_limited_run_single(reward_fn("compute_score_async", url=url, token=TOKEN),
                                                       "esconv", GOOD, REF, {"history": HISTORY})
        assert ok["reward_score"] == pytest.approx(GRADED) and ok["reward_extra_info"]["status"] == "ok"
        # rate_limited turns any exception into reward 0.0: the error names the status, but only in a log line...
        silent = await verl_replay.rate_limited_run_single(reward_fn("compute_score", url=url), "esconv", GOOD, REF,
                                                           {"history": HISTORY})
        assert silent["reward_score"] == 0.0 and "HTTP 401 UNAUTHENTICATED" in silent["reward_extra_info"]["error"]
        # ...so the docs tell rate_limited users to set failure_reward: the failure is then counted in its own keys
        counted = await verl_replay.rate_limited_run_single(reward_fn("compute_score", url=url, failure_reward=-5.0),
                                                            "esconv", GOOD, REF, {"history": HISTORY})
        assert counted["reward_extra_info"]["status"] == "call_failed" and counted["reward_extra_info"]["scored"] == 0
    assert verl.DEFAULT_DEADLINE_S < 300  # rate_limited's default reward.timeout


async def test_the_legacy_batch_function_chunks_at_the_server_limit_and_honours_the_failure_reward() -> None:
    async with verl_target(max_groups=2) as url:
        n = 5
        fn = reward_fn("compute_score_batch", url=url, failure_reward=-9.0)
        rewards, info = await asyncio.to_thread(
            verl_replay.legacy_batch, fn, ["esconv"] * n, [GOOD, PLAIN, GOOD, GOOD, GOOD], [REF, None, "", REF, REF],
            [{"history": HISTORY}] * 4 + [{}])
        # 4 groups sent in calls of 2 (the server's max_groups: one call of 4 would be refused whole, 422); the 2nd
        # and 3rd lack the reference unified needs, the 5th its history
        assert rewards == [pytest.approx(GRADED), -9.0, -9.0, pytest.approx(GRADED), -9.0]
        assert info["status"] == ["ok", "invalid_input", "invalid_input", "ok", "invalid_input"]
        assert info["scored"] == [1.0, 0.0, 0.0, 1.0, 0.0]
        with pytest.raises(Exception, match="item 1"):
            await asyncio.to_thread(verl_replay.legacy_batch, reward_fn("compute_score_batch", url=url),
                                    ["esconv"] * 2, [GOOD, GOOD], [REF, ""], [{"history": HISTORY}] * 2)
    async with verl_target(guard=True) as url:  # a call that fails as a whole: every item gets the failure reward
        rewards, info = await asyncio.to_thread(
            verl_replay.legacy_batch, reward_fn("compute_score_batch", url=url, failure_reward=-9.0),
            ["esconv"] * 3, [GOOD] * 3, [REF] * 3, [{"history": HISTORY}] * 3)
        assert rewards == [-9.0] * 3 and info["status"] == ["call_failed"] * 3


async def test_verl_py_needs_only_the_standard_library() -> None:
    # veRL's workers load the file by path (a private module name, not in sys.modules); here in a Python without
    # site-packages (no compeer)
    async with verl_target(guard=True) as url:
        code = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('custom_module_1', "
                "sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
                "assert 'reward_server' not in sys.modules; print(json.dumps(m.compute_score(data_source='esconv', "
                "solution_str=sys.argv[2], ground_truth=sys.argv[3], extra_info={'history': json.loads(sys.argv[4])}, "
                "url=sys.argv[5], token=sys.argv[6])))")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-S", "-c", code, VERL_FILE, GOOD, REF,
                                                    json.dumps(HISTORY), url, TOKEN, cwd="/",
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out)["score"] == pytest.approx(GRADED)


def test_history_as_a_numpy_array_as_pandas_reads_a_parquet_list_column() -> None:
    import numpy as np

    turns = verl.history_from_extra_info({"history": np.array(HISTORY, dtype=object)})
    assert turns == verl.history_from_extra_info({"history": HISTORY})
    assert [t["role"] for t in turns] == ["seeker", "supporter", "seeker"]
