"""Faithful replays of veRL's reward-function calling code, for tests that point it at the service unchanged.

veRL does not import on this CPU machine without Ray and tensordict (``verl/__init__.py`` imports
``verl.protocol``, which imports ``ray``), so the code that loads and calls a custom reward function is copied here
from veRL 0.9.1 (the newest on PyPI, checked 2026-11 from its wheel), with DataProto and the tokenizer left out:

* :func:`get_custom_reward_fn`: ``verl/trainer/ppo/reward.py`` (``get_custom_reward_fn``, ``_call_with_kwargs``,
  ``_call_with_kwargs_async``) with ``verl/utils/import_utils.py`` (``load_extern_object``, ``load_module``): the
  file is loaded under a private name not in ``sys.modules``, ``reward_kwargs`` take precedence over call kwargs.
* :func:`naive_run_single`: ``verl/experimental/reward_loop/reward_manager/naive.py`` (``run_single``, the part
  after decoding): awaited when a coroutine function, else run in the loop's executor; a dict result's ``score`` is
  the reward and its every key goes to ``reward_extra_info``; a number is logged as ``acc``.
* :func:`rate_limited_run_single`: ``.../reward_manager/limited.py`` (``run_single``): the same under
  ``asyncio.wait_for(timeout=config.reward.timeout, default 300)``, and any exception becomes reward 0.0.
* :func:`aggregate`: ``verl/experimental/reward_loop/reward_loop.py`` (lines 365-369): ``reward_extra_info`` keys
  of the FIRST response, one ``np.array`` per key over all responses.
* :func:`legacy_batch`: ``verl/workers/reward_manager/batch.py`` (``BatchRewardManager.__call__``): a list result,
  each entry a number or a dict with ``score``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import os
from collections import defaultdict
from functools import partial
from typing import Any

import numpy as np

logger = logging.getLogger("verl_replay")


def _call_with_kwargs(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    merged_kwargs = {**kwargs, **extra_kwargs}
    return raw_fn(*args, **merged_kwargs)


async def _call_with_kwargs_async(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    merged_kwargs = {**kwargs, **extra_kwargs}
    return await raw_fn(*args, **merged_kwargs)


def load_extern_object(module_path: str, object_name: str) -> Any:
    if not os.path.exists(module_path):
        raise FileNotFoundError(f"Custom module file not found: {module_path=}")
    spec_name = f"custom_module_{hash(os.path.abspath(module_path))}"
    spec = importlib.util.spec_from_file_location(spec_name, module_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"Could not load module from {module_path=}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise RuntimeError(f"Error loading module from {module_path=}") from e
    if not hasattr(module, object_name):
        raise AttributeError(f"Object not found in module: {object_name=}, {module_path=}.")
    return getattr(module, object_name)


def get_custom_reward_fn(config: dict[str, Any]) -> Any:
    """``config`` is the ``reward`` section: veRL 0.9 reads ``config.reward.custom_reward_function`` only."""
    reward_fn_config = config.get("custom_reward_function") or {}
    module_path = reward_fn_config.get("path")
    if not module_path:
        return None
    fn_name = reward_fn_config.get("name")
    assert fn_name is not None
    raw_fn = load_extern_object(module_path=module_path, object_name=fn_name)
    reward_kwargs = dict(reward_fn_config.get("reward_kwargs", {}))
    if not inspect.iscoroutinefunction(raw_fn):
        return partial(_call_with_kwargs, raw_fn, reward_kwargs)
    return partial(_call_with_kwargs_async, raw_fn, reward_kwargs)


async def _compute(compute_score: Any, data_source: str, solution_str: str, ground_truth: Any,
                   extra_info: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(compute_score):
        return await compute_score(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                                   extra_info=extra_info)
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: compute_score(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                                    extra_info=extra_info))


def _unpack(result: Any, reward_extra_info: dict[str, Any]) -> float:
    if isinstance(result, dict):
        score = result["score"]
        for key, value in result.items():
            reward_extra_info[key] = value
    else:
        score = result
        reward_extra_info["acc"] = score
    return float(score)


async def naive_run_single(compute_score: Any, data_source: str, solution_str: str, ground_truth: Any,
                           extra_info: dict[str, Any]) -> dict[str, Any]:
    extra_info = {**extra_info, "num_turns": None, "rollout_reward_scores": {}}
    result = await _compute(compute_score, data_source, solution_str, ground_truth, extra_info)
    reward_extra_info: dict[str, Any] = {}
    reward = _unpack(result, reward_extra_info)
    return {"reward_score": reward, "reward_extra_info": reward_extra_info}


async def rate_limited_run_single(compute_score: Any, data_source: str, solution_str: str, ground_truth: Any,
                                  extra_info: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    reward_extra_info: dict[str, Any] = {}
    try:
        result = await asyncio.wait_for(_compute(compute_score, data_source, solution_str, ground_truth, extra_info),
                                        timeout=timeout)
        reward = _unpack(result, reward_extra_info)
    except TimeoutError:
        logger.warning(f"Reward computation timed out after {timeout}s for data_source={data_source}.")
        reward = 0.0
        reward_extra_info["timeout"] = True
        reward_extra_info["acc"] = 0.0
    except Exception as e:  # noqa: BLE001 (upstream's code: any failure becomes reward 0.0)
        logger.error(f"Reward computation failed for data_source={data_source}: {e}.")
        reward = 0.0
        reward_extra_info["error"] = str(e)
        reward_extra_info["acc"] = 0.0
    return {"reward_score": reward, "reward_extra_info": reward_extra_info}


def aggregate(outputs_flat: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    reward_extra_infos = [output.get("reward_extra_info", {}) for output in outputs_flat]
    reward_extra_keys = list(reward_extra_infos[0].keys())
    non_tensor_batch = {}
    for key in reward_extra_keys:
        non_tensor_batch[key] = np.array([info[key] for info in reward_extra_infos])
    return non_tensor_batch


def legacy_batch(compute_score: Any, data_sources: list[str], responses_str: list[str], ground_truths: list[Any],
                 extras: list[dict[str, Any]]) -> tuple[list[float], dict[str, list[Any]]]:
    scores = compute_score(data_sources=data_sources, solution_strs=responses_str, ground_truths=ground_truths,
                           extra_infos=extras)
    reward_extra_info: dict[str, list[Any]] = defaultdict(list)
    rewards = []
    for i in range(len(responses_str)):
        score = scores[i]
        if isinstance(score, dict):
            reward = score["score"]
            for key, value in score.items():
                reward_extra_info[key].append(value)
        else:
            reward = score
        rewards.append(float(reward))
    return rewards, reward_extra_info
