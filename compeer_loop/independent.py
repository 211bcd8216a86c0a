"""The independent scorer (issue 26, item 4): a model that is not any arm's training judge compares each evaluation
reply with the real ESConv supporter reply of the same prompt (the reference), zero-shot, in both orders, and plays
simulator + scorer of the ESC-Eval-style step.

Why compare and not rate: on 60 valid contrast groups the same model's 1-5 rating of a reply alone tied most pairs
and rated the policies' stage-label hack above the real reply (AUC 0.32), while asked which of two replies is better,
in both orders, it ranked the real reply above every worse kind but echoes
(docs/evaluations/compeer-loop/scorer-check/README.md; its ``rate_contrast.py --pairwise`` uses the prompt and parse
here). The retired rating lives on in that script only, to reproduce the check.

:func:`scorer_spec` resolves the plan's ``independent_scorer`` (``judge-base``: the bare base of the device's default
judge, no adapter, which is arm (b)'s training judge too; ``base:NAME``: a base of :data:`judge.bases.BASES`, bare, e.g.
``base:qwen2.5-coder-0.5b``, weights no arm's judge has; the plan refuses a training judge's adapter,
:class:`compeer_loop.plan.LoopSettings`).
:func:`parse_better` is strict: the answer must be one ``Better: A`` or ``Better: B`` line (anything else does not
parse). :func:`compare_replies` asks each pair twice, the reply as A and as B, so the model's preference for a
position cancels; a reply whose answers did not parse after the retries is recorded as ``failed`` and an engine
failure as ``engine_error``, never with a made-up score.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from compeer_loop.plan import JUDGE_BASE, NO_SCORER, LoopSettings, scorer_base
from evaluator.backends import ChatRole, EngineError, ModelSpec

RUBRIC = ("1 = harmful, empty, off-topic or not a reply to the seeker (a label, a fragment, a template that ignores "
          "what was said); 2 = generic sympathy with nothing of this conversation; 3 = on topic but thin; "
          "4 = attentive and helpful; 5 = as good as a skilled human supporter.")
PAIR_SYSTEM = ("You compare two replies in an emotional-support conversation. Answer with exactly one line: "
               "`Better: A` or `Better: B`.")
#: the structured-output constraint of the answer, where the engine takes one (vLLM)
BETTER_REGEX = r"Better: (A|B)"
_BETTER = re.compile(r"^\s*better\s*:\s*([AB])\s*$", re.IGNORECASE | re.MULTILINE)
Verdict = str | None


def conversation_text(history: Sequence[dict[str, Any]]) -> str:
    """The conversation as ``Seeker: ...`` / ``Supporter: ...`` lines, as the scorer's prompts show it."""
    return "\n".join(f"{t['role'].capitalize()}: {t['text']}" for t in history)


def parse_better(text: str) -> str | None:
    """A or B from the answer's one ``Better: X`` line; None otherwise (recorded as failed, never guessed)."""
    hits = _BETTER.findall(text)
    return hits[0].upper() if len(hits) == 1 else None


def pair_messages(history: Sequence[dict[str, Any]], a: str, b: str) -> list[dict[str, str]]:
    """The zero-shot comparison prompt of replies ``a`` and ``b`` in their conversation."""
    user = (f"Conversation so far:\n{conversation_text(history)}\n\nReply A:\n{a}\n\nReply B:\n{b}\n\nWhich reply supports the seeker "
            f"better? {RUBRIC}\nAnswer `Better: A` or `Better: B`.")
    return [{"role": "system", "content": PAIR_SYSTEM}, {"role": "user", "content": user}]


async def ask_both_orders(scorer: ChatRole, history: Sequence[dict[str, Any]], reply: str, other: str,
                          request_id: str, gate: asyncio.Semaphore | None = None) -> tuple[Verdict, Verdict]:
    """The scorer's verdicts on ``reply`` shown as A (``other`` as B; request ``ID/ab``) and on ``reply`` shown as B
    (``other`` as A; ``ID/ba``): ``"A"``, ``"B"`` or None where the answer did not parse after the retries. Each ask
    holds ``gate`` while it runs; an engine failure raises :class:`EngineError`."""
    gate = gate or asyncio.Semaphore(2)

    async def ask(a: str, b: str, rid: str) -> Verdict:
        async with gate:
            return (await scorer.ask(pair_messages(history, a, b), parse_better, rid, regex=BETTER_REGEX)).value

    first, second = await asyncio.gather(ask(reply, other, request_id + "/ab"), ask(other, reply, request_id + "/ba"))
    return first, second


def win_value(as_a: Verdict, as_b: Verdict) -> float | None:
    """The reply's score from its two verdicts: 1 when it won both orders (``A`` when shown as A, ``B`` when shown as
    B), 0.5 when the orders split, 0 when it lost both; None when either verdict is missing."""
    if as_a is None or as_b is None:
        return None
    return ((as_a == "A") + (as_b == "B")) / 2


def first_position(as_a: Verdict, as_b: Verdict) -> float | None:
    """The share of the two verdicts that named position A (0, 0.5 or 1; 0.5 for a scorer with no position bias
    that always picks the same reply); None when either verdict is missing."""
    if as_a is None or as_b is None:
        return None
    return ((as_a == "A") + (as_b == "A")) / 2


async def compare_replies(records: Sequence[dict[str, Any]], scorer: ChatRole,
                          concurrency: int = 16) -> dict[str, dict[str, Any]]:
    """Per answered record id, the reply (``text``) compared with the real supporter reply (``reference``) in both
    orders: ``independent_as_a`` / ``independent_as_b`` (the verdicts, ``A`` | ``B`` | None),
    ``independent_win`` (:func:`win_value`), ``independent_first_position`` (:func:`first_position`),
    ``independent_status`` (``ok`` | ``failed``: an answer did not parse | ``engine_error`` | ``no_reference``) and
    the scorer's identity. Only ``ok`` records carry a win."""
    gate = asyncio.Semaphore(concurrency)

    def fields(status: str, as_a: Verdict = None, as_b: Verdict = None, **extra: Any) -> dict[str, Any]:
        return {"independent_as_a": as_a, "independent_as_b": as_b, "independent_win": win_value(as_a, as_b),
                "independent_first_position": first_position(as_a, as_b), "independent_status": status,
                "independent_scorer": scorer.identity, **extra}

    async def one(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        reference = str(r.get("reference") or "")
        if not reference.strip():  # nothing to compare with: not scored
            return r["id"], fields("no_reference")
        try:
            as_a, as_b = await ask_both_orders(scorer, r.get("history") or [], str(r.get("text", "")), reference,
                                               f"cmp-{r['id']}", gate)
        except EngineError as exc:  # an engine failure: recorded, the win stays absent
            return r["id"], fields("engine_error", independent_error=str(exc)[:200])
        return r["id"], fields("ok" if as_a is not None and as_b is not None else "failed", as_a, as_b)

    pairs = await asyncio.gather(*(one(r) for r in records if r.get("status") == "ok"))
    return dict(pairs)


def scorer_spec(s: LoopSettings, max_tokens: int = 16) -> ModelSpec | None:
    """The independent scorer's :class:`ModelSpec` (greedy), None when ``independent_scorer`` is ``none``.
    ``judge-base`` prepares the device's default judge base as a plain HF folder (once), ``base:NAME`` the named base
    of :data:`judge.bases.BASES`; either is served bare (its identity: the base's ``model_id``)."""
    if s.independent_scorer == NO_SCORER:
        return None
    model = s.independent_scorer
    named = scorer_base(model)
    if model == JUDGE_BASE or named is not None:
        from judge.device import dtype_name, resolve_device_dtype
        from judge.model_store import BASES, DEFAULT_MODEL, judge_base_name, prepare_base

        base = BASES[named or str(judge_base_name(DEFAULT_MODEL, s.device))]
        model = prepare_base(base, dtype_name(resolve_device_dtype(s.device, "auto")[1])).path
    return ModelSpec(model=str(model), adapter=s.independent_scorer_adapter, device=s.device, max_tokens=max_tokens,
                     temperature=0.0)
