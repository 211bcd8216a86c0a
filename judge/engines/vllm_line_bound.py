"""The judge's line bound (``GenParams.max_line_chars``) on vLLM: a V1 custom logits processor, and the check that
keeps an answer within the bound whatever bounded it.

:class:`LineBoundLogitsProcessor` is vLLM's per-batch logits-processor interface (``vllm.v1.sample.logits_processor``:
``update_state`` with the batch's added, removed and moved requests, then ``apply`` on the batch's logits). A request
opts in through ``SamplingParams.extra_args[LINE_ARG]`` (and ``[LINE_START_ARG]``: the bytes an answer prefix already
put on the first line); for it, every token that would carry the current line past
the bound gets ``-inf``, from the same token byte lengths as the transformers engine's bound
(:class:`judge.engines.hf.line_bound.LineTable`). It runs after vLLM's structured-output bitmask, so a row keeps the
grammar's tokens that also fit the line; a newline token always fits. vLLM loads it in its engine-core process by its
qualified name (:data:`PROCESSOR`), so this module imports vLLM only there.

:func:`cut_at_overlong_line` is the bound's last word on every bounded answer: a line over the bound ends the answer
before it (the judge then finds a verdict missing and re-generates the round), never an over-long rationale served.
"""

from __future__ import annotations

from typing import Any

#: ``SamplingParams.extra_args`` key of a request's line bound (characters; UTF-8 bytes in the processor, stricter).
LINE_ARG = "compeer_max_line_chars"
#: ``SamplingParams.extra_args`` key of the bytes already on the first line (an answer prefix's last line; default 0).
LINE_START_ARG = "compeer_line_start"
#: The processor's qualified name, as ``AsyncEngineArgs(logits_processors=[...])`` takes it.
PROCESSOR = "judge.engines.vllm_line_bound:LineBoundLogitsProcessor"


def cut_at_overlong_line(text: str, max_line_chars: int) -> tuple[str, bool]:
    """``(text, False)`` when every line fits in ``max_line_chars`` characters, else ``(the lines before the first
    over-long one, True)``."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if len(line) > max_line_chars:
            return "\n".join(lines[:i]), True
    return text, False


def _processor_base() -> type:
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
    except ImportError:  # no vLLM here: the class is only instantiated inside vLLM's engine core
        return object
    return LogitsProcessor  # type: ignore[no-any-return]


class LineBoundLogitsProcessor(_processor_base()):  # type: ignore[misc]
    """vLLM V1 logits processor: keeps each opted-in request's lines within its ``extra_args[LINE_ARG]`` bound."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        import torch
        from transformers import AutoTokenizer

        mc = vllm_config.model_config
        tok = AutoTokenizer.from_pretrained(mc.tokenizer, local_files_only=True)
        vocab = int(mc.get_vocab_size())
        self.table = token_line_table(tok, vocab)
        self.head = torch.tensor(self.table.head, dtype=torch.int32, device=device)
        self.device = device
        # batch index -> [bound, current line length, output tokens already counted, the live output token list]
        self.rows: dict[int, list[Any]] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        extra = sampling_params.extra_args or {}
        bound, start = extra.get(LINE_ARG), extra.get(LINE_START_ARG, 0)
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
            raise ValueError(f"extra_args[{LINE_ARG!r}] {bound!r}: expected an integer >= 1")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"extra_args[{LINE_START_ARG!r}] {start!r}: expected an integer >= 0")

    def is_argmax_invariant(self) -> bool:
        return False  # it removes tokens, greedy decoding included

    def update_state(self, batch_update: Any) -> None:
        if batch_update is not None:
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output in batch_update.added:
                extra = (params.extra_args or {}) if params is not None else {}
                bound = extra.get(LINE_ARG)
                if bound is None:
                    self.rows.pop(index, None)
                else:
                    self.rows[index] = [int(bound), int(extra.get(LINE_START_ARG, 0)), 0, output]
            for a, b, direction in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and direction.name == "SWAP":
                    self.rows[a] = rb
        self._advance()

    def _advance(self) -> None:
        """Count each row's output tokens not yet counted into its current line. Under async scheduling the last
        token may still be a placeholder (-1) in ``update_state``; vLLM fills it in before sampling, so ``apply``
        counts again."""
        for row in self.rows.values():
            output = row[3]
            while row[2] < len(output) and output[row[2]] >= 0:
                t = output[row[2]]
                if 0 <= t < len(self.table.tail):
                    tail = self.table.tail[t]
                    row[1] = tail if tail >= 0 else row[1] + self.table.head[t]
                row[2] += 1

    def apply(self, logits: Any) -> Any:
        import torch

        self._advance()
        tight = [(i, row[0] - row[1]) for i, row in self.rows.items()
                 if row[0] - row[1] < self.table.longest and i < logits.shape[0]]
        if not tight:
            return logits
        index = torch.tensor([i for i, _ in tight], device=logits.device)
        room = torch.tensor([max(0, r) for _, r in tight], dtype=torch.int32, device=logits.device)
        width = min(logits.shape[1], self.head.shape[0])
        over = self.head[None, :width] > room[:, None]
        sub = logits[index, :width]
        logits[index, :width] = sub.masked_fill(over, float("-inf"))
        return logits


def token_line_table(tokenizer: Any, vocab_size: int) -> Any:
    """The :class:`judge.engines.hf.line_bound.LineTable` of a Hugging Face tokenizer (token bytes as xgrammar
    decodes them; special tokens count 0)."""
    import xgrammar as xgr

    from judge.engines.hf.line_bound import LineTable

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    special = set(info.special_token_ids) | set(info.stop_token_ids) | set(tokenizer.all_special_ids)
    return LineTable([bytes(t) for t in info.decoded_vocab], vocab_size, special)


__all__ = ["LINE_ARG", "LINE_START_ARG", "PROCESSOR", "LineBoundLogitsProcessor", "cut_at_overlong_line", "token_line_table"]
