"""Typed settings of each engine backend, one dataclass each (vLLM's ``EngineArgs`` pattern).

Each backend reads only its own settings object from :class:`judge.engines.base.EngineConfig`; the server's flags
and environment names are generated from these fields (:mod:`judge.settings`). Values are checked when the object
is built (``__post_init__`` raises ValueError naming the field and what it expects).
"""

from __future__ import annotations

from dataclasses import dataclass

from judge.settings import setting

#: The libraries that compute the transformers engine's grammar masks (vLLM's names) -> the module each needs.
GRAMMAR_BACKENDS = {"guidance": "llguidance", "xgrammar": "xgrammar"}
#: How an engine bounds the judge's one-line rationale (``GenParams.max_line_chars``), ``EngineConfig.rationale_bound``
#: (one setting for every backend, ``--rationale-bound``; it replaces the transformers engine's ``line_bound``):
#: ``counted``: a counted repetition in the verdict regex (``[^\n]{1,100}``; the engine takes no line bound);
#: ``max_tokens`` (vLLM only): an unbounded rationale pattern, the round's ``max_tokens`` ends a runaway line and an
#: answer with a line over the bound is cut before that line (unparsable: the judge re-generates it);
#: ``line`` (vLLM and transformers): an unbounded rationale pattern plus the line bound in the engine (transformers:
#: in its token mask; vLLM: a V1 logits processor, :mod:`judge.engines.vllm_line_bound`).
#: ``auto`` (the default) is each backend's fastest that holds the bound while decoding: ``line`` on transformers
#: (1.6-1.9x faster there than ``counted``), ``counted`` on vLLM and on an OpenAI endpoint (the only one it can take:
#: the bound travels in the regex). ``max_tokens`` is not an ``auto`` choice: a judge that writes past the bound (the
#: bare base does) has its rounds cut and re-generated until they fail (docs/reward_server.md, "The rationale bound
#: on the GPU"); the CUDA image sets ``line`` for the 1.5B judge (1.75 s a judged step against 2.84 s with ``counted``).
RATIONALE_BOUNDS = ("counted", "max_tokens", "line")
#: the bounds each backend can apply (``auto`` resolves to the first)
BACKEND_BOUNDS = {"transformers": ("line", "counted"), "vllm": ("counted", "max_tokens", "line"), "openai": ("counted",)}


def rationale_bound_of(backend: str, bound: str) -> str:
    """The bound ``backend`` applies for the setting ``bound`` (``auto``: its fastest); ValueError for one it cannot
    apply, naming those it can."""
    can = BACKEND_BOUNDS.get(backend, ("counted",))
    if bound == "auto":
        return can[0]
    if bound not in can:
        raise ValueError(f"rationale_bound {bound!r}: the {backend} engine takes {', '.join(('auto', *can))}")
    return bound


#: vLLM's structured-outputs backends the judge's regex can take (``auto``: vLLM picks; xgrammar for a regex)
STRUCTURED_OUTPUTS_BACKENDS = ("auto", "xgrammar", "guidance")
#: xgrammar's mask-apply kernels.
GRAMMAR_KERNELS = ("auto", "cpu", "cuda", "triton", "torch_compile", "torch_native")


@dataclass(frozen=True)
class VllmSettings:
    """The vLLM backend (``AsyncLLM``): memory, KV cache and LoRA."""

    gpu_memory_utilization: float = setting(0.3, help="fraction of GPU memory for the model and KV cache")
    kv_cache_gib: float | None = setting(
        None, help="KV cache size in GiB (none: 2 GiB on CPU; on GPU --gpu-memory-utilization decides)")
    enable_prefix_caching: bool = setting(
        True, flag="--no-prefix-caching", help="prefix caching (the judge rounds and a group's candidates share prefixes)")
    block_size: int | None = setting(None, help="KV block size in tokens (none: 32 on CPU, vLLM's on GPU)")
    max_lora_rank: int = setting(64, help="the largest LoRA rank an adapter may have")
    max_num_batched_tokens: int | None = setting(
        None, help="tokens vLLM's scheduler puts in one engine step (prefill chunks and decodes together); none: "
                   "vLLM's default for an AsyncLLM, 2,048 (its LLM class takes 16,384 on an H100/H200). A GRPO step's "
                   "32 candidates prefill their rounds' new prompt tokens in chunks of it")
    structured_outputs_backend: str = setting(
        "auto", choices=STRUCTURED_OUTPUTS_BACKENDS,
        help="the library vLLM computes the verdict masks with (auto: vLLM's choice, xgrammar for a regex; guidance: "
             "llguidance, 4-6x cheaper masks than xgrammar for the counted bound, bench.grammar_fill)")
    cpu_reserved_cores: int | None = setting(
        0, help="on CPU: cores vLLM-CPU keeps for its scheduler process instead of computing on them "
                "(VLLM_CPU_NUM_OF_RESERVED_CPU, set before vLLM starts; 0: compute on every core, 1.86x the "
                "judgments of vLLM's own default on 2 cores; none: vLLM's default, one core reserved)")

    def __post_init__(self) -> None:
        if self.cpu_reserved_cores is not None and (isinstance(self.cpu_reserved_cores, bool)
                                                    or self.cpu_reserved_cores < 0):
            raise ValueError(f"cpu_reserved_cores {self.cpu_reserved_cores!r}: expected an integer >= 0 (or none "
                             "for vLLM's default)")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization {self.gpu_memory_utilization}: expected a fraction in (0, 1]")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib {self.kv_cache_gib}: expected > 0 GiB (or none for the default)")
        if self.structured_outputs_backend not in STRUCTURED_OUTPUTS_BACKENDS:
            raise ValueError(f"structured_outputs_backend {self.structured_outputs_backend!r}: expected one of "
                             f"{', '.join(STRUCTURED_OUTPUTS_BACKENDS)}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size {self.block_size}: expected >= 1 tokens")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens {self.max_num_batched_tokens}: expected >= 1 tokens a step "
                             "(or none for vLLM's default)")


@dataclass(frozen=True)
class TransformersSettings:
    """The transformers backend: micro-batching, static KV cache and grammar masks."""

    max_batch: int = setting(32, help="micro-batch size (rows of one model.generate call)")
    max_wait_ms: float = setting(5.0, help="how long a micro-batch waits to fill")
    static_cache: bool = setting(
        False, help="on CUDA: static KV cache + torch.compile (75-110 s compile warm-up; see "
                    "docs/reward_server.md)")
    merge_adapter: bool = setting(True, help="merge LoRA weights into the base for speed")
    grammar_backend: str = setting("xgrammar", choices=tuple(GRAMMAR_BACKENDS),
                                   help="the library that computes the verdict masks")
    grammar_kernel: str = setting("auto", choices=GRAMMAR_KERNELS,
                                  help="xgrammar's mask-apply kernel (auto: Triton on CUDA, native on "
                                       "CPU; torch_native needs no JIT compiler)")
    grammar_threads: int = setting(1, help="threads filling a batch's verdict masks (more only pays for "
                                           "grammars with long counted repetitions: --rationale-bound counted; "
                                           "see bench.grammar_fill)")

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_wait_ms < 0:
            raise ValueError("transformers engine: max_batch must be >= 1 and max_wait_ms >= 0")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend {self.grammar_backend!r}: expected one of "
                             f"{', '.join(GRAMMAR_BACKENDS)}")
        if self.grammar_kernel not in GRAMMAR_KERNELS:
            raise ValueError(f"grammar_kernel {self.grammar_kernel!r}: expected one of {', '.join(GRAMMAR_KERNELS)}")
        if isinstance(self.grammar_threads, bool) or self.grammar_threads < 1:
            raise ValueError(f"grammar_threads {self.grammar_threads!r}: expected an integer >= 1")


@dataclass(frozen=True)
class OpenAISettings:
    """An OpenAI-compatible chat-completions endpoint (a remote vLLM server, a gateway, OpenAI)."""

    base_url: str | None = setting(None, env="OPENAI_BASE_URL", help="the endpoint, e.g. http://host:8000/v1")
    api_key: str | None = setting(None, env="OPENAI_API_KEY", help="API key (EMPTY when unset)")
    model: str | None = setting(None, help="served model name (none: --model, else the endpoint's first)")
    regex: bool = setting(False, help="the endpoint is vLLM, send structured outputs (regex)")
    logprobs: bool = setting(True, help="the endpoint returns logprobs with top_logprobs (OpenAI and vLLM do; off "
                                        "for one that rejects them: the judge then serves no graded rewards)")
    max_retries: int = setting(2, help="client retries on connection errors, 429 and 5xx")
    timeout_s: float = setting(600.0, help="per-request timeout in seconds")

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.timeout_s <= 0:
            raise ValueError("openai engine: max_retries must be >= 0 and timeout_s > 0")


__all__ = ["GRAMMAR_BACKENDS", "GRAMMAR_KERNELS", "RATIONALE_BOUNDS", "STRUCTURED_OUTPUTS_BACKENDS", "OpenAISettings", "TransformersSettings", "VllmSettings", "rationale_bound_of"]
