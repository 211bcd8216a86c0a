"""``GenParams.logprobs`` for the transformers engine: the model's own distribution at every generated position.

:class:`LogprobTap` is a logits processor placed FIRST in ``model.generate``'s list: transformers runs a caller's
processors after its built-in ones (none of which is active for the engine's generation config: no repetition
penalty, no minimum length) and before the sampling warpers (temperature, top-p), so the tap sees the unmasked,
untempered logits. It keeps the top k of their log-softmax per step, and the chosen token's log-probability (read at
the next step, or at the end, from the step's log-softmax). It is only added when a row of the batch asks, so a
batch without logprobs pays nothing; one that asks pays a log-softmax and a top-k per step (all rows computed, the
rows that asked returned).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from judge.engines.base import TokenLogprobs, top_logprobs

if TYPE_CHECKING:
    import torch


class LogprobTap:
    """Records the top-``k`` log-probabilities of every step (duck-typed ``transformers.LogitsProcessor``; it returns
    the scores unchanged)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._values: list[torch.Tensor] = []  # per step: (batch, k)
        self._indices: list[torch.Tensor] = []
        self._chosen: list[torch.Tensor] = []  # per step: (batch,) logprob of the token chosen at that step
        self._last: torch.Tensor | None = None  # the last step's log-softmax (batch, vocab)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        if self._last is not None:  # the token chosen at the previous step is the last column now
            self._chosen.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        lp = torch.log_softmax(scores.float(), dim=-1)
        top = lp.topk(self.k, dim=-1)
        self._values.append(top.values)
        self._indices.append(top.indices)
        self._last = lp
        return scores

    def rows(self, generated: torch.Tensor) -> tuple[list[list[list[float]]], list[list[list[int]]], list[list[float]]]:
        """``(values, indices, chosen)`` as lists indexed ``[row][step]`` (``generated``: the new tokens, (batch,
        steps)), copied to the host once."""
        import torch

        if self._last is not None and generated.shape[1] == len(self._values):
            self._chosen.append(self._last.gather(1, generated[:, -1:]).squeeze(1))
        self._last = None
        if not self._values:
            return [], [], []
        values = torch.stack(self._values, 1).tolist()
        indices = torch.stack(self._indices, 1).tolist()
        chosen = torch.stack(self._chosen, 1).tolist() if self._chosen else [[] for _ in values]
        return values, indices, chosen


class PieceText:
    """Token id -> its text decoded alone (memoised; a SentencePiece word-start marker ``▁`` kept as a space, as
    vLLM's logprob tokens keep it)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._memo: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._memo.get(token_id)
        if text is None:
            text = self._tok.decode([token_id], skip_special_tokens=False)
            piece = self._tok.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece.startswith("\u2581") and not text.startswith(" "):
                text = " " + text
            self._memo[token_id] = text
        return text


def row_tokens(tokens: list[int], values: list[list[float]], indices: list[list[int]], chosen: list[float],
               piece: PieceText) -> list[TokenLogprobs]:
    """One row's :class:`TokenLogprobs`, one per entry of ``tokens`` (the row's kept output tokens)."""
    return [TokenLogprobs(token=piece(t), logprob=chosen[j] if j < len(chosen) else None,
                          top=top_logprobs((piece(i), v) for i, v in zip(indices[j], values[j])))
            for j, t in enumerate(tokens)]
