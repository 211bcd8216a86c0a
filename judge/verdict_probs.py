"""The judge's probability of each verdict label, read from the top-k logprobs of the token where the label begins.

A round's output ends with ``Verdict: <label>`` lines (:mod:`cer.verdicts`). For each of the last k verdict lines (the
lines :func:`cer.verdicts.parse_verdicts` reads) :func:`label_distributions` finds the output token that covers the
first character of the label, takes that position's alternatives (:attr:`judge.engines.base.TokenLogprobs.top`),
drops from each alternative the part of the chosen token before the label (e.g. the leading space of ``" True"``:
an alternative that does not start with that part is another continuation and is ignored), and credits the rest to
the label it is a prefix of, case-insensitively (``"T"``, ``"true"`` and ``"True"`` all count for ``True``; a rest
that is the whole label followed by a non-word character, such as ``"True."``, counts too). An alternative that fits
several labels or none is ignored. The credited probabilities are summed per label and renormalised over the labels.
This is GenRM's P(Yes) and G-Eval's probability weighting, for multi-token labels and any tokenizer.

Token texts are each token decoded alone, so they need not concatenate to the text (a character split over several
byte-level tokens decodes as U+FFFD pieces; an end-of-sequence token may follow). Tokens are placed in the text by
matching their texts from the start and, independently, from the end (the verdict lines end a round); a token that
neither chain reaches has no place, and a label whose token has none gets no distribution (None), as does a label
none of whose alternatives fits any label. Nothing is filled in. An answer decoded after a prefix
(``GenParams.prefix``) has no tokens for it: ``start`` says where its tokens begin in the text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cer.verdicts import Kind, labels, verdict_label_starts
from judge.engines.base import TokenLogprobs

#: A label's probabilities: label (as :func:`cer.verdicts.labels` spells it) -> probability, summing to 1.
LabelDistribution = dict[str, float]
_REPLACEMENT = "\ufffd"
#: Tokens the end of the token list may hold beyond the text (an end-of-sequence token, a stop string's tokens).
_TRAILING = 2


def _forward(text: str, pieces: Sequence[str]) -> list[int | None]:
    """Offsets of the pieces matched from the start of ``text``; a run of pieces holding U+FFFD (a character split
    over tokens) is skipped and matching resumes where the piece after it is found; the first mismatch ends it."""
    out: list[int | None] = [None] * len(pieces)
    pos, lost = 0, False
    for j, piece in enumerate(pieces):
        if _REPLACEMENT in piece and not text.startswith(piece, pos):
            lost = True
            continue
        if lost and piece:
            q = text.find(piece, pos)
            if q < 0:
                break
            pos, lost = q, False
        if not text.startswith(piece, pos):
            break
        out[j] = pos
        pos += len(piece)
    return out


def _backward(text: str, pieces: Sequence[str]) -> list[int | None]:
    """Offsets of the pieces matched from the end of ``text`` (up to :data:`_TRAILING` pieces after the text's end,
    such as an end-of-sequence token, are passed over); the first mismatch ends it."""
    out: list[int | None] = [None] * len(pieces)
    end, started = len(text), False
    for j in range(len(pieces) - 1, -1, -1):
        piece = pieces[j]
        if piece and text.endswith(piece, 0, end):
            end -= len(piece)
            out[j], started = end, True
        elif not piece and started:
            out[j] = end
        elif started or len(pieces) - j > _TRAILING:
            break
    return out


def token_offsets(text: str, pieces: Sequence[str]) -> list[int | None]:
    """Where each token text begins in ``text`` (None where it cannot be placed); see the module docstring."""
    fwd, bwd = _forward(text, pieces), _backward(text, pieces)
    return [f if f is not None else b for f, b in zip(fwd, bwd)]


def _credited(rest: str, names: Sequence[str]) -> str | None:
    """The one label ``rest`` (an alternative's text from the label start on) stands for, else None."""
    r = rest.lower()
    if not r:
        return None
    fits = [n for n in names
            if n.lower().startswith(r) or (r.startswith(n.lower()) and not (r[len(n):][:1].isalnum()
                                                                             or r[len(n):][:1] == "_"))]
    return fits[0] if len(fits) == 1 else None


def label_distribution(kind: Kind, head: str, top: Mapping[str, float]) -> LabelDistribution | None:
    """The label probabilities at one position: ``top`` the alternatives (text -> logprob), ``head`` the part of the
    chosen token before the label starts. None when no alternative fits a label."""
    names = labels(kind)
    mass = dict.fromkeys(names, 0.0)
    for alt, lp in top.items():
        if not alt.startswith(head) or not math.isfinite(lp):
            continue
        label = _credited(alt[len(head):], names)
        if label is not None:
            mass[label] += math.exp(lp)
    total = sum(mass.values())
    if total <= 0.0:
        return None
    return {n: m / total for n, m in mass.items()}


def label_distributions(text: str, tokens: Sequence[TokenLogprobs] | None,
                        kinds: Sequence[Kind], start: int = 0) -> list[LabelDistribution | None]:
    """For each verdict line of a round (``kinds``: one per component, the last ``len(kinds)`` lines), the probability
    of each of its kind's labels; None where the line, its token or any label-fitting alternative is missing, and
    everywhere when ``tokens`` is None (the engine returned no logprobs). ``start``: the offset of ``text`` where the
    tokens begin (the length of an answer prefix the engine was given, which has no tokens)."""
    if tokens is None:
        return [None] * len(kinds)
    pieces = [t.token for t in tokens]
    offsets = [None if off is None else off + start for off in token_offsets(text[start:], pieces)]
    out: list[LabelDistribution | None] = []
    for kind, label_at in zip(kinds, verdict_label_starts(text, len(kinds))):
        j = None if label_at is None else next(
            (j for j, off in enumerate(offsets) if off is not None and off <= label_at < off + len(pieces[j])), None)
        if label_at is None or j is None:
            out.append(None)
            continue
        at = offsets[j]
        assert at is not None
        out.append(label_distribution(kind, text[at:label_at], tokens[j].top))
    return out


__all__ = ["LabelDistribution", "label_distribution", "label_distributions", "token_offsets"]
