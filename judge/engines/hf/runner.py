"""The generating side of the transformers engine: the loaded model and one ``model.generate`` call per batch.

Every model call of every transformers engine in the process (load, warm-up, generate) runs on one thread,
:data:`MODEL_THREAD`: torch.compile's CUDA-graph trees keep their state in thread-local storage set up on the thread
that first used them, so a graph used from any other thread fails (``assert torch._C._is_key_in_tls(...)``, seen on
an H200 when generation hopped between pool threads, and when a second engine started on a thread of its own).

One call (:meth:`ModelRunner.generate_batch`) renders and tokenizes the batch's chats, left-pads them, runs ONE
``model.generate`` and decodes each row. ``max_tokens`` may differ inside a batch: the call runs to the largest, and
a per-row stopping criterion (:class:`RowStop`) ends each row at its own limit (its output is also trimmed to it), so
results equal a solo run's (up to padding numerics). ``finish_reason`` is ``"length"`` when the row hit its
``max_tokens`` (or the context limit) without emitting EOS, else ``"stop"``; ``output_tokens`` counts the EOS token
when generation stopped on it (as vLLM does). Sampling uses exactly ``temperature`` and ``top_p`` (top-k off, no
repetition penalty); a request ``seed`` re-seeds torch before its batch (reproducible for the same batch
composition only: rows share one RNG stream). ``GenParams.logprobs``: the unmasked distribution of every kept output
token (:mod:`judge.engines.hf.logprobs`), for the rows that ask. ``GenParams.prefix``: appended to the rendered
prompt; the row decodes the continuation, its text is the prefix plus the continuation, and its line bound starts
the first line at the prefix's last line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from judge.device import resolve_device_dtype
from judge.engines.base import EngineConfig, EngineError, GenParams, GenResult, Message
from judge.engines.hf.grammar import Grammars
from judge.engines.hf.line_bound import prefix_line_bytes
from judge.engines.hf.logprobs import LogprobTap, PieceText, row_tokens
from judge.engines.hf.mask import GrammarMask
from judge.engines.hf.static_cache import StaticKV
from judge.engines.hf.stats import GenerateStats

if TYPE_CHECKING:
    import torch

#: The one thread every model call runs on (see the module docstring).
MODEL_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-model")

SamplingKey = tuple[float, float, int | None]


def sampling_key(params: GenParams) -> SamplingKey:
    """Requests with equal keys may share one ``generate`` call (greedy ignores top_p and seed)."""
    if params.temperature <= 0:
        return (0.0, 1.0, None)
    return (float(params.temperature), float(params.top_p), params.seed)


@dataclass(eq=False)  # identity semantics: deque.remove() must find this very request
class Request:
    messages: list[Message]
    params: GenParams
    request_id: str
    future: asyncio.Future[GenResult]
    cancelled: bool = False  # set on the loop thread, read by the generating thread

    @property
    def key(self) -> SamplingKey:
        return sampling_key(self.params)


def left_pad(ids: list[list[int]], pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of the rows left-padded to the longest, on ``device`` (what ``tokenizer.pad``
    returns for left padding, without its per-row Python work: 7-9 ms for 32 judge prompts on one CPU thread)."""
    import numpy as np
    import torch

    width = max(len(row) for row in ids)
    tokens = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for r, row in enumerate(ids):
        if row:
            tokens[r, width - len(row):] = row
            mask[r, width - len(row):] = 1
    return torch.from_numpy(tokens).to(device), torch.from_numpy(mask).to(device)


class ModelRunner:
    """The loaded model, tokenizer and grammar backend of one engine; built and used on :data:`MODEL_THREAD` only.

    ``constrain``: apply ``GenParams.regex`` (the grammar libraries are installed). ``stopping``: true once the engine
    stops (the running call ends at its next step). Timings go to ``stats``.
    """

    def __init__(self, config: EngineConfig, stats: GenerateStats, constrain: bool,
                 stopping: Callable[[], bool]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        s = config.transformers
        torch.manual_seed(config.seed)
        device, dtype = resolve_device_dtype(config.device, config.dtype)
        tok = AutoTokenizer.from_pretrained(config.model_path, local_files_only=True)
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model: Any = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=dtype, local_files_only=True)
        if config.adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, config.adapter, is_trainable=False)
            if s.merge_adapter:
                model = model.merge_and_unload()
        model.to(device)
        model.eval()
        eos = model.generation_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if tok.eos_token_id is not None and tok.eos_token_id not in eos_ids:
            eos_ids.append(tok.eos_token_id)
        if not eos_ids:
            raise EngineError("transformers engine: the model defines no EOS token")
        self.model: Any = model
        self.tokenizer: Any = tok
        self.device: str = device
        self.eos_ids = eos_ids
        self.stats = stats
        self.grammars = Grammars(s.grammar_backend, s.grammar_threads, tok, int(model.config.vocab_size), eos_ids)
        self._constrain = constrain
        self._stopping = stopping
        self._max_model_len = config.max_model_len
        self._max_batch = s.max_batch
        self._static_cache = s.static_cache
        self._piece = PieceText(tok)  # token texts of GenParams.logprobs
        # "auto" is xgrammar's choice: one Triton kernel on CUDA (JIT-compiled in the warm-up; needs a host C
        # compiler, as torch.compile does), its native kernel on CPU. "torch_native" (a few torch ops) needs no
        # compiler; on an H200 it judged within 5% of Triton's time.
        self._grammar_kernel = s.grammar_kernel
        # the one static KV cache every call reuses (static_cache; None otherwise)
        self._kv = StaticKV(model.config, config.max_model_len) if s.static_cache else None

    @property
    def kv(self) -> StaticKV | None:
        """The reused static KV cache (static_cache), else None."""
        return self._kv

    def generate_batch(self, batch: list[Request]) -> list[GenResult | EngineError]:
        """Render, left-pad, generate and decode one batch: one result or error per request, in order."""
        import torch
        from transformers import GenerationConfig

        tok, model = self.tokenizer, self.model
        if tok is None or model is None:
            raise EngineError("transformers engine has no model loaded")
        out: list[GenResult | EngineError | None] = [None] * len(batch)
        rows: list[int] = []
        ids: list[list[int]] = []
        limits: list[int] = []
        t_prep = time.perf_counter()
        texts: dict[int, str] = {}
        for i, req in enumerate(batch):
            try:
                texts[i] = tok.apply_chat_template(req.messages, add_generation_prompt=True,
                                                   tokenize=False) + (req.params.prefix or "")
            except (ValueError, TypeError, KeyError) as exc:
                out[i] = EngineError(f"chat template failed: {type(exc).__name__}")
        # one tokenizer call for the batch (the fast tokenizer's batch path)
        encoded = tok(list(texts.values()), add_special_tokens=False)["input_ids"] if texts else []
        for i, prompt in zip(texts, encoded):
            req = batch[i]
            room = self._max_model_len - len(prompt)
            if room < 1:
                out[i] = EngineError(f"prompt has {len(prompt)} tokens; max_model_len is {self._max_model_len}")
                continue
            rows.append(i)
            ids.append(prompt)
            limits.append(min(req.params.max_tokens, room))
        if rows:
            dummies = 0
            if self._kv is not None and len(ids) < self._max_batch:
                # one batch shape for the compiled decode graph: fill with copies of the shortest prompt, rows
                # that the stopping criterion ends at once (a new batch size would cost a long recompile)
                dummies = self._max_batch - len(ids)
                ids = ids + [min(ids, key=len)] * dummies
            input_ids, attention_mask = left_pad(ids, tok.pad_token_id, self.device)
            prompt_len = input_ids.shape[1]
            params = batch[rows[0]].params
            greedy = params.temperature <= 0
            gen_config = GenerationConfig(
                max_new_tokens=max(limits),
                do_sample=not greedy,
                temperature=1.0 if greedy else params.temperature,
                top_p=1.0 if greedy else params.top_p,
                top_k=50 if greedy else 0,  # 50 is the unused default for greedy (avoids a warning)
                repetition_penalty=1.0,
                num_beams=1,
                pad_token_id=tok.pad_token_id,
                eos_token_id=self.eos_ids,
            )
            stop = RowStop([batch[i] for i in rows], limits + [1] * dummies, prompt_len, self.device,
                           self._stopping, dummies)
            patterns = [batch[i].params.regex if self._constrain else None for i in rows] + [None] * dummies
            bounds = [batch[i].params.max_line_chars for i in rows] + [None] * dummies
            starts = [prefix_line_bytes(batch[i].params.prefix) for i in rows] + [0] * dummies
            g = self.grammars
            mask = GrammarMask(g.rows(patterns), g.vocab_size, self._grammar_kernel,
                               g.line_table() if any(bounds) else None, bounds, starts) if any(patterns) else None
            ks = [batch[i].params.logprobs or 0 for i in rows]
            tap = LogprobTap(max(ks)) if any(ks) else None
            processors: list[Any] = ([] if tap is None else [tap]) + ([] if mask is None else [mask])
            t_gen = time.perf_counter()
            with torch.inference_mode():
                if not greedy and params.seed is not None:
                    torch.manual_seed(params.seed)
                cache: dict[str, Any] = {}
                if self._kv is not None:
                    cache["past_key_values"] = self._kv.get(prompt_len + max(limits))
                elif self._static_cache:
                    gen_config.cache_implementation = "static"
                generated = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                           generation_config=gen_config, **cache,
                                           stopping_criteria=[stop] if mask is None else [stop, mask.tap],
                                           logits_processor=processors)
            new = generated[:, prompt_len:].tolist()
            top_v, top_i, chosen = tap.rows(generated[:, prompt_len:]) if tap is not None else ([], [], [])
            t_end = time.perf_counter()
            self.stats.prep_s.append(t_gen - t_prep)
            self.stats.generate_s.append(t_end - t_gen)
            if mask is not None and mask.first_call is not None:
                self.stats.prefill_s.append(mask.first_call - t_gen)
                if mask.second_call is not None:
                    self.stats.first_decode_s.append(mask.second_call - mask.first_call)
                self.stats.device_wait_s.append(mask.device_wait)
                self.stats.mask_host_s.append(mask.host)
                self.stats.loop_host_s.append(t_end - mask.first_call - mask.device_wait - mask.host)
                self.stats.untapped_positions += mask.untapped
            self.stats.decode_steps.append(generated.shape[1] - prompt_len)
            eos = set(self.eos_ids)
            for row, i in enumerate(rows):
                tokens = new[row][: limits[row]]
                end = next((j for j, t in enumerate(tokens) if t in eos), None)
                kept = tokens if end is None else tokens[:end]
                out[i] = GenResult(
                    text=(batch[i].params.prefix or "") + tok.decode(kept, skip_special_tokens=True),
                    prompt_tokens=len(ids[row]),
                    output_tokens=len(tokens) if end is None else end + 1,
                    finish_reason="length" if end is None else "stop",
                    tokens=None if not ks[row] else row_tokens(
                        kept, [v[: ks[row]] for v in top_v[row]], [x[: ks[row]] for x in top_i[row]], chosen[row],
                        self._piece),
                )
        return [r if r is not None else EngineError("internal: row not generated") for r in out]

    def release(self) -> None:
        """Free the model (the engine stopped)."""
        on_cuda = self.device.startswith("cuda")
        if self._kv is not None:
            self._kv.clear()
        self.model = None
        self.tokenizer = None
        gc.collect()
        if on_cuda:
            import torch

            torch.cuda.empty_cache()


class RowStop:
    """Per-row stop for ``model.generate`` (duck-typed ``transformers.StoppingCriteria``, kept free of a
    module-level transformers import): the row reached its own ``max_tokens``, its request was cancelled, or the
    engine is stopping.

    The length test is a pure device op (no host sync per step); the cancellation mask is copied to the device
    only when a new cancellation is seen.
    """

    def __init__(self, requests: list[Request], limits: list[int], prompt_len: int, device: str,
                 stopping: Callable[[], bool], dummies: int = 0) -> None:
        import torch

        self._requests = requests
        self._limits = torch.tensor(limits, device=device)
        self._prompt_len = prompt_len
        self._device = device
        self._stopping = stopping
        self._dummies = [True] * dummies  # filler rows (static cache): done from the first step
        self._seen_cancelled = 0
        self._cancel_mask: torch.Tensor | None = None
        if dummies:
            self._cancel_mask = torch.tensor([False] * len(requests) + self._dummies, device=device)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        import torch

        done = (input_ids.shape[1] - self._prompt_len) >= self._limits
        if self._stopping():
            return torch.ones_like(done)
        cancelled = [r.cancelled for r in self._requests]
        count = sum(cancelled)
        if count != self._seen_cancelled:
            self._seen_cancelled = count
            self._cancel_mask = torch.tensor(cancelled + self._dummies, device=self._device)
        if self._cancel_mask is not None:
            done = done | self._cancel_mask
        return done
