"""The judge conversation of one candidate, run on an engine: each round of :func:`judge.protocol.plan_rounds` is
generated under the round's verdict constraint, parsed by the one verdict parser (:func:`cer.verdicts.parse_verdicts`)
and re-generated while unparsable (:func:`judge.generation.generate_validated`); every round sees the earlier ones.

With ``JudgeSettings.verdict_probs`` on an engine that ``supports_logprobs``, each round also asks for the top-k
logprobs and keeps, per component, the probability of each verdict label (:func:`judge.verdict_probs
.label_distributions`, read from the accepted attempt), tempered by the judge's verdict temperature
(:mod:`judge.calibration`): the graded rewards' input (:func:`judgment_rewards`).

With ``JudgeSettings.answer_prefix`` on an engine that ``supports_prefix``, each round's answer is started for the
engine with :data:`judge.protocol.ANSWER_PREFIX` (``GenParams.prefix``): it decodes the rest only, under the round's
constraint with that prefix removed (:func:`judge.protocol.round_constraint`); the text it returns starts with the
prefix, so the parser and the conversation's later rounds see the same answer."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cer import rewards
from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import ParsedOutput
from cer.taxonomy import Taxonomy
from cer.verdicts import STEP_LABELS, Preference, Verdict, parse_verdicts
from judge.calibration import resolve_temperature, temper
from judge.engines.base import MASKED_TOP_K, MAX_LOGPROBS, Engine, GenParams, Message
from judge.generation import RetryPolicy, Validated, content_key, generate_validated, sampling_fields
from judge.protocol import (
    ANSWER_PREFIX,
    PREFERENCE,
    REPLY,
    STEP_COMPONENTS,
    JudgeSettings,
    RoundPlan,
    Template,
    plan_rounds,
    round_constraint,
)
from judge.verdict_probs import LabelDistribution, label_distributions


@dataclass
class CandidateJudgment:
    """What the judge said about one candidate: per component its verdict and, when asked, its label probabilities
    (``probs``: None where the engine returned none, no alternative fitted a label, or the round failed)."""

    verdicts: dict[str, Verdict | None] = field(default_factory=dict)
    judged: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    generations: int = 0
    probs: dict[str, LabelDistribution | None] = field(default_factory=dict)

    def p_true(self, component: str) -> float | None:
        """P(True) of a True/False component (a step, the reply verdict); None when unknown."""
        dist = self.probs.get(component)
        return None if dist is None else dist[STEP_LABELS[0]]

    def preference_probs(self) -> dict[Preference, float] | None:
        """The preference's label probabilities; None when unknown."""
        dist = self.probs.get(PREFERENCE)
        return None if dist is None else {Preference(label): p for label, p in dist.items()}


def judgment_rewards(j: CandidateJudgment, parsed: ParsedOutput,
                     mode: JudgeMode) -> tuple[rewards.CandidateRewards, rewards.CandidateRewards]:
    """The discrete and the graded rewards of a judged candidate (:mod:`cer.rewards`)."""
    steps = [v if isinstance(v := j.verdicts.get(c), bool) else None for c in STEP_COMPONENTS]
    pref = j.verdicts.get(PREFERENCE)
    reply = j.verdicts.get(REPLY)
    discrete = rewards.candidate_rewards(parsed, mode, steps, pref if isinstance(pref, Preference) else None,
                                         reply if isinstance(reply, bool) else None)
    graded = rewards.graded_candidate_rewards(parsed, mode, [j.p_true(c) for c in STEP_COMPONENTS],
                                              j.preference_probs(), j.p_true(REPLY))
    return discrete, graded


def answer_prefix(settings: JudgeSettings, engine: Engine) -> str | None:
    """The answer prefix a round is sent with: :data:`judge.protocol.ANSWER_PREFIX` when ``settings.answer_prefix`` is
    on and the engine ``supports_prefix``, else None (an engine without it is never sent one)."""
    return ANSWER_PREFIX if settings.answer_prefix and engine.supports_prefix else None


def round_params(settings: JudgeSettings, engine: Engine, components: tuple[str, ...],
                 logprobs: int | None = None) -> GenParams:
    """The first attempt's sampling of a round deciding ``components``, constrained where the engine can, asking for
    ``logprobs`` alternatives per token when given, with the answer prefix where the engine takes one
    (:func:`answer_prefix`; ``max_tokens`` then counts the continuation's tokens)."""
    prefix = answer_prefix(settings, engine)
    regex, max_line = (round_constraint(components, settings.rationale_max_chars, engine.supports_line_bound,
                                        prefix=prefix or "")
                       if settings.constrain and engine.supports_regex else (None, None))
    return GenParams(max_tokens=settings.max_tokens_per_component * len(components), temperature=settings.temperature,
                     top_p=settings.top_p, seed=settings.seed, regex=regex, max_line_chars=max_line, logprobs=logprobs,
                     prefix=prefix)


def retry_policy(settings: JudgeSettings) -> RetryPolicy:
    """The judge's re-generation policy for an unparsable round."""
    return RetryPolicy(max_retries=settings.max_retries, retry_temperature=settings.retry_temperature)


def verdict_top_k(settings: JudgeSettings, engine: Engine) -> int:
    """The alternatives a token the judge asks ``engine`` for (graded rewards): ``settings.verdict_top_k``, or by
    default :data:`~judge.engines.base.MASKED_TOP_K` where the engine computes them after the verdict grammar's mask
    on constrained rounds and :data:`~judge.engines.base.MAX_LOGPROBS` elsewhere (an unmasked distribution may rank
    other tokens above a label); never more than the engine returns."""
    masked = engine.masked_logprobs and settings.constrain and engine.supports_regex
    default = MASKED_TOP_K if masked else MAX_LOGPROBS
    return min(settings.verdict_top_k or default, engine.max_logprobs)


class Judge:
    """Runs the judge conversation for one candidate on an engine."""

    _ids = itertools.count()

    def __init__(self, engine: Engine, template: Template, taxonomy: Taxonomy, settings: JudgeSettings) -> None:
        self.engine = engine
        self.template = template
        self.taxonomy = taxonomy
        self.settings = settings
        #: the verdict temperature applied to the label probabilities (:mod:`judge.calibration`)
        self.temperature = resolve_temperature(settings.verdict_temperature, engine.config.adapter_dir)

    @property
    def constrained(self) -> bool:
        return self.settings.constrain and self.engine.supports_regex

    @property
    def graded(self) -> bool:
        """The judge reads verdict probabilities (``verdict_probs`` on an engine that returns logprobs)."""
        return self.settings.verdict_probs and self.engine.supports_logprobs

    @property
    def logprobs(self) -> int | None:
        """The alternatives a token each round asks the engine for (:func:`verdict_top_k`); None when not graded."""
        return verdict_top_k(self.settings, self.engine) if self.graded else None

    @property
    def prefixed(self) -> bool:
        """Each round's answer is started for the engine (``answer_prefix`` on an engine that ``supports_prefix``)."""
        return answer_prefix(self.settings, self.engine) is not None

    def _rounds(self, history: list[Turn], reference: str | None, parsed: ParsedOutput,
                mode: JudgeMode) -> list[tuple[RoundPlan, GenParams]]:
        """Each round of a candidate with the sampling of its first attempt: what :meth:`judge` sends and
        :meth:`judgment_key` hashes (one source, so the key cannot leave out what the engine is sent)."""
        top_k = self.logprobs
        return [(plan, round_params(self.settings, self.engine, plan.components, logprobs=top_k))
                for plan in plan_rounds(self.template, self.taxonomy, mode, history, reference, parsed,
                                        independent=self.settings.independent_rounds)]

    def judgment_key(self, history: list[Turn], reference: str | None, parsed: ParsedOutput,
                     mode: JudgeMode) -> str | None:
        """The key of the judgment :meth:`judge` would give (sha256 hex, :func:`judge.generation.content_key`), or
        None when it sends the engine no round (every component is failed by rule: there is nothing to judge, so
        nothing to cache; such candidates of different conversations would otherwise share one key).

        It hashes what decides that judgment: the engine's :meth:`~judge.engines.base.Engine.identity` (backend,
        weights, seed, ...), the template version, the system message and, per round, the user message the engine is
        sent (conversation, candidate parts, reference, strategy taxonomy, as rendered), the components it decides and
        its sampling (temperature, top_p, seed, max_tokens, the verdict regex with the rationale bound, the line bound,
        the logprobs asked for graded rewards), the retry policy, and the verdict temperature when it is not 1 (the
        recorded probabilities are tempered; an uncalibrated judge keeps its keys). The judge's own answers need no
        place in it: they follow from the rest. The mode is not in it either: two modes that send the same rounds get
        the same judgment (the rewards are computed from it afterwards)."""
        rounds = [{"user": plan.user, "components": list(plan.components),
                   "params": {**sampling_fields(params), "logprobs": params.logprobs}}
                  for plan, params in self._rounds(history, reference, parsed, mode)]
        if not rounds:
            return None
        policy = retry_policy(self.settings)
        spec: dict[str, Any] = {
            "engine": self.engine.identity(), "template": self.template.version, "system": self.template.system,
            "rounds": rounds,
            "retry": {"max_retries": policy.max_retries, "retry_temperature": policy.retry_temperature}}
        if self.graded and not self.temperature.identity:  # the probabilities recorded are tempered
            spec["verdict_temperature"] = [self.temperature.step, self.temperature.preference]
        return content_key(spec)

    async def judge(self, history: list[Turn], reference: str | None, parsed: ParsedOutput,
                    mode: JudgeMode) -> CandidateJudgment:
        """Judge one candidate; unparsable rounds are re-generated up to ``max_retries`` times.

        Raises :class:`judge.engines.base.EngineError` when the engine fails.
        """
        out = CandidateJudgment()
        policy = retry_policy(self.settings)
        system: Message = {"role": "system", "content": self.template.system}
        rounds = self._rounds(history, reference, parsed, mode)

        async def run(messages: list[Message], plan: RoundPlan, params: GenParams) -> Validated[list[Verdict | None]]:
            return await generate_validated(self.engine, messages, params, _all_verdicts(plan), policy,
                                            request_id=f"judge-{next(self._ids)}")

        if self.settings.independent_rounds:  # every round at once, each after the system message alone
            results = await asyncio.gather(*(run([system, {"role": "user", "content": plan.user}], plan, params)
                                             for plan, params in rounds))
            for (plan, params), result in zip(rounds, results):
                self._record(out, plan, params, result)
            return out
        messages: list[Message] = [system]
        for plan, params in rounds:
            messages.append({"role": "user", "content": plan.user})
            result = await run(messages, plan, params)
            self._record(out, plan, params, result)
            messages.append({"role": "assistant", "content": result.text})
        return out

    def _record(self, out: CandidateJudgment, plan: RoundPlan, params: GenParams,
                result: Validated[list[Verdict | None]]) -> None:
        """A round's outcome into ``out`` (raising the engine's error, if it failed); the tokens of an answer sent
        with a prefix begin after it."""
        out.generations += result.generations
        if result.engine_error is not None:
            raise result.engine_error
        verdicts = result.value if result.value is not None else parse_verdicts(result.text, plan.kinds)
        dists = label_distributions(result.text, result.tokens if result.ok else None, plan.kinds,
                                    start=len(params.prefix or ""))
        out.texts.append(result.text)
        for c, kind, v, d in zip(plan.components, plan.kinds, verdicts, dists):
            out.verdicts[c] = v
            out.judged.add(c)
            if self.graded:
                out.probs[c] = None if d is None else temper(d, self.temperature.of(kind))


def _all_verdicts(plan: RoundPlan) -> Callable[[str], list[Verdict | None] | None]:
    """The validator of a round: its verdicts when every one of them parsed, else None."""
    def validate(text: str) -> list[Verdict | None] | None:
        verdicts = parse_verdicts(text, plan.kinds)
        return verdicts if all(v is not None for v in verdicts) else None

    return validate


__all__ = ["CandidateJudgment", "Judge", "answer_prefix", "judgment_rewards", "retry_policy",
           "round_params"]
