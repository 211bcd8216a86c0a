"""The transformers backend: micro-batched ``model.generate`` for machines without vLLM (e.g. the GPU boxes).

Requests are queued; one worker task takes the oldest request plus up to ``max_batch - 1`` queued requests with
the same sampling key, waiting at most ``max_wait_ms`` for the batch to fill, and runs ONE left-padded
``model.generate`` call for them on the model thread (:mod:`judge.engines.hf.runner`; the event loop stays free).

Batching rules (what a caller can rely on):

* Sampling key: greedy requests (``temperature == 0``) all share one key; sampled requests share a key only
  with identical ``(temperature, top_p, seed)``. Requests with different keys are never mixed in one call.
* ``max_tokens`` may differ inside a batch; each row ends at its own limit and its result equals a solo run's (up to
  padding numerics): see :mod:`judge.engines.hf.runner` for ``finish_reason``, sampling and seeds.
* Cancelling the awaiting task drops a queued request before it is generated; a running row is stopped at the
  next decoding step (the rest of its batch continues).
* ``GenParams.regex`` constrains a row's output when the grammar libraries are installed (``supports_regex``);
  rows of one batch may carry different patterns (:mod:`judge.engines.hf.grammar`, :mod:`judge.engines.hf.mask`).
  Without them the pattern is ignored and the judge relies on parse + retry. ``GenParams.max_line_chars`` caps every
  line of a constrained row (``supports_line_bound``; :mod:`judge.engines.hf.line_bound`).
* ``GenParams.logprobs`` (``supports_logprobs``): the log-softmax of the unmasked, untempered logits at every kept
  output token, top k (:mod:`judge.engines.hf.logprobs`); requests with and without it share batches.

Speed on GPU: ``static_cache`` (``--static-cache``; off by default because its compile warm-up takes 75-110 s) makes
transformers compile the decode step with CUDA graphs over one reused static KV cache
(:mod:`judge.engines.hf.static_cache`); ``start`` warms up twice so the compiles happen before serving. Judging one
GRPO step (8 groups x 4, unified, constrained; ``python -m bench.hf_judge_engine``, H200): dynamic cache 5.5 s, static
cache 2.3 s, plain batched ``model.generate`` of the same prompts 18.6 s. Every setting:
:class:`judge.engines.settings.TransformersSettings`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from judge.engines.base import Engine, EngineConfig, EngineError, GenParams, GenResult, Message
from judge.engines.hf.grammar import grammar_available
from judge.engines.hf.runner import MODEL_THREAD, ModelRunner, Request
from judge.engines.hf.stats import GenerateStats

log = logging.getLogger(__name__)

# the constrained warm-up probe's pattern (any small grammar: it exercises the mask kernel on the device)
_WARMUP_REGEX = r"[A-Za-z]{1,8}"


class TransformersEngine(Engine):
    """Chat generation with transformers and a micro-batching queue (see the module docstring for the rules).

    ``stats`` (:class:`GenerateStats`) counts batches and splits each call's time (prep, prefill, device wait, mask
    host work, the rest of the loop).
    """

    name = "transformers"
    supports_logprobs = True
    supports_prefix = True  # it renders the chat template itself (GenParams.prefix: judge.engines.hf.runner)

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.settings = s = config.transformers
        self.supports_regex = grammar_available(s.grammar_backend)
        # GenParams.max_line_chars: enforced by the mask (a table of token byte lengths), not by the grammar library
        self.supports_line_bound = self.supports_regex and config.bound == "line"
        self._queue: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._gen_task: asyncio.Future[Any] | None = None
        self._runner: ModelRunner | None = None
        self._started = False
        self._stopping = False
        self.stats = GenerateStats()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load tokenizer + model (+ LoRA adapter) in a thread, warm up, start the batching worker."""
        if self._started:
            return
        if not self.config.model_path:
            raise EngineError("transformers engine: config.model_path is empty (pass a local HF folder)")
        self._runner = await self._on_thread(ModelRunner, self.config, self.stats, self.supports_regex,
                                             lambda: self._stopping)
        # warm-up: first-call kernels and allocations at the full batch size on GPU (a first large batch is
        # otherwise several seconds slower). With the static cache, the second call (a prompt of ~300 tokens: another
        # 256-position cache bucket) makes torch.compile build its length-dynamic decode graph now rather than on a
        # live batch (a GPU run whose warm-up stayed in one bucket spent 50 s compiling in its first reward call).
        loop = asyncio.get_running_loop()
        on_gpu = self._runner.device.startswith("cuda")
        for words, new in ([(1, 2), (300, 8)] if self.settings.static_cache and on_gpu else [(1, 2)]):
            # constrained probes too, so a grammar kernel that cannot run on this device fails the start, not every batch
            params = GenParams(max_tokens=new, regex=_WARMUP_REGEX if self.supports_regex else None)
            probes = [Request([{"role": "user", "content": " ".join(["Hi"] * words)}], params,
                              "warmup", loop.create_future()) for _ in range(self.settings.max_batch if on_gpu else 1)]
            await self._on_thread(self._runner.generate_batch, probes)
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._worker = asyncio.create_task(self._run(), name="transformers-engine-worker")
        self._started = True
        log.info("transformers engine ready: model=%s adapter=%s device=%s dtype=%s max_batch=%d max_wait_ms=%.1f",
                 self.config.model_id or self.config.model_path, self.config.adapter, self._runner.device,
                 self._runner.model.dtype, self.settings.max_batch, self.settings.max_wait_ms)

    async def stop(self) -> None:
        """Stop the worker, fail queued and running requests with :class:`EngineError`, free the model."""
        self._started = False
        self._stopping = True  # the running generate() ends at its next step
        pending = [*self._queue, *self._running]
        worker, self._worker = self._worker, None
        gen_task, self._gen_task = self._gen_task, None
        if worker is not None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        if gen_task is not None:  # the thread cannot be killed: wait for its (now short) generate() to end
            await asyncio.gather(gen_task, return_exceptions=True)
        self._fail_all(EngineError("transformers engine stopped"), pending)
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.release()

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the process's one model thread (:data:`judge.engines.hf.runner.MODEL_THREAD`)."""
        return await asyncio.get_running_loop().run_in_executor(MODEL_THREAD, fn, *args)

    def healthy(self) -> bool:
        """Started, not stopped, and the batching worker alive."""
        return self._started and self._worker is not None and not self._worker.done()

    def queue_depth(self) -> int:
        """Queued (not cancelled) plus running requests."""
        return sum(1 for r in self._queue if not r.cancelled) + len(self._running)

    # ------------------------------------------------------------------ requests
    async def generate(self, messages: list[Message], params: GenParams, request_id: str) -> GenResult:
        """Queue one chat generation and wait for its batch; cancelling the caller drops or stops the request."""
        if not self.healthy() or self._wakeup is None:
            raise EngineError("transformers engine is not running")
        if params.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {params.max_tokens}")
        self.check_line_bound(params)
        self.check_logprobs(params)
        self.check_prefix(params)
        req = Request(messages, params, request_id, asyncio.get_running_loop().create_future())
        self._queue.append(req)
        self._wakeup.set()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True
            try:
                self._queue.remove(req)
                self.stats.dropped_cancelled += 1
            except ValueError:
                pass  # already taken into a batch: the stopping criterion ends its row
            raise

    def _fail_all(self, exc: EngineError, extra: list[Request] | None = None) -> None:
        for req in [*(extra or []), *self._queue, *self._running]:
            if not req.future.done():
                req.future.set_exception(exc)
        self._queue.clear()
        self._running = []

    # ------------------------------------------------------------------ batching worker
    async def _run(self) -> None:
        try:
            while True:
                batch = await self._next_batch()
                if batch:
                    await self._execute(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the worker died: fail everyone, healthy() turns false
            log.exception("transformers engine worker died")
            self._fail_all(EngineError(f"transformers engine worker died: {type(exc).__name__}"))
            raise

    async def _next_batch(self) -> list[Request]:
        assert self._wakeup is not None
        while not self._queue:
            self._wakeup.clear()
            await self._wakeup.wait()
        deadline = time.monotonic() + self.settings.max_wait_ms / 1000.0
        while len(self._queue) < self.settings.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                break
        while self._queue and self._queue[0].cancelled:
            self._queue.popleft()
        if not self._queue:
            return []
        key = self._queue[0].key
        batch: list[Request] = []
        rest: collections.deque[Request] = collections.deque()
        for req in self._queue:
            if req.cancelled:
                continue
            if len(batch) < self.settings.max_batch and req.key == key:
                batch.append(req)
            else:
                rest.append(req)
        self._queue = rest
        return batch

    async def _execute(self, batch: list[Request]) -> None:
        self._running = batch
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.batch_sizes.append(len(batch))
        runner = self._runner
        if runner is None:
            raise EngineError("transformers engine has no model loaded")
        self._gen_task = asyncio.ensure_future(self._on_thread(runner.generate_batch, batch))
        try:
            results = await asyncio.shield(self._gen_task)
        except Exception as exc:
            log.error("transformers batch of %d failed: %s", len(batch), type(exc).__name__)
            log.debug("transformers batch failure detail", exc_info=True)
            error = EngineError(f"transformers generation failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            for req in batch:
                if not req.future.done():
                    req.future.set_exception(error)
            return
        finally:
            self._gen_task = None
            self._running = []
            self.stats.trim()
        for req, result in zip(batch, results):
            if req.future.done():
                continue
            if isinstance(result, EngineError):
                req.future.set_exception(result)
            else:
                self.stats.output_tokens += result.output_tokens
                req.future.set_result(result)
