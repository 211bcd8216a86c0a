"""``FakeEngine``: a scripted engine for UNIT TESTS ONLY (never registered in ``create_engine``).

It answers with a caller-given ``responder(messages, params)`` (sync or async, returning the text or a full
:class:`GenResult`), records every call, and can wait ``delay`` seconds before answering so tests can exercise
cancellation and deadlines.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from judge.engines.base import Engine, EngineConfig, EngineError, GenParams, GenResult, Message

Responder = Callable[[list[Message], GenParams], "str | GenResult | Awaitable[str | GenResult]"]


@dataclass(frozen=True)
class FakeCall:
    """One recorded ``generate`` call (``messages`` is a copy taken at call time)."""

    messages: list[Message]
    params: GenParams
    request_id: str


class FakeEngine(Engine):
    """A fake engine for unit tests: scripted answers, recorded calls, optional delay.

    ``calls`` holds every call in arrival order (including ones later cancelled); ``cancelled`` the request ids
    whose caller was cancelled while waiting. A responder that raises makes ``generate`` raise the same error.
    """

    name = "fake"

    def __init__(self, responder: Responder | None = None, *, delay: float = 0.0, supports_regex: bool = False,
                 supports_line_bound: bool = False, config: EngineConfig | None = None) -> None:
        super().__init__(config or EngineConfig(backend="fake", model_id="fake"))
        self.responder: Responder = responder or (lambda messages, params: "")
        self.delay = delay
        self.supports_regex = supports_regex
        self.supports_line_bound = supports_line_bound  # takes max_line_chars (the fake never enforces it)
        self.calls: list[FakeCall] = []
        self.cancelled: list[str] = []
        self._started = False
        self._inflight = 0

    async def start(self) -> None:
        """Mark the engine ready."""
        self._started = True

    async def stop(self) -> None:
        """Mark the engine stopped (idempotent)."""
        self._started = False

    def healthy(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._started

    def queue_depth(self) -> int:
        """Calls in progress."""
        return self._inflight

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        """Record the call, wait ``delay``, answer with the responder."""
        if not self._started:
            raise EngineError("fake engine is not started")
        self.check_line_bound(params)
        self.calls.append(FakeCall([dict(m) for m in messages], params, request_id))
        self._inflight += 1
        try:
            if self.delay > 0:
                await asyncio.sleep(self.delay)
            answer = self.responder(messages, params)
            if inspect.isawaitable(answer):
                answer = await answer
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        finally:
            self._inflight -= 1
        if isinstance(answer, GenResult):
            return answer
        return GenResult(text=answer, prompt_tokens=sum(len(m["content"].split()) for m in messages),
                         output_tokens=len(answer.split()), finish_reason="stop")
