"""``reward_server/verl.py`` under veRL's REAL reward-loop code, where veRL is importable: skipped otherwise (the
replays of ``test_verl_compat.py`` run everywhere). veRL 0.9.1 imports on CPU when installed with ``--no-deps`` plus
the few modules its reward path needs (the versions it last passed with; 3 tests, 16 s)::

    pip install --no-deps --target /tmp/verl verl==0.9.1 ray==2.60.0 tensordict==0.15.3 msgpack==1.2.4
    pip install --no-deps --target /tmp/verl pyvers==0.2.3 omegaconf==2.4.0 codetiming==1.4.0 orjson==3.13.0
    PYTHONPATH=/tmp/verl:$PWD pytest tests/unit/test_verl_real.py

Its own ``get_custom_reward_fn``, ``NaiveRewardManager`` and ``RateLimitedRewardManager`` load and call the file
against the service (FAKE engine) under uvicorn, on a DataProto as the reward loop hands them one.

In ``requirements/compat.lock``, which ``make test`` installs (not ``make install`` or the images), so the test runs
there; skipped, with this reason, where veRL is not installed. Ray cannot be left out by loading only the reward
path's files by path (``spec_from_file_location``), since ``import ray`` is at the top of the modules that path itself
runs: ``verl/protocol.py`` (``DataProto``, which every manager takes) and ``verl/utils/ray_utils.py`` (the managers'
``get_event_loop``). Ray 2.60.0 is a 79 MB wheel, 240 MB installed; the rest together are 3.4 MB of wheels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.test_dialogue_scoring import GOOD
from tests.unit.test_verl_compat import GRADED, HISTORY, REF, VERL_FILE, verl_target

verl = pytest.importorskip("verl", reason="veRL is not installed (see the module docstring)")


class Tokenizer:
    """What the managers use of the policy tokenizer: ``decode`` of the response ids."""

    def __init__(self, text: str) -> None:
        self.text = text

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return self.text


def one_response(ground_truth: str, extra_info: dict[str, Any]) -> Any:
    from verl import DataProto

    prompt_len, response_len = 4, 3
    return DataProto.from_dict(
        tensors={"prompts": torch.ones(1, prompt_len, dtype=torch.long),
                 "responses": torch.ones(1, response_len, dtype=torch.long),
                 "attention_mask": torch.ones(1, prompt_len + response_len, dtype=torch.long)},
        non_tensors={"data_source": np.array(["esconv"], dtype=object),
                     "reward_model": np.array([{"ground_truth": ground_truth}], dtype=object),
                     "extra_info": np.array([extra_info], dtype=object)})


def config(url: str, name: str, **reward_kwargs: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.create({"reward": {"custom_reward_function": {
        "path": VERL_FILE, "name": name, "reward_kwargs": {"url": url, **reward_kwargs}}, "timeout": 300.0}})


@pytest.mark.parametrize("name", ["compute_score", "compute_score_async"])
async def test_veRL_naive_manager_logs_the_components(name: str) -> None:
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    async with verl_target() as url:
        cfg = config(url, name)
        manager = NaiveRewardManager(cfg, Tokenizer(GOOD), get_custom_reward_fn(cfg))
        assert manager.is_async_reward_score is (name == "compute_score_async")
        out = await manager.run_single(one_response(REF, {"history": HISTORY}))
        assert out["reward_score"] == pytest.approx(GRADED)
        info = out["reward_extra_info"]
        assert info["status"] == "ok" and info["discrete_total"] == 5.0 and info["scored"] == 1.0


async def test_veRL_rate_limited_manager_counts_failures_with_a_failure_reward() -> None:
    from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    async with verl_target() as url:
        cfg = config(url, "compute_score_async", failure_reward=-5.0)
        manager = RateLimitedRewardManager(cfg, Tokenizer(GOOD), get_custom_reward_fn(cfg))
        ok = await manager.run_single(one_response(REF, {"history": HISTORY}))
        failed = await manager.run_single(one_response("", {"history": HISTORY}))  # unified needs the reference
        assert ok["reward_score"] == pytest.approx(GRADED) and ok["reward_extra_info"]["status"] == "ok"
        assert failed["reward_score"] == -5.0 and failed["reward_extra_info"]["status"] == "invalid_input"
        assert failed["reward_extra_info"].keys() == ok["reward_extra_info"].keys()  # one array per key, batch-wide
