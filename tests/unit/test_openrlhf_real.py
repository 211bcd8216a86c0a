"""``POST /get_reward`` and ``reward_server/openrlhf.py`` under OpenRLHF's REAL rollout code, where OpenRLHF is
importable: skipped otherwise (the replays of ``test_openrlhf_compat.py`` run everywhere). ``SingleTurnAgentExecutor``
imports on CPU when installed with ``--no-deps`` plus ``pylatexenc``::

    pip install --no-deps --target /tmp/openrlhf openrlhf==0.11.2 pylatexenc     # or 0.9.1, 0.11.0, ...
    PYTHONPATH=/tmp/openrlhf:$PWD pytest tests/unit/test_openrlhf_real.py

Its ``execute`` runs with a fake vLLM engine and tokenizer (the generated text is the candidate; decoding gives the
chat-templated query) and fetches the reward from the service (FAKE judge) under uvicorn, as in a rollout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.unit.test_openrlhf_compat import LABEL, PROMPT, QUERY, REWARD_FUNC, TOKEN, openrlhf_target

agent = pytest.importorskip("openrlhf.utils.agent", reason="OpenRLHF is not installed (see the module docstring)")


class Tokenizer:
    def __call__(self, text: str | None = None, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([[1, 2, 3]])}

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return QUERY  # the prompt's chat template, the response, its end-of-turn token


class Engine:
    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=[4, 5], text="...", finish_reason="stop",
                                                        logprobs=None)])


async def rollout_sample(remote_rm_url: Any) -> dict[str, Any]:
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=remote_rm_url)
    out: dict[str, Any] = await executor.execute(PROMPT, LABEL, SimpleNamespace(max_tokens=8, logprobs=None), 64,
                                                 Tokenizer(), Engine())
    return out


async def test_a_rollout_sample_gets_its_reward_with_one_url_and_with_two() -> None:
    async with openrlhf_target() as (url, _):
        assert (await rollout_sample(url))["reward"] == [5.0]
        # 0.9.1-0.11.0 send the second URL {"query": []}: answered 200, so the sample keeps its reward
        two = await rollout_sample([url, url])
        assert two["reward"] == [5.0] and two["extra_logs"] == {"compeer_scored": [1.0]}


async def test_the_shipped_reward_func_as_the_reward_url(monkeypatch: pytest.MonkeyPatch) -> None:
    async with openrlhf_target(guard=True) as (url, _):
        assert (await rollout_sample(url))["reward"] is None  # OpenRLHF's own client cannot send the token: 401
        monkeypatch.setenv("COMPEER_REWARD_URL", url.removesuffix("/get_reward"))
        monkeypatch.setenv("COMPEER_REWARD_TOKEN", TOKEN)
        out = await rollout_sample(REWARD_FUNC)
        assert out["reward"] == [5.0] and out["scores"] == [1.0]
