"""What a policy's replies are, beside how they score (issue 26, item 4): degenerate and repeated replies,
distinct-n on the first tokens, and a constant generic reply as a control.

- :func:`mark_reply` (from :mod:`data_builder.policy_negatives`): the dataset pipeline's rule (its ``Labeller``, the one
  definition of a degenerate or generic reply: empty, a support-stage label or the judge's own template wording such
  as "I would place this in the comforting stage.", a repeated sentence, a cut reply, a known generic template, a
  short reply with no word of its conversation). Replies repeated across prompts are not marked here: the report
  gives the most frequent reply's share on its own (:func:`top_reply_share`).
- :func:`first_tokens`: the first ``n`` tokens of a reply (the evaluator's tokeniser), so distinct-n can be read
  apart from reply length.
- :data:`CONSTANT_REPLY`: the generic reply whose ROUGE-L and BLEU-2 the report shows as a control row.
- :func:`asks_question` (from :mod:`data_builder.cues`, which measures the same cue in judge training items): whether
  a reply asks the seeker something (a question mark in it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from data_builder.cues import asks_question
from data_builder.policy_negatives import DEGENERATE_KINDS, is_degenerate, mark_reply
from evaluator.metrics import tokenize

#: the constant control reply (a one-size-fits-all empathy template)
CONSTANT_REPLY = "I understand how you feel. That sounds really hard, and I am here for you."


def top_reply_share(texts: Sequence[str]) -> tuple[float | None, str | None]:
    """The share (times 100) of the most frequent reply (exact duplicates after stripping) and that reply."""
    if not texts:
        return None, None
    reply, n = Counter(t.strip() for t in texts).most_common(1)[0]
    return 100.0 * n / len(texts), reply


def first_tokens(text: str, n: int) -> str:
    """The reply's first ``n`` tokens, space-joined (the evaluator's tokens: lower case, words and punctuation)."""
    return " ".join(tokenize(text)[:n])


def mark_counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many answered records carry each mark (``reply_mark``; unmarked replies as ``none``)."""
    return dict(Counter(str(r.get("reply_mark") or "none") for r in records if r.get("status") == "ok"))


# the rule itself lives with the dataset pipeline's labeller; the report reads it from here
__all__ = ["CONSTANT_REPLY", "DEGENERATE_KINDS", "asks_question", "first_tokens", "is_degenerate", "mark_counts", "mark_reply",
           "top_reply_share"]
