"""A generation batch as the reward function sees it: completion texts, rollout groups, the degenerate-reply mark of
each completion, and the batch's identity (what a prefetched reward call is looked up by)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from cer.reasoning import reply_text
from data_builder.policy_negatives import mark_reply


class GroupingError(ValueError):
    """The batch is not made of whole rollout groups of one prompt each."""


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or TRL's conversational form ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        parts: list[str] = []
        for message in completion:
            content = message.get("content", "") if isinstance(message, dict) else message
            if isinstance(content, list):  # content blocks
                parts.extend(str(b.get("text", "")) for b in content if isinstance(b, dict))
            else:
                parts.append(str(content))
        return "".join(parts)
    raise TypeError(f"completion of unexpected type {type(completion).__name__}")


def split_groups(n_items: int, num_generations: int, histories: Sequence[Any],
                 references: Sequence[Any]) -> list[range]:
    """Index ranges of the rollout groups; raises :class:`GroupingError` when a range mixes prompts."""
    if n_items % num_generations != 0:
        raise GroupingError(f"the reward function got {n_items} completions, not a multiple of num_generations="
                            f"{num_generations}: each process must hold whole rollout groups (see config)")
    groups = [range(s, s + num_generations) for s in range(0, n_items, num_generations)]
    for g in groups:
        first = g[0]
        for i in g[1:]:
            if histories[i] != histories[first] or references[i] != references[first]:
                raise GroupingError(f"completions {first}..{g[-1]} should share one prompt (TRL groups "
                                    f"num_generations={num_generations} consecutive completions) but differ at {i}: "
                                    "the generation batch was split across processes or reordered")
    return groups


def mark_completion(raw: str, history: list[dict[str, Any]]) -> str | None:
    """The degenerate-reply rule's mark of one completion in its conversation (``{role, text}`` turns; ``kind/rule``,
    None when unmarked): its reply part, or its tag-stripped text when that part is missing
    (:func:`cer.reasoning.reply_text`)."""
    reply, parsed = reply_text(raw)
    return mark_reply(reply, history, raw, parsed.ok)


def batch_key(prompts: Sequence[Any], completions: Sequence[Any]) -> str:
    """Identity of a batch of rollouts: a digest of its prompts and completions (what a prefetch is looked up by)."""
    blob = json.dumps([list(prompts), [completion_text(c) for c in completions]], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


__all__ = ["GroupingError", "batch_key", "completion_text", "mark_completion", "split_groups"]
