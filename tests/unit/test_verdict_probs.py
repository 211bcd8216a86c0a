"""The verdict-label distribution (:mod:`judge.verdict_probs`) on the token texts of real tokenizers: SmolLM2 (the
default judge; byte-level BPE, ``" True"`` one token, ``" both" "_" "good"``) and Qwen2.5 (``" both" "_good"``), with
a character split over several tokens in the rationale and an end-of-sequence token after the text."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cer.verdicts import Kind
from judge.engines.base import TokenLogprobs
from judge.verdict_probs import label_distribution, label_distributions, token_offsets

SMOLLM2 = Path.home() / ".cache/compeer/models/smollm2-135m-instruct-float32"
QWEN = Path("/tmp/qparts/hf-bf16")  # a Qwen2.5 HF folder (the qwen2.5-coder-1.5b judge base, converted)
TEXT = ("Rationale: the analysis names the core issue \u2615 well.\nVerdict: True\n"
        "Rationale: the reply is warmer than the reference.\nVerdict: both_good")


def _tokenizer(path: Path) -> Any:
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"no tokenizer at {path}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _tokens(tok: Any, text: str, alternatives: dict[int, dict[str, float]]) -> list[TokenLogprobs]:
    """The text's tokens as an engine returns them (each decoded alone), with ``alternatives`` (probabilities) at the
    given token indices, and an end-of-sequence token after the text."""
    ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    out = []
    for j, i in enumerate(ids):
        piece = tok.decode([i])
        top = {k: math.log(p) for k, p in alternatives.get(j, {piece: 1.0}).items()}
        out.append(TokenLogprobs(token=piece, top=top, logprob=top.get(piece)))
    return out


def _label_token(tok: Any, text: str, label: str, occurrence: int = -1) -> int:
    """The index of the token that begins ``label`` on the verdict line."""
    at = [i for i in range(len(text)) if text.startswith(f"Verdict: {label}", i)][occurrence] + len("Verdict: ")
    pieces = [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]
    offsets = token_offsets(text, pieces)
    return next(j for j, off in enumerate(offsets) if off is not None and off <= at < off + len(pieces[j]))


@pytest.mark.parametrize("path", [SMOLLM2, QWEN], ids=["smollm2", "qwen2.5"])
def test_distributions_of_both_kinds_on_a_real_tokenizer(path: Path) -> None:
    tok = _tokenizer(path)
    step = {" True": 0.5, " T": 0.1, " true": 0.05, " False": 0.15, " The": 0.1, "True": 0.1}  # "True": no space
    pref = {" both": 0.3, " second": 0.2, " s": 0.05, " first": 0.1, " neither": 0.1, " The": 0.2, " ": 0.05}
    alternatives = {_label_token(tok, TEXT, "True"): step, _label_token(tok, TEXT, "both_good"): pref}
    tokens = _tokens(tok, TEXT, alternatives)
    assert None not in token_offsets(TEXT, [t.token for t in tokens])[-6:-1]  # the verdict lines are placed
    p_step, p_pref = label_distributions(TEXT, tokens, [Kind.STEP, Kind.PREFERENCE])
    assert p_step is not None and p_pref is not None
    assert p_step == pytest.approx({"True": 0.65 / 0.8, "False": 0.15 / 0.8})  # " The", "True" (no space): not labels
    assert p_pref == pytest.approx({"first": 0.1 / 0.75, "second": 0.25 / 0.75, "both_good": 0.3 / 0.75,
                                    "neither": 0.1 / 0.75})  # " ": fits every label, ignored
    # only the last verdict line of a one-component round is read; a round without one has no distribution
    assert label_distributions(TEXT, tokens, [Kind.PREFERENCE])[0] == pytest.approx(p_pref)
    assert label_distributions("Rationale: none", tokens, [Kind.STEP]) == [None]


def test_label_matching_rules() -> None:
    lp = math.log
    # case-insensitive prefixes; a rest that runs past the label counts only at a word boundary
    assert label_distribution(Kind.STEP, " ", {" tr": lp(0.2), " True.": lp(0.2), " Truely": lp(0.3),
                                               " F": lp(0.1)}) == pytest.approx({"True": 0.8, "False": 0.2})
    # an alternative that does not continue the chosen token's part before the label is another continuation
    assert label_distribution(Kind.STEP, " ", {"True": lp(0.9), " False": lp(0.1)}) == {"True": 0.0, "False": 1.0}
    assert label_distribution(Kind.PREFERENCE, "", {"both_good": lp(0.5), "b": lp(0.5)}) == {
        "first": 0.0, "second": 0.0, "both_good": 1.0, "neither": 0.0}
    assert label_distribution(Kind.STEP, " ", {" The": lp(0.9), " ": lp(0.1)}) is None  # nothing fits a label


def test_missing_or_unplaceable_tokens_give_no_distribution() -> None:
    text = "Rationale: ok\nVerdict: True"
    assert label_distributions(text, None, [Kind.STEP]) == [None]
    wrong = [TokenLogprobs("Something", {"Something": 0.0}), TokenLogprobs(" else", {" True": 0.0})]
    assert label_distributions(text, wrong, [Kind.STEP]) == [None]
    # fewer verdict lines than components: the earliest components have none
    ok = [TokenLogprobs("Rationale: ok\nVerdict:", {}), TokenLogprobs(" True", {" True": math.log(0.75),
                                                                                  " False": math.log(0.25)})]
    assert label_distributions(text, ok, [Kind.STEP, Kind.STEP]) == [None, {"True": 0.75, "False": 0.25}]
