"""``FakeEngine``: a scripted engine for UNIT TESTS ONLY (never registered in ``create_engine``).

It answers with a caller-given ``responder(messages, params)`` (sync or async, returning the text or a full
:class:`GenResult`), records every call, and can wait ``delay`` seconds before answering so tests can exercise
cancellation and deadlines. With ``logprobs`` (e.g. :func:`verdict_logprobs`) it supports ``GenParams.logprobs``
and attaches the tokens that function makes of each text. With ``supports_prefix`` it takes ``GenParams.prefix`` as a
real engine does: the answer starts with the prefix (prepended to a responder's text that does not already start with
it, so responders may write whole answers) and the tokens cover the continuation only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cer.verdicts import Kind, labels, parse_label, verdict_label_starts
from judge.engines.base import Engine, EngineConfig, EngineError, GenParams, GenResult, Message, TokenLogprobs

Responder = Callable[[list[Message], GenParams], "str | GenResult | Awaitable[str | GenResult]"]
#: Makes the tokens of an answer (``GenResult.tokens``) for a ``GenParams.logprobs`` request.
LogprobsMaker = Callable[[str, GenParams], "list[TokenLogprobs] | None"]


def verdict_logprobs(confidence: float | Callable[[str], float] = 0.8) -> LogprobsMaker:
    """Fake logprobs: the text is one token up to each verdict label's leading space, then `` <label>`` as one token;
    there the written label has probability ``confidence`` (a number, or a function of the text) and the other labels
    of its kind share the rest (STEP labels when the written one is True/False, else PREFERENCE ones)."""

    def make(text: str, params: GenParams) -> list[TokenLogprobs]:
        c = confidence(text) if callable(confidence) else confidence
        out, pos = [], 0
        for start in verdict_label_starts(text, text.count("Verdict:")):
            if start is None:
                continue
            end = text.find("\n", start) if "\n" in text[start:] else len(text)
            written = text[start:end].strip()
            names = labels(Kind.STEP if parse_label(Kind.STEP, written) is not None else Kind.PREFERENCE)
            probs = {n: c if n.lower() == written.lower() else (1.0 - c) / (len(names) - 1) for n in names}
            top = {f" {n}": math.log(p) for n, p in probs.items() if p > 0}
            out += [TokenLogprobs(text[pos:start - 1], {text[pos:start - 1]: 0.0}, 0.0),
                    TokenLogprobs(text[start - 1:end], top, top.get(text[start - 1:end]))]
            pos = end
        if pos < len(text):
            out.append(TokenLogprobs(text[pos:], {text[pos:]: 0.0}, 0.0))
        return out

    return make


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
                 supports_line_bound: bool = False, config: EngineConfig | None = None,
                 logprobs: LogprobsMaker | None = None, supports_prefix: bool = False) -> None:
        super().__init__(config or EngineConfig(backend="fake", model_id="fake"))
        self.responder: Responder = responder or (lambda messages, params: "")
        self.delay = delay
        self.supports_regex = supports_regex
        self.supports_line_bound = supports_line_bound  # takes max_line_chars (the fake never enforces it)
        self.logprobs = logprobs
        self.supports_logprobs = logprobs is not None
        self.supports_prefix = supports_prefix  # takes GenParams.prefix (recorded in calls[i].params.prefix)
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
        self.check_logprobs(params)
        self.check_prefix(params)
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
        if not isinstance(answer, GenResult):
            answer = GenResult(text=answer, prompt_tokens=sum(len(m["content"].split()) for m in messages),
                               output_tokens=len(answer.split()), finish_reason="stop")
        prefix = params.prefix or ""
        if not answer.text.startswith(prefix):
            answer = dataclasses.replace(answer, text=prefix + answer.text)
        if params.logprobs is not None and self.logprobs is not None and answer.tokens is None:
            answer = dataclasses.replace(answer, tokens=self.logprobs(answer.text[len(prefix):], params))
        return answer
