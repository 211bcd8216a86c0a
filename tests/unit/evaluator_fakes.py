"""FAKES for the evaluator's unit tests: a scripted chat engine and helpers to build roles on it.

Every capability these fakes stand in for is also tested against the real default model in
``tests/integration/test_evaluator.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evaluator.backends import Engine, EngineConfig, GenParams, GenResult, Message, Roles, roles_from_engines

Script = Callable[[list[Message], GenParams], str]


class FakeChatEngine(Engine):
    """FAKE engine: answers with ``script(messages, params)``, records the calls, optionally takes regexes."""

    name = "fake-chat"

    def __init__(self, script: Script, model_id: str, supports_regex: bool = False) -> None:
        super().__init__(EngineConfig(backend="fake", model_id=model_id))
        self.script = script
        self.supports_regex = supports_regex
        self.calls: list[tuple[list[Message], GenParams]] = []
        self.starts = 0
        self._up = False

    async def start(self) -> None:
        self.starts += 1
        self._up = True

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        self.calls.append(([dict(m) for m in messages], params))
        return GenResult(text=self.script(messages, params))

    async def stop(self) -> None:
        self._up = False

    def healthy(self) -> bool:
        return self._up


def fake_roles(model: Script, simulator: Script, scorer: Script, cache: Path) -> tuple[Roles, dict[str, FakeChatEngine]]:
    """Roles on three fake engines (cache in ``cache``); returns the engines too."""
    engines = {"model": FakeChatEngine(model, "fake-model"), "simulator": FakeChatEngine(simulator, "fake-sim"),
               "scorer": FakeChatEngine(scorer, "fake-judge", supports_regex=True)}
    return roles_from_engines(dict(engines), cache_dir=cache), engines


def last_user(messages: list[Message]) -> str:
    """The content of the last user message."""
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")
