"""The OpenAI-compatible backend: any chat-completions endpoint (a remote vLLM server, a gateway, OpenAI).

``supports_regex`` follows ``config.openai.regex``: set it only for a vLLM server, whose structured outputs are
requested with ``extra_body={"structured_outputs": {"regex": ...}}``. Other endpoints ignore or reject that field,
so with ``regex = False`` a ``GenParams.regex`` is not sent and the judge relies on parse + retry.

Errors from the endpoint become :class:`EngineError` whose message names the endpoint, the status and the error
type, never the dialogue; response bodies are logged at DEBUG only. Cancelling the awaiting task closes the HTTP
request (vLLM then aborts the generation).

Logprobs (``GenParams.logprobs``, ``supports_logprobs`` follows ``config.openai.logprobs``): ``logprobs=true`` and
``top_logprobs=k`` (OpenAI allows at most 20). OpenAI reports the model's distribution before sampling; a vLLM
server reports its raw logprobs (see :mod:`judge.engines.vllm_engine` for its structured-output caveat). An answer
without them gets ``GenResult.tokens`` None: nothing is made up.

Settings: :class:`judge.engines.settings.OpenAISettings` (``EngineConfig.openai``): endpoint, key, model name,
regex support, client retries (connection errors, 429 and 5xx) and the per-request timeout.

No answer prefix (``supports_prefix`` false): the endpoint renders the chat template, and continuing an assistant
message is no part of the OpenAI API (vLLM's ``continue_final_message`` is that server's own extension), so a
``GenParams.prefix`` raises :class:`EngineError` and the judge sends none.
"""

from __future__ import annotations

import logging
from typing import Any

from judge.engines.base import (
    Engine,
    EngineConfig,
    EngineError,
    GenParams,
    GenResult,
    Message,
    TokenLogprobs,
    top_logprobs,
)

log = logging.getLogger(__name__)


class OpenAIEngine(Engine):
    """Chat completions through ``openai.AsyncOpenAI`` against ``config.openai.base_url``."""

    name = "openai"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.settings = config.openai
        self.supports_regex = bool(self.settings.regex)
        self.supports_logprobs = bool(self.settings.logprobs)
        self.model = self.settings.model or config.model_id
        self._client: Any = None
        self._inflight = 0

    async def start(self) -> None:
        """Create the client and check the endpoint with ``models.list()``; raise :class:`EngineError` if unusable."""
        if self._client is not None:
            return
        s = self.settings
        if not s.base_url:
            raise EngineError("openai engine: the openai base_url is empty (e.g. http://host:8000/v1)")
        import openai

        client = openai.AsyncOpenAI(
            base_url=s.base_url,
            api_key=s.api_key or "EMPTY",
            max_retries=s.max_retries,
            timeout=s.timeout_s,
        )
        try:
            page = await client.models.list()
        except openai.OpenAIError as exc:
            await client.close()
            raise self._error(exc, "endpoint check (models.list) failed") from exc
        served = [m.id for m in page.data]
        if not self.model:
            if not served:
                await client.close()
                raise EngineError(f"openai engine: {self.settings.base_url} serves no model and none was configured")
            self.model = served[0]
            log.info("openai engine: no model configured, using the endpoint's first model %r", self.model)
        elif served and self.model not in served:
            await client.close()
            raise EngineError(f"openai engine: model {self.model!r} is not served by {self.settings.base_url} "
                              f"(it serves {', '.join(served[:10])}); set --openai-model")
        self._client = client
        log.info("openai engine ready: %s model=%s regex=%s", self.settings.base_url, self.model, self.supports_regex)

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        """One chat completion; API and connection errors raise :class:`EngineError`."""
        if self._client is None:
            raise EngineError("openai engine is not running")
        self.check_line_bound(params)
        self.check_logprobs(params)
        self.check_prefix(params)
        import openai

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.regex is not None and self.supports_regex:
            kwargs["extra_body"] = {"structured_outputs": {"regex": params.regex}}
        if params.logprobs is not None:
            kwargs["logprobs"], kwargs["top_logprobs"] = True, params.logprobs
        self._inflight += 1
        try:
            response = await self._client.chat.completions.create(**kwargs)
        except openai.OpenAIError as exc:
            raise self._error(exc, f"request {request_id} failed") from exc
        finally:
            self._inflight -= 1
        if not response.choices:
            raise EngineError(f"openai engine: request {request_id}: the endpoint returned no choices")
        choice = response.choices[0]
        usage = response.usage
        return GenResult(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason or "stop",
            tokens=_token_logprobs(choice) if params.logprobs is not None else None,
        )

    async def stop(self) -> None:
        """Close the HTTP client (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def healthy(self) -> bool:
        """True between a successful ``start`` and ``stop`` (the endpoint is not polled)."""
        return self._client is not None

    def queue_depth(self) -> int:
        """Requests sent and not yet answered."""
        return self._inflight

    def _error(self, exc: Exception, what: str) -> EngineError:
        """An :class:`EngineError` naming endpoint, status and error type (the body only goes to DEBUG)."""
        import openai

        where = self.settings.base_url
        if isinstance(exc, openai.APITimeoutError):
            detail = "timed out"
        elif isinstance(exc, openai.APIConnectionError):
            detail = "unreachable (connection failed)"
        elif isinstance(exc, openai.APIStatusError):
            body = exc.body if isinstance(exc.body, dict) else {}
            err = body.get("error", body) if isinstance(body, dict) else {}
            kind = err.get("type") or err.get("code") if isinstance(err, dict) else None
            detail = f"HTTP {exc.status_code}" + (f" ({kind})" if kind else "")
        else:
            detail = type(exc).__name__
        log.debug("openai engine error detail: %r", exc)
        return EngineError(f"openai engine: {what}: {where} {detail}")


def _token_logprobs(choice: Any) -> list[TokenLogprobs] | None:
    """A choice's ``logprobs.content`` as :class:`TokenLogprobs`; None when the endpoint returned none (or a position
    without its ``top_logprobs``)."""
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if not content or any(not t.top_logprobs for t in content):
        return None
    return [TokenLogprobs(token=t.token, logprob=float(t.logprob),
                          top=top_logprobs((a.token, float(a.logprob)) for a in t.top_logprobs))
            for t in content]
