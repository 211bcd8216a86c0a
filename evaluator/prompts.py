"""Prompts, rubrics and the answer formats the harnesses parse (the texts live in ``data/prompts.yaml``).

Parsers read only the last matching line of a generation, and return None for anything outside the format:
a score the scorer did not give in the rubric's format is reported as unparsed, never defaulted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cer.dialogue import Role, Turn
from cer.policy_prompt import policy_messages
from cer.reasoning import reply_text
from cer.taxonomy import load_taxonomy, named_strategy
from evaluator.backends import ChatRole, Message
from judge.settings import setting

LANGUAGES = ("english", "chinese")
SCORE_MIN, SCORE_MAX = 0, 4
REASON_MAX_CHARS = 120
#: The scorer's answer: a one-line reason, then the score (sent as a structured-output regex where supported).
SCORE_REGEX = rf"Reason: [^\n]{{1,{REASON_MAX_CHARS}}}\nScore: [{SCORE_MIN}-{SCORE_MAX}]"
#: The SAGE seeker's analysis step: a one-line analysis, then the change of its emotion score.
CHANGE_REGEX = rf"Analysis: [^\n]{{1,{REASON_MAX_CHARS}}}\nChange: [+-]?[0-9]{{1,2}}"
_SCORE_LINE = re.compile(r"^\s*\**score\**\s*[:：]\s*\**\s*([0-9]+)\s*\**\s*(?:/\s*4)?\s*$", re.IGNORECASE | re.MULTILINE)
_CHANGE_LINE = re.compile(r"^\s*\**change\**\s*[:：]\s*\**\s*([+-]?[0-9]+)\s*\**\s*$", re.IGNORECASE | re.MULTILINE)
_FIELD_LINE = re.compile(r"^\s*\**(reason|analysis)\**\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Dimension:
    """One ESC-Eval dimension with its definition and its 0-4 rubric lines."""

    name: str
    definition: str
    rubric: tuple[str, ...]


@dataclass(frozen=True)
class Prompts:
    """The prompt texts of ``prompts.yaml`` (per-language texts are dicts keyed by ``english`` / ``chinese``)."""

    raw: dict[str, Any]
    dimensions: tuple[Dimension, ...]

    def text(self, key: str, language: str | None = None, **values: Any) -> str:
        """The prompt ``key`` (in ``language`` when it has one per language) with ``values`` filled in."""
        value = self.raw[key]
        if isinstance(value, dict):
            value = value[language or "english"]
        return str(value).format(**values) if values else str(value)


_REQUIRED = ("model_system", "esc_seeker_system", "greeting", "scorer_system", "scorer_user", "dimensions",
             "sage_seeker_system", "sage_analysis")


@lru_cache(maxsize=4)
def load_prompts(path: str | None = None) -> Prompts:
    """Load the packaged prompts, or another YAML with the same keys; raises ``ValueError`` naming a missing key."""
    if path is None:
        text = resources.files("evaluator").joinpath("data/prompts.yaml").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    missing = [k for k in _REQUIRED if k not in (raw or {})]
    if missing:
        raise ValueError(f"prompts {path or 'default'}: missing keys {', '.join(missing)}")
    dims = tuple(Dimension(str(d["name"]), str(d["definition"]), tuple(str(r) for r in d["rubric"]))
                 for d in raw["dimensions"])
    if len(dims) == 0 or any(len(d.rubric) != SCORE_MAX - SCORE_MIN + 1 for d in dims):
        raise ValueError(f"prompts {path or 'default'}: every dimension needs {SCORE_MAX - SCORE_MIN + 1} rubric lines")
    return Prompts(raw, dims)


def parse_score(text: str) -> int | None:
    """The score of the last ``Score: N`` line when N is in 0-4, else None (never a default)."""
    hits = _SCORE_LINE.findall(text)
    if not hits:
        return None
    value = int(hits[-1])
    return value if SCORE_MIN <= value <= SCORE_MAX else None


def parse_change(text: str) -> int | None:
    """The raw change of the last ``Change: N`` line (unclamped; the caller clamps), else None."""
    hits = _CHANGE_LINE.findall(text)
    return int(hits[-1]) if hits else None


def field_line(text: str, name: str) -> str:
    """The last ``Reason:`` / ``Analysis:`` line's content ('' when absent)."""
    hits = [v for k, v in _FIELD_LINE.findall(text) if k.lower() == name]
    return hits[-1] if hits else ""


def seeker_chat(system: str, greeting: str, turns: list[Turn]) -> list[Message]:
    """The seeker simulator's chat: its role prompt, the supporter's greeting and supporter turns as ``user``, its own
    turns as ``assistant``."""
    messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": greeting}]
    messages += [{"role": "assistant" if t.role is Role.SEEKER else "user", "content": t.text} for t in turns]
    return messages


def transcript(turns: list[Turn], language: str = "english") -> str:
    """The dialogue as ``Seeker: ...`` / ``Supporter: ...`` lines (求助者 / 支持者 in Chinese)."""
    names = {Role.SEEKER: "求助者", Role.SUPPORTER: "支持者"} if language == "chinese" else \
        {Role.SEEKER: "Seeker", Role.SUPPORTER: "Supporter"}
    return "\n".join(f"{names[t.role]}: {t.text}" for t in turns)


def first_message(text: str) -> str | None:
    """A simulator's message: the text up to a line where it starts speaking for the other side; None if empty."""
    lines = []
    for line in text.strip().splitlines():
        if re.match(r"^\s*(supporter|assistant|ai|支持者|助手)\s*[:：]", line, re.IGNORECASE):
            break
        lines.append(line)
    out = " ".join(" ".join(lines).replace("<<<", " ").replace(">>>", " ").split())
    out = re.sub(r"^(seeker|user|求助者)\s*[:：]\s*", "", out, flags=re.IGNORECASE).strip().strip('"')
    return out or None


#: how the model under test is prompted and its reply read (:func:`model_reply`)
MODEL_FORMATS = ("plain", "cer")


def model_format_setting(default: str) -> Any:
    """The ``model_format`` setting of a harness config (``--model-format``), defaulting to ``default``."""
    return setting(default, choices=MODEL_FORMATS,
                   help="plain: any chat model, its output is the reply; cer: the CER policy prompt, the reply is the "
                        "<response> part (policy checkpoints)")


def cer_reply(raw: str) -> dict[str, Any]:
    """What a CER policy output says: ``text`` (its ``<response>`` part, the tag-stripped output when that part is
    missing), ``raw``, ``format_ok`` / ``missing`` (how well formed it was) and ``strategy`` (the taxonomy strategy
    its ``<strategy>`` part names, None when none). The one reading of a policy's output for the evaluation and the
    loop's report on its training rollouts."""
    reply, parsed = reply_text(raw)
    step3 = parsed.parts["strategy"]
    return {"text": reply, "raw": raw, "format_ok": parsed.ok, "missing": parsed.missing,
            "strategy": named_strategy(step3, load_taxonomy()) if step3 else None}


async def model_reply(role: ChatRole, history: list[Turn], fmt: str, language: str, request_id: str,
                      prompts: Prompts) -> dict[str, Any]:
    """One reply of the model under test after ``history``.

    ``fmt`` ``plain``: the whole output is the reply. ``cer``: the model gets the CER policy prompt; the reply is its
    ``<response>`` part (the tag-stripped output when that part is missing), ``format_ok`` / ``missing`` say how well
    formed it was and ``strategy`` is the taxonomy strategy its ``<strategy>`` part names (None when none).
    """
    if fmt == "cer":
        messages: list[Message] = policy_messages(history)
    else:
        messages = [{"role": "system", "content": prompts.text("model_system", language)}]
        messages += [{"role": "user" if t.role is Role.SEEKER else "assistant", "content": t.text} for t in history]
    done = await role.ask(messages, lambda text: text, request_id)
    raw = done.text
    return cer_reply(raw) if fmt == "cer" else {"text": raw.strip(), "raw": raw}
