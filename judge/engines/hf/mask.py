"""The grammar mask of a constrained batch: a logits processor that fills each row's token bitmask and applies it.

Each step's tokens are tapped to the host before the next forward pass is queued (:meth:`GrammarMask.tap`); on CUDA
the host mask is pinned and copied without blocking the host, so the mask's host work overlaps the device.
"""

from __future__ import annotations

import time
from typing import Any

from judge.engines.base import EngineError
from judge.engines.hf.grammar import GuidanceRows, XgrammarRows
from judge.engines.hf.line_bound import LineTable


class GrammarMask:
    """Constrains each row to its own grammar (duck-typed ``transformers.LogitsProcessor``): the backend's row
    matchers fill a token bitmask, xgrammar's kernel applies it to the scores.

    Rows without a grammar are left free. A row that leaves its grammar (it was stopped by its own ``max_tokens`` or
    cancelled and now receives padding) is no longer constrained: its output is already final.

    ``tap`` is registered as a stopping criterion (it never stops a row): it queues a copy of each newly appended
    token column to the host before the next forward pass is queued, so the next mask call reads the tokens as soon
    as that copy lands and fills the masks on the host while the device runs the forward pass, instead of waiting
    for the forward pass to finish. Without a tap for the step the call reads the tokens itself (``untapped``).
    """

    def __init__(self, rows: XgrammarRows | GuidanceRows, vocab_size: int, kernel: str,
                 lines: LineTable | None = None, bounds: list[int | None] | None = None,
                 starts: list[int] | None = None) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._rows = rows
        # GenParams.max_line_chars per row (None: unbounded) and the length of each row's current line (``starts``:
        # the bytes an answer prefix already put on a row's first line)
        self._lines = lines
        self._bound = {i: b for i, b in enumerate(bounds or []) if b is not None} if lines is not None else {}
        self._line_len = list(starts) if starts is not None else [0] * len(rows)
        self._mask = xgr.allocate_token_bitmask(len(rows), vocab_size)
        self._device_mask: Any = None  # CUDA: the mask's device copy (the host mask is then pinned)
        self._mask_copied: Any = None  # CUDA event recorded after the host mask was copied
        self._stream: Any = None  # CUDA: the model's device's stream (a model on cuda:1 is not on the current device)
        self._kernel: Any = kernel  # one of GRAMMAR_KERNELS (xgrammar types it as a Literal)
        self._calls = 0  # mask calls so far (the first one follows the prefill and reads no token)
        self._taps = 0  # token columns tapped so far
        self._tapped: Any = None  # host copy of the last tapped column (pinned on CUDA)
        self._tap_done: Any = None  # CUDA event recorded after that copy
        self._never: Any = None  # the tap's "no row stops" answer, allocated once
        # timings (perf_counter seconds) and counters for GenerateStats
        self.first_call: float | None = None
        self.second_call: float | None = None
        self.device_wait = 0.0
        self.host = 0.0
        self.untapped = 0

    def tap(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        """Stopping-criterion hook: queue the host copy of the tokens just appended; never stops a row."""
        import torch

        column = input_ids[:, -1]
        if self._never is None:
            self._never = torch.zeros(column.shape, dtype=torch.bool, device=column.device)
            if column.is_cuda:
                self._tapped = torch.empty(column.shape, dtype=column.dtype, pin_memory=True)
                self._tap_done = torch.cuda.Event()
                self._stream = torch.cuda.current_stream(column.device)
        if column.is_cuda:
            self._tapped.copy_(column, non_blocking=True)
            self._tap_done.record(self._stream)
        else:
            self._tapped = column.clone()
        self._taps += 1
        return self._never

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        t0 = time.perf_counter()
        if self._calls == 0:
            self.first_call = t0
        else:
            if self._calls == 1:
                self.second_call = t0
            if self._taps == self._calls:  # the tap saw this step's tokens
                if self._tap_done is not None:
                    self._tap_done.synchronize()  # the copy only, queued before this step's forward pass
                last = self._tapped.tolist()
            else:
                last = input_ids[:, -1].tolist()  # waits for the device, this step's forward pass included
                self.untapped += 1
            t1 = time.perf_counter()
            self.device_wait += t1 - t0
            t0 = t1
            rows = self._rows.live()
            self._rows.accept(rows, [last[i] for i in rows])
            if self._lines is not None:
                self._lines.advance(self._line_len, list(self._bound), [last[i] for i in self._bound])
        self._calls += 1
        live = self._rows.live()
        if live:
            if scores.device.type not in ("cuda", "cpu"):
                raise EngineError(f"constrained decoding supports cuda and cpu, not {scores.device.type}")
            if scores.is_cuda and self._device_mask is None:
                import torch

                self._mask = self._mask.pin_memory()
                self._device_mask = torch.empty_like(self._mask, device=scores.device)
                self._mask_copied = torch.cuda.Event()
                self._stream = torch.cuda.current_stream(scores.device)
            elif scores.is_cuda:
                self._mask_copied.synchronize()  # the last step's copy has read the host mask (long done, normally)
            self._xgr.reset_token_bitmask(self._mask)
            self._rows.fill(live, self._mask)
            if self._lines is not None:
                bounded = [i for i in live if i in self._bound]
                self._lines.restrict(self._mask, bounded, [self._bound[i] - self._line_len[i] for i in bounded])
            device_mask = self._mask
            if scores.is_cuda:  # queued behind this step's forward pass: the host does not wait for it here
                self._device_mask.copy_(self._mask, non_blocking=True)
                self._mask_copied.record(self._stream)
                device_mask = self._device_mask
            self._xgr.apply_token_bitmask_inplace(scores, device_mask, vocab_size=scores.shape[-1],
                                                  backend=self._kernel)
        self.host += time.perf_counter() - t0
        return scores
