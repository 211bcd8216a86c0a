"""TRL runs compeer's reward function as async on every supported version: TRL 1.14.0 and later detect async reward
functions with ``trl.trainer.utils.is_async_callable`` (trl PR #7213), 1.0.0 to 1.13.0 with
``inspect.iscoroutinefunction(reward_func)`` (``trl/trainer/grpo_trainer.py``, checked in each wheel), which reads an
instance with an async ``__call__`` as sync. Real GRPOTrainer on a tiny random Llama, FakeRewardClient, no server.

The ``trl>=`` floor in pyproject.toml is the oldest TRL on which this file, test_policy_runner.py and
test_policy_rewards.py pass, each TRL installed with ``pip install --no-deps --target DIR trl==X`` and put first
on PYTHONPATH over the lock's other packages (docs/trainers.md, "TRL")."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import trl
from trl import GRPOTrainer

from policy_trainer.rewards import CompeerReward, RewardSettings
from tests.unit.test_policy_fakes import FakeRewardClient
from tests.unit.test_policy_runner import _config, tiny_policy  # noqa: F401 (the fixture)


def trl_reads_as_async(func: Any) -> bool:
    """The installed TRL's own test (1.14.0 and later), else the one of TRL 1.0.0 to 1.13.0."""
    try:
        from trl.trainer.utils import is_async_callable
    except ImportError:
        return inspect.iscoroutinefunction(func)
    return bool(is_async_callable(func))


def test_every_trl_detection_reads_the_reward_function_as_async() -> None:
    reward = CompeerReward(RewardSettings(num_generations=2), FakeRewardClient)
    func = reward.as_reward_func()
    assert trl_reads_as_async(func), trl.__version__
    assert inspect.iscoroutinefunction(func) and func.__name__ == "compeer"  # TRL 1.0.0-1.13.0's test
    assert not inspect.iscoroutinefunction(reward)  # why the instance itself failed there


def test_grpo_trainer_runs_it_on_its_event_loop(tiny_policy: str, tmp_path: Path) -> None:  # noqa: F811
    from policy_trainer.data import load_prompt_set
    from policy_trainer.runner import load_policy

    cfg = _config(tiny_policy, tmp_path / "run")
    model, tokenizer, _ = load_policy(cfg)
    client = FakeRewardClient()
    reward = CompeerReward(RewardSettings.from_config(cfg), lambda: client)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward.as_reward_func()], args=cfg,
                          train_dataset=load_prompt_set(cfg.prompt_set, cfg.max_prompts), processing_class=tokenizer)
    assert trainer._has_async_funcs and trainer.reward_func_names == ["compeer"]
    trainer.train()
    assert client.calls, "TRL awaited the reward function, which asked the (fake) service"
    assert trainer.state.log_history[0]["rewards/compeer/mean"] is not None
