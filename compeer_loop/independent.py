"""The independent scorer (issue 26, item 4): a model that is not any arm's training judge rates each evaluation
reply's support quality zero-shot, 1-5, and plays simulator + scorer of the ESC-Eval-style step.

:func:`scorer_spec` resolves the plan's ``independent_scorer`` (``judge-base``: the bare base of the device's default
judge, no adapter; the plan refuses a training judge's adapter, :class:`compeer_loop.plan.LoopSettings`).
:func:`parse_rating` is strict: the answer must be one ``Rating: N`` line with N in 1-5 (anything else, e.g. two
ratings or a 7, does not parse), and :func:`rate_replies` records a reply whose rating did not parse after the
retries as ``failed``, never with a made-up score.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from compeer_loop.plan import JUDGE_BASE, NO_SCORER, LoopSettings
from evaluator.backends import ChatRole, EngineError, ModelSpec

RATING_MIN, RATING_MAX = 1, 5
_RATING = re.compile(r"^\s*rating\s*:\s*(\d+)\s*$", re.IGNORECASE | re.MULTILINE)
SYSTEM = ("You rate replies in emotional-support conversations. You are strict and use the whole scale. Answer with "
          "exactly one line: `Rating: N`, N from 1 to 5.")
RUBRIC = ("1 = harmful, empty, off-topic or not a reply to the seeker (a label, a fragment, a template that ignores "
          "what was said); 2 = generic sympathy with nothing of this conversation; 3 = on topic but thin; "
          "4 = attentive and helpful; 5 = as good as a skilled human supporter.")


def parse_rating(text: str) -> int | None:
    """N of the answer's one ``Rating: N`` line, when N is in 1-5; None for no such line, several, or N outside."""
    hits = _RATING.findall(text)
    if len(hits) != 1:
        return None
    value = int(hits[0])
    return value if RATING_MIN <= value <= RATING_MAX else None


def conversation_text(history: Sequence[dict[str, Any]]) -> str:
    """The conversation as ``Seeker: ...`` / ``Supporter: ...`` lines, as the scorer's prompts show it."""
    return "\n".join(f"{t['role'].capitalize()}: {t['text']}" for t in history)


def rating_messages(history: Sequence[dict[str, Any]], reply: str) -> list[dict[str, str]]:
    """The zero-shot rating prompt of one reply in its conversation."""
    user = (f"Conversation so far:\n{conversation_text(history)}\n\nThe supporter's next reply:\n{reply}\n\nRate how well this reply "
            f"supports the seeker. {RUBRIC}\nAnswer `Rating: N`.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


async def rate_replies(records: Sequence[dict[str, Any]], scorer: ChatRole,
                       concurrency: int = 16) -> dict[str, dict[str, Any]]:
    """Per answered record id: ``independent_rating`` (None when failed), ``independent_status`` (``ok`` |
    ``failed`` | ``engine_error``) and the scorer's identity."""
    gate = asyncio.Semaphore(concurrency)

    async def one(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        async with gate:
            try:
                done = await scorer.ask(rating_messages(r.get("history") or [], str(r.get("text", ""))),
                                        parse_rating, f"rate-{r['id']}")
            except EngineError as exc:  # an engine failure: recorded, the rating stays absent
                return r["id"], {"independent_rating": None, "independent_status": "engine_error",
                                 "independent_error": str(exc)[:200], "independent_scorer": scorer.identity}
        status = "ok" if done.value is not None else "failed"
        return r["id"], {"independent_rating": done.value, "independent_status": status,
                         "independent_scorer": scorer.identity}

    pairs = await asyncio.gather(*(one(r) for r in records if r.get("status") == "ok"))
    return dict(pairs)


def scorer_spec(s: LoopSettings, max_tokens: int = 16) -> ModelSpec | None:
    """The independent scorer's :class:`ModelSpec` (greedy), None when ``independent_scorer`` is ``none``.
    ``judge-base`` prepares the device's default judge base as a plain HF folder (once) and serves it bare."""
    if s.independent_scorer == NO_SCORER:
        return None
    model = s.independent_scorer
    if model == JUDGE_BASE:
        from judge.device import dtype_name, resolve_device_dtype
        from judge.model_store import BASES, DEFAULT_MODEL, judge_base_name, prepare_base

        base = BASES[str(judge_base_name(DEFAULT_MODEL, s.device))]
        model = prepare_base(base, dtype_name(resolve_device_dtype(s.device, "auto")[1])).path
    return ModelSpec(model=str(model), adapter=s.independent_scorer_adapter, device=s.device, max_tokens=max_tokens,
                     temperature=0.0)
