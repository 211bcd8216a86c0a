"""ESC-Eval-style evaluation: a seeker simulator plays a role card for N rounds (default 5) with the model under
test, then a scorer rates the supporter on the 7 dimensions, 0-4 each, one call per dimension with its rubric.

A round is one seeker message and the model's reply; the seeker speaks first, after the supporter's fixed greeting
(as ESC-Eval does). A score the scorer did not give as ``Score: <0-4>`` after its retries is recorded as ``null``
with the dimension listed in ``unparsed``; it is never replaced by a number. A simulator that gives no message
ends the dialogue as ``simulator_failed`` (counted, not scored).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from cer.dialogue import Role, Turn
from evaluator.backends import Roles
from evaluator.inputs import Card
from evaluator.metrics import reply_figures
from evaluator.prompts import (
    MODEL_FORMATS,
    SCORE_MAX,
    SCORE_REGEX,
    Dimension,
    Prompts,
    field_line,
    first_message,
    model_format_setting,
    model_reply,
    parse_score,
    seeker_chat,
    transcript,
)
from judge.settings import setting

HARNESS = "esc"
#: a dimension on which the scorer gives one score to at least this share of the dialogues (over at least
#: ``FLAT_MIN_N`` parsed scores) cannot tell runs apart: the reports say so next to its means
FLAT_SHARE, FLAT_MIN_N = 0.9, 5


@dataclass(frozen=True)
class EscConfig:
    """Settings of an ESC-Eval-style run (recorded in the run's manifest)."""

    rounds: int = setting(5, help="seeker/model rounds per dialogue")
    model_format: str = model_format_setting("plain")

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.model_format not in MODEL_FORMATS:
            raise ValueError(f"model_format {self.model_format!r}: expected plain or cer")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dialogue_json(turns: list[Turn], extras: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": t.role.value, "text": t.text, **x} for t, x in zip(turns, extras)]


async def score_dimension(roles: Roles, prompts: Prompts, dim: Dimension, turns: list[Turn], language: str,
                          request_id: str) -> dict[str, Any]:
    """One dimension's score (``score`` None when unparsed) with the scorer's reason and attempts."""
    user = prompts.text("scorer_user", dimension=dim.name, definition=dim.definition, rubric="\n".join(dim.rubric),
                        transcript=transcript(turns, language))
    messages = [{"role": "system", "content": prompts.text("scorer_system")}, {"role": "user", "content": user}]
    done = await roles.scorer.ask(messages, parse_score, request_id, regex=SCORE_REGEX)
    return {"score": done.value, "reason": field_line(done.text, "reason"), "attempts": done.attempts}


async def run_card(card: Card, roles: Roles, prompts: Prompts, cfg: EscConfig) -> dict[str, Any]:
    """Simulate one card's dialogue and score it; the record stored in ``items.jsonl``."""
    lang = card.language
    system = prompts.text("esc_seeker_system", lang, card=card.persona)
    turns: list[Turn] = []
    extras: list[dict[str, Any]] = []
    record: dict[str, Any] = {"id": card.id, "language": lang, "card": card.to_json()}
    for r in range(cfg.rounds):
        said = await roles.simulator.ask(seeker_chat(system, prompts.text("greeting", lang), turns), first_message,
                                         f"esc-{card.id}-r{r}-seeker")
        if not said.ok:
            record.update(status="simulator_failed", rounds_done=r, dialogue=_dialogue_json(turns, extras),
                          scores={}, unparsed=[])
            return record
        turns.append(Turn(Role.SEEKER, str(said.value)))
        extras.append({})
        reply = await model_reply(roles.model, turns, cfg.model_format, lang, f"esc-{card.id}-r{r}-model", prompts)
        turns.append(Turn(Role.SUPPORTER, reply.pop("text")))
        extras.append(reply)
    results = await asyncio.gather(*(
        score_dimension(roles, prompts, d, turns, lang, f"esc-{card.id}-score-{d.name}")
        for d in prompts.dimensions))
    scores = {d.name: res for d, res in zip(prompts.dimensions, results)}
    record.update(status="ok", rounds_done=cfg.rounds, dialogue=_dialogue_json(turns, extras), scores=scores,
                  unparsed=[name for name, s in scores.items() if s["score"] is None])
    return record


def supporter_turns(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's turns of the finished dialogues."""
    return [t for r in records if r.get("status") == "ok" for t in r["dialogue"] if t["role"] == "supporter"]


def cer_figures(turns: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How often the model's CER output was well formed (None for a plain-format run)."""
    marked = [t for t in turns if "format_ok" in t]
    if not marked:
        return None
    return {"format_ok_rate": 100.0 * sum(1 for t in marked if t["format_ok"]) / len(marked),
            "strategy_named_rate": 100.0 * sum(1 for t in marked if t.get("strategy")) / len(marked)}


def summarise(records: list[dict[str, Any]], prompts: Prompts) -> dict[str, Any]:
    """Per-dimension means (over parsed scores), unparsed counts, the average in percent, reply figures."""
    ok = [r for r in records if r.get("status") == "ok"]
    dims: dict[str, Any] = {}
    for d in prompts.dimensions:
        values = [r["scores"][d.name]["score"] for r in ok if r["scores"].get(d.name, {}).get("score") is not None]
        dims[d.name] = {"mean": sum(values) / len(values) if values else None, "n": len(values),
                        "unparsed": sum(1 for r in ok if d.name in r["unparsed"]),
                        "modal_share": Counter(values).most_common(1)[0][1] / len(values) if values else None}
    means = [v["mean"] for v in dims.values()]
    average = 100.0 * sum(means) / (len(means) * SCORE_MAX) if means and None not in means else None
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.get("status", "?")] = statuses.get(r.get("status", "?"), 0) + 1
    turns = supporter_turns(records)
    return {"harness": HARNESS, "dialogues": len(records), "statuses": statuses, "dimensions": dims,
            "average_percent": average, "unparsed_total": sum(v["unparsed"] for v in dims.values()),
            "replies": reply_figures([t["text"] for t in turns]), "cer": cer_figures(turns)}


def flat_dimensions(summary: dict[str, Any]) -> list[str]:
    """Dimensions of a :func:`summarise` output on which the scorer gave one score to at least ``FLAT_SHARE`` of
    at least ``FLAT_MIN_N`` dialogues. A summary written before ``modal_share`` existed is judged by its mean: a
    mean at either end of the 0-``SCORE_MAX`` scale means one score everywhere; any other mean is not flagged."""
    flat = []
    for name, d in summary["dimensions"].items():
        if d.get("mean") is None or d.get("n", 0) < FLAT_MIN_N:
            continue
        share = d.get("modal_share")
        if (share is not None and share >= FLAT_SHARE) or (share is None and d["mean"] in (0, SCORE_MAX)):
            flat.append(name)
    return flat


def flat_note(label: str, summary: dict[str, Any]) -> str | None:
    """One report line naming the dimensions :func:`flat_dimensions` finds for run ``label`` (None when none)."""
    flat = flat_dimensions(summary)
    if not flat:
        return None
    return (f"{label}: the scorer gave one score to at least {100 * FLAT_SHARE:.0f}% of the dialogues on "
            f"{', '.join(flat)}; on these its means do not tell runs apart")
