"""SAGE-style evaluation: a seeker with a persona, a scene, a hidden intention and an emotion score.

The seeker opens; each round the model under test replies, the seeker's analysis step reads the reply against its
hidden intention and outputs a change of its emotion score (``Change: N``, clamped to +-``max_change``; the score
starts at ``start`` and stays within 0-100), then the seeker answers in character. The dialogue ends as ``success``
when the score reaches ``success_at`` (100), ``failure`` when it falls below ``failure_below`` (10), else
``max_rounds`` after ``max_rounds`` replies. An analysis step whose change cannot be read after its retries ends the
dialogue as ``unparsed``: no change is made up, and the dialogue is counted apart from the scored ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cer.dialogue import Role, Turn
from evaluator.backends import Roles
from evaluator.inputs import Profile
from evaluator.metrics import reply_figures
from evaluator.prompts import (
    CHANGE_REGEX,
    MODEL_FORMATS,
    Prompts,
    field_line,
    first_message,
    model_format_setting,
    model_reply,
    parse_change,
    seeker_chat,
    transcript,
)
from judge.settings import setting

HARNESS = "sage"
FINAL = ("success", "failure", "max_rounds")


@dataclass(frozen=True)
class SageConfig:
    """Settings of a SAGE-style run (recorded in the run's manifest)."""

    max_rounds: int = setting(10, help="model replies per dialogue at most")
    start: int = setting(40, help="the seeker's starting emotion score")
    max_change: int = setting(10, help="the seeker's change of emotion score per round is clamped to +-N")
    success_at: int = setting(100, help="emotion score at which a dialogue succeeds")
    failure_below: int = setting(10, help="emotion score below which a dialogue fails")
    model_format: str = model_format_setting("plain")

    def __post_init__(self) -> None:
        if self.max_rounds < 1 or self.max_change < 1:
            raise ValueError("max_rounds and max_change must be >= 1")
        if not 0 <= self.failure_below <= self.start < self.success_at <= 100:
            raise ValueError("expected 0 <= failure_below <= start < success_at <= 100")
        if self.model_format not in MODEL_FORMATS:
            raise ValueError(f"model_format {self.model_format!r}: expected plain or cer")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fill(profile: Profile) -> dict[str, str]:
    return {"player": profile.player, "scene": profile.scene, "main_cha": profile.main_cha or "-",
            "traits": ", ".join(profile.cha_group) or "-", "task": profile.task}


def next_score(score: int, change: int, cfg: SageConfig) -> int:
    """The new emotion score: the change clamped to +-max_change, the score kept within 0-100."""
    step = max(-cfg.max_change, min(cfg.max_change, change))
    return max(0, min(100, score + step))


def outcome(score: int, cfg: SageConfig) -> str | None:
    """``success`` / ``failure`` when the score ends the dialogue, else None."""
    if score >= cfg.success_at:
        return "success"
    if score < cfg.failure_below:
        return "failure"
    return None


async def run_profile(profile: Profile, roles: Roles, prompts: Prompts, cfg: SageConfig) -> dict[str, Any]:
    """Simulate one profile's dialogue; the record stored in ``items.jsonl``."""
    lang, fill = profile.language, _fill(profile)
    record: dict[str, Any] = {"id": profile.id, "language": lang, "profile": profile.to_json()}
    score, trajectory = cfg.start, [cfg.start]
    analyses: list[dict[str, Any]] = []
    turns: list[Turn] = []
    extras: list[dict[str, Any]] = []

    def seeker(feeling: str) -> list[dict[str, str]]:
        system = prompts.text("sage_seeker_system", lang, emotion=score, feeling=feeling, **fill)
        return seeker_chat(system, prompts.text("greeting", lang), turns)

    opening = await roles.simulator.ask(seeker("-"), first_message, f"sage-{profile.id}-open")

    def finish(status: str) -> dict[str, Any]:
        record.update(status=status, final_score=score if status in FINAL else None, trajectory=trajectory,
                      analyses=analyses, rounds_done=len(analyses),
                      dialogue=[{"role": t.role.value, "text": t.text, **x} for t, x in zip(turns, extras)])
        return record

    if not opening.ok:
        return finish("simulator_failed")
    turns.append(Turn(Role.SEEKER, str(opening.value)))
    extras.append({})
    for r in range(cfg.max_rounds):
        reply = await model_reply(roles.model, turns, cfg.model_format, lang, f"sage-{profile.id}-r{r}-model", prompts)
        turns.append(Turn(Role.SUPPORTER, reply.pop("text")))
        extras.append(reply)
        text = transcript(turns, lang)
        ask = prompts.text("sage_analysis", lang, emotion=score, transcript=text, **fill)
        judged = await roles.simulator.ask([{"role": "user", "content": ask}], parse_change,
                                           f"sage-{profile.id}-r{r}-analysis", regex=CHANGE_REGEX)
        if judged.value is None:
            analyses.append({"round": r, "change": None, "raw_change": None, "analysis": field_line(judged.text,
                                                                                                    "analysis")})
            return finish("unparsed")
        new = next_score(score, int(judged.value), cfg)
        analyses.append({"round": r, "change": new - score, "raw_change": judged.value,
                         "analysis": field_line(judged.text, "analysis")})
        score = new
        trajectory.append(score)
        ended = outcome(score, cfg)
        if ended:
            return finish(ended)
        if r == cfg.max_rounds - 1:
            break
        said = await roles.simulator.ask(seeker(analyses[-1]["analysis"] or "-"), first_message,
                                         f"sage-{profile.id}-r{r}-seeker")
        if not said.ok:
            return finish("simulator_failed")
        turns.append(Turn(Role.SEEKER, str(said.value)))
        extras.append({})
    return finish("max_rounds")


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean final score over the scored dialogues, successes, failures, unparsed and failed counts, reply figures."""
    scored = [r for r in records if r.get("status") in FINAL]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.get("status", "?")] = statuses.get(r.get("status", "?"), 0) + 1
    turns = [t for r in scored for t in r["dialogue"] if t["role"] == "supporter"]
    finals = [r["final_score"] for r in scored]
    return {"harness": HARNESS, "dialogues": len(records), "scored": len(scored), "statuses": statuses,
            "mean_final_score": sum(finals) / len(finals) if finals else None,
            "successes": statuses.get("success", 0), "failures": statuses.get("failure", 0),
            "unparsed": statuses.get("unparsed", 0), "mean_rounds": (sum(r["rounds_done"] for r in scored) /
                                                                     len(scored)) if scored else None,
            "replies": reply_figures([t["text"] for t in turns])}
