"""From a judgment to the reported result, and to and from its cache record.

:func:`assemble` applies the reward rules of :mod:`cer.rewards` (discrete and graded, through
:func:`judge.conversation.judgment_rewards`) to one judged candidate; :func:`invalid_result` is the result of a
candidate rejected before judging. A cache record (:func:`judgment_to_record`) holds what the judge said, in format
:data:`RECORD_FORMAT`; a record of another format (one written before graded rewards existed has none) is not
read (:func:`judgment_from_record` returns None: a miss, so the candidate is judged again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cer import rewards
from cer.modes import JudgeMode
from cer.reasoning import ParsedOutput
from cer.verdicts import Kind, Preference, Verdict, parse_label
from judge.conversation import CandidateJudgment, judgment_rewards
from judge.protocol import PREFERENCE, REPLY, STEP_COMPONENTS, component_kind
from judge.verdict_probs import LabelDistribution
from reward_server.types import (
    CandidateResult,
    ErrorInfo,
    FormatResult,
    PreferenceResult,
    Rewards,
    Status,
    StepResult,
)

#: The format of a cache record; 2 added the label probabilities (``probs``). Records of another format are misses.
RECORD_FORMAT = 2


@dataclass
class Outcome:
    """How judging one distinct candidate ended."""

    judgment: CandidateJudgment | None
    status: Status
    cache_hit: bool = False
    error: ErrorInfo | None = None


def _verdict_to_json(v: Verdict | None) -> Any:
    return v.value if isinstance(v, Preference) else v


def judgment_to_record(j: CandidateJudgment) -> dict[str, Any]:
    """The cache record of a judgment (JSON-able)."""
    return {"format": RECORD_FORMAT, "verdicts": {c: _verdict_to_json(v) for c, v in j.verdicts.items()},
            "judged": sorted(j.judged), "texts": j.texts, "generations": j.generations, "probs": dict(j.probs)}


def _distribution(kind: Kind, raw: Any) -> LabelDistribution | None:
    if not isinstance(raw, dict):
        return None
    out = {str(label): float(p) for label, p in raw.items()}
    return out if all(parse_label(kind, label) is not None for label in out) else None


def judgment_from_record(rec: dict[str, Any]) -> CandidateJudgment | None:
    """The judgment a cache record holds; None for a record of another format (see the module docstring)."""
    if rec.get("format") != RECORD_FORMAT:
        return None
    verdicts: dict[str, Verdict | None] = {}
    for c, raw in rec["verdicts"].items():
        verdicts[c] = None if raw is None else parse_label(component_kind(c), str(raw))
    probs = {c: _distribution(component_kind(c), raw) for c, raw in rec["probs"].items()}
    return CandidateJudgment(verdicts=verdicts, judged=set(rec["judged"]), texts=list(rec["texts"]), generations=0,
                             probs=probs)


def _rewards(r: rewards.CandidateRewards, total: float | None) -> Rewards:
    return Rewards(steps=r.steps, preference=r.preference, format=r.format, total=total, reply=r.reply)


def assemble(parsed: ParsedOutput, mode: JudgeMode, outcome: Outcome, fmt: ParsedOutput | None = None,
             graded: bool = False) -> CandidateResult:
    """Turn a judgment into the reported result, applying the reward rules of :mod:`cer.rewards`.

    Parts missing from the candidate were not judged: they count as failed (-1) with ``judged = False``. ``fmt``:
    the candidate's own parse for the format check when ``parsed`` is what the judge saw of it (mode ``reply``).
    ``graded``: the server serves graded rewards (the result then carries them and the label probabilities).
    """
    j = outcome.judgment or CandidateJudgment()
    reply: StepResult | None = None
    if mode.judges_reply:
        rv = j.verdicts.get(REPLY)
        rb = rv if isinstance(rv, bool) else None
        reply = StepResult(verdict=None, valid=True, judged=False) if parsed.response is None \
            else StepResult(verdict=rb, valid=rb is not None, judged=REPLY in j.judged, p_true=j.p_true(REPLY))
    steps: list[StepResult] = []
    if mode.judges_steps:
        for i, c in enumerate(STEP_COMPONENTS):
            v = j.verdicts.get(c)
            b = v if isinstance(v, bool) else None
            steps.append(StepResult(verdict=None, valid=True, judged=False) if parsed.step(i) is None
                         else StepResult(verdict=b, valid=b is not None, judged=c in j.judged, p_true=j.p_true(c)))
    preference: PreferenceResult | None = None
    p = j.verdicts.get(PREFERENCE)
    p = p if isinstance(p, Preference) else None
    if mode.judges_preference:
        preference = PreferenceResult(verdict=None, valid=True, judged=False) if parsed.response is None \
            else PreferenceResult(verdict=p, valid=p is not None, judged=PREFERENCE in j.judged,
                                  probs=j.probs.get(PREFERENCE))
    discrete, graded_r = judgment_rewards(j, parsed, mode)
    total = discrete.total
    status = outcome.status
    if status is Status.OK and total is None:
        status = Status.PARSE_FAILED
    ok = status is Status.OK
    f = fmt or parsed
    return CandidateResult(status=status, steps=steps, preference=preference,
                           format=FormatResult(ok=f.ok, missing=list(f.missing)),
                           rewards=_rewards(discrete, total if ok else None),
                           graded_rewards=_rewards(graded_r, graded_r.total if ok else None) if graded else None,
                           judgment=list(j.texts), cache_hit=outcome.cache_hit, error=outcome.error, reply=reply)


def invalid_result(mode: JudgeMode, err: ErrorInfo) -> CandidateResult:
    """The ``invalid_input`` result of a candidate that was rejected before judging (``err`` says why); it has no
    graded rewards (nothing was judged)."""
    return CandidateResult(
        status=Status.INVALID_INPUT,
        steps=[StepResult() for _ in STEP_COMPONENTS] if mode.judges_steps else [],
        preference=PreferenceResult() if mode.judges_preference else None,
        format=FormatResult(ok=False, missing=[]),
        rewards=Rewards(steps=[None] * (3 if mode.judges_steps else 0), preference=None,
                        format=None if mode.judges_reply else rewards.FORMAT_BAD, total=None),
        error=err, reply=StepResult() if mode.judges_reply else None)


__all__ = ["RECORD_FORMAT", "Outcome", "assemble", "invalid_result", "judgment_from_record", "judgment_to_record"]
