"""The judge conversation of one candidate, run on an engine: each round of :func:`judge.protocol.plan_rounds` is
generated under the round's verdict constraint, parsed by the one verdict parser (:func:`cer.verdicts.parse_verdicts`)
and re-generated while unparsable (:func:`judge.generation.generate_validated`); every round sees the earlier ones."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import ParsedOutput
from cer.taxonomy import Taxonomy
from cer.verdicts import Verdict, parse_verdicts
from judge.engines.base import Engine, GenParams, Message
from judge.generation import RetryPolicy, generate_validated
from judge.protocol import JudgeSettings, RoundPlan, Template, plan_rounds, round_constraint


@dataclass
class CandidateJudgment:
    """What the judge said about one candidate."""

    verdicts: dict[str, Verdict | None] = field(default_factory=dict)
    judged: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    generations: int = 0


def round_params(settings: JudgeSettings, engine: Engine, components: tuple[str, ...]) -> GenParams:
    """The first attempt's sampling of a round deciding ``components``, constrained where the engine can."""
    regex, max_line = (round_constraint(components, settings.rationale_max_chars, engine.supports_line_bound)
                       if settings.constrain and engine.supports_regex else (None, None))
    return GenParams(max_tokens=settings.max_tokens_per_component * len(components), temperature=settings.temperature,
                     top_p=settings.top_p, seed=settings.seed, regex=regex, max_line_chars=max_line)


def retry_policy(settings: JudgeSettings) -> RetryPolicy:
    """The judge's re-generation policy for an unparsable round."""
    return RetryPolicy(max_retries=settings.max_retries, retry_temperature=settings.retry_temperature)


class Judge:
    """Runs the judge conversation for one candidate on an engine."""

    _ids = itertools.count()

    def __init__(self, engine: Engine, template: Template, taxonomy: Taxonomy, settings: JudgeSettings) -> None:
        self.engine = engine
        self.template = template
        self.taxonomy = taxonomy
        self.settings = settings

    @property
    def constrained(self) -> bool:
        return self.settings.constrain and self.engine.supports_regex

    async def judge(self, history: list[Turn], reference: str | None, parsed: ParsedOutput,
                    mode: JudgeMode) -> CandidateJudgment:
        """Judge one candidate; unparsable rounds are re-generated up to ``max_retries`` times.

        Raises :class:`judge.engines.base.EngineError` when the engine fails.
        """
        out = CandidateJudgment()
        policy = retry_policy(self.settings)
        messages: list[Message] = [{"role": "system", "content": self.template.system}]
        for plan in plan_rounds(self.template, self.taxonomy, mode, history, reference, parsed):
            messages.append({"role": "user", "content": plan.user})
            params = round_params(self.settings, self.engine, plan.components)
            result = await generate_validated(self.engine, messages, params, _all_verdicts(plan), policy,
                                              request_id=f"judge-{next(self._ids)}")
            out.generations += result.generations
            if result.engine_error is not None:
                raise result.engine_error
            verdicts = result.value if result.value is not None else parse_verdicts(result.text, plan.kinds)
            messages.append({"role": "assistant", "content": result.text})
            out.texts.append(result.text)
            for c, v in zip(plan.components, verdicts):
                out.verdicts[c] = v
                out.judged.add(c)
        return out


def _all_verdicts(plan: RoundPlan) -> Callable[[str], list[Verdict | None] | None]:
    """The validator of a round: its verdicts when every one of them parsed, else None."""
    def validate(text: str) -> list[Verdict | None] | None:
        verdicts = parse_verdicts(text, plan.kinds)
        return verdicts if all(v is not None for v in verdicts) else None

    return validate


__all__ = ["CandidateJudgment", "Judge", "retry_policy", "round_params"]
