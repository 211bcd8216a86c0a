"""Faithful replays of OpenRLHF's remote reward model client, for tests that point it at the service unchanged.

Copied from OpenRLHF's ``openrlhf/utils/agent.py`` (``SingleTurnAgentExecutor``), with only the retry pause made a
module constant (upstream: ``await asyncio.sleep(1)``) so tests need not wait 5 s per failure:

* :func:`fetch_rewards_v0_9` is ``_fetch_rewards_via_http`` of openrlhf 0.9.1 to 0.11.0 (the same code in each):
  every URL gets a shard, so with several URLs a one-query call sends the second URL ``{"query": []}``.
* :func:`fetch_rewards_v0_11_2` is that of openrlhf 0.11.2 (the newest, checked 2026-11 from its wheel): empty
  shards are skipped and calls rotate over the URLs.
* :func:`reward_of_one_sample` is what ``SingleTurnAgentExecutor.execute`` does around it (0.9.1 to 0.11.2): one
  query per call, ``rewards_info_list[0]``, and any exception logged at INFO and turned into a missing reward.
* :func:`reward_via_func` is ``_fetch_rewards_via_func``: a ``reward_func(queries, prompts, labels)`` loaded from the
  ``.py`` file given as ``--reward.remote_url`` (``--remote_rm_url`` before 0.10), called in a thread.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from itertools import cycle
from typing import Any

import aiohttp

logger = logging.getLogger("openrlhf_replay")
#: upstream sleeps 1 s between its 5 tries
RETRY_SLEEP_S = 1.0


async def _post_request(url: str, data: dict[str, Any], timeout: aiohttp.ClientTimeout,
                        try_max_times: int = 5) -> Any:
    for _ in range(try_max_times):
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:  # noqa: SIM117 (upstream's code)
                async with session.post(url, json=data) as response:
                    response.raise_for_status()
                    return await response.json()
        except aiohttp.ClientError as e:
            logger.info(f"Request error, please check: {e}")
        except Exception as e:  # noqa: BLE001 (upstream's code)
            logger.info(f"Unexpected error, please check: {e}")
        await asyncio.sleep(RETRY_SLEEP_S)

    raise RuntimeError(f"Request error for {try_max_times} times, returning None. Please check the API server.")


async def fetch_rewards_v0_9(reward_endpoints: list[str], queries_list: list[str], prompts_list: list[str],
                             labels_list: list[Any], total_timeout_s: float = 180) -> list[Any]:
    """openrlhf 0.9.1-0.11.0 ``_fetch_rewards_via_http``."""
    num_servers = len(reward_endpoints)
    batch_size = (len(queries_list) + num_servers - 1) // num_servers
    timeout = aiohttp.ClientTimeout(total=total_timeout_s)

    tasks = []
    for i, rm in enumerate(reward_endpoints):
        start_idx = i * batch_size
        end_idx = min((i + 1) * batch_size, len(queries_list))
        payload = {
            "query": queries_list[start_idx:end_idx],
            "prompts": prompts_list[start_idx:end_idx],
            "labels": labels_list[start_idx:end_idx],
        }
        tasks.append(asyncio.create_task(_post_request(rm, payload, timeout)))
    return await asyncio.gather(*tasks)


class RewardEndpoints:
    """openrlhf 0.11.2's endpoint rotation (``self._reward_endpoint_cycle``) and ``_fetch_rewards_via_http``."""

    def __init__(self, reward_endpoints: list[str], total_timeout_s: float = 180) -> None:
        self.reward_endpoints = reward_endpoints
        self._reward_endpoint_cycle = cycle(reward_endpoints)
        self.total_timeout_s = total_timeout_s

    async def fetch_rewards_v0_11_2(self, queries_list: list[str], prompts_list: list[str],
                                    labels_list: list[Any]) -> list[Any]:
        num_servers = len(self.reward_endpoints)
        batch_size = (len(queries_list) + num_servers - 1) // num_servers
        timeout = aiohttp.ClientTimeout(total=self.total_timeout_s)

        tasks = []
        for i in range(num_servers):
            start_idx = i * batch_size
            if start_idx >= len(queries_list):
                break
            rm = next(self._reward_endpoint_cycle)
            end_idx = min((i + 1) * batch_size, len(queries_list))
            payload = {
                "query": queries_list[start_idx:end_idx],
                "prompts": prompts_list[start_idx:end_idx],
                "labels": labels_list[start_idx:end_idx],
            }
            tasks.append(asyncio.create_task(_post_request(rm, payload, timeout)))
        return await asyncio.gather(*tasks)


def load_reward_func(path: str) -> Any:
    """``SingleTurnAgentExecutor.__init__``: a reward URL ending in ``.py`` is loaded as a module named
    ``reward_func`` and its ``reward_func`` attribute is called."""
    spec = importlib.util.spec_from_file_location("reward_func", path)
    assert spec is not None and spec.loader is not None
    reward_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward_module)
    return reward_module.reward_func


async def reward_via_func(reward_func: Any, queries_list: list[str], prompts_list: list[str],
                          labels_list: list[Any]) -> list[Any]:
    """``_fetch_rewards_via_func`` (batch size 1, each chunk in a thread)."""
    tasks = [asyncio.to_thread(reward_func, queries_list[i:i + 1], prompts_list[i:i + 1], labels_list[i:i + 1])
             for i in range(len(queries_list))]
    return await asyncio.gather(*tasks)


async def reward_of_one_sample(fetch: Any, query: str, prompt: str, label: Any) -> dict[str, Any]:
    """The reward part of ``SingleTurnAgentExecutor.execute``: ``fetch([query], [prompt], [label])``; what it puts
    into the sample (``reward`` None when anything failed: OpenRLHF logs the error at INFO and goes on)."""
    output: dict[str, Any] = {"reward": None, "scores": None, "extra_logs": {}}
    try:
        rewards_info_list = await fetch([query], [prompt], [label])
        rewards_info = rewards_info_list[0] if rewards_info_list else None
        if rewards_info:
            score_value = rewards_info.get("scores")
            if score_value is None:
                score_value = rewards_info.get("rewards")
            output.update(reward=rewards_info.get("rewards"), scores=score_value,
                          extra_logs=rewards_info.get("extra_logs") or {})
    except Exception as e:  # noqa: BLE001 (upstream's code: any failure becomes a missing reward)
        logger.info(f"[SingleTurnExecutor] Failed to fetch reward from remote RM: {e}")
    return output
