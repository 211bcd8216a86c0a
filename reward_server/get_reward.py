"""OpenRLHF's remote reward model protocol (``POST /get_reward``), transport-neutral.

OpenRLHF posts ``{"query": [...], "prompts": [...], "labels": [...]}``: ``query[i]`` is the chat-templated prompt
followed by the generated response, ``prompts[i]`` the chat-templated prompt alone, ``labels[i]`` the dataset's label
(``--label_key``). It reads back ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``, one number per query.

Mapping (:func:`map_query`): the response is ``query[len(prompt):]`` when the query starts with ``prompts[i]``, else
(no prompt, or a decode round trip changed its text) what follows the query's last assistant header, the prompt
then read from the query before it; trailing end-of-turn tokens are cut. The
prompt's messages are read back from its chat template (ChatML: ``<|im_start|>role ... <|im_end|>``, as SmolLM2 and
Qwen write it; Llama 3: ``<|start_header_id|>role<|end_header_id|> ... <|eot_id|>``): system messages are dropped,
``user`` turns are the seeker's, ``assistant`` turns the supporter's (their reply part, :func:`reply_text`). The
label, when a non-empty string, is the reference reply. Queries with the same prompt and label form one group (a GRPO
group: its ``s_in`` is meaningful), judged in ``--get-reward-mode`` (default ``unified``).

The reward is the graded total by default (``--get-reward-kind graded``: the judge's expected reward, as compeer's own
GRPO trainer uses; :mod:`cer.rewards`), or the paper's discrete total (``--get-reward-kind discrete``). Graded needs a
server that serves graded rewards (``meta.graded``): otherwise every call fails with 422 ``INVALID_ARGUMENT`` naming
the setting, rather than silently returning discrete totals. A query whose graded total is missing (the judge's
verdict probabilities were not obtained) is an unscored query, like a parse failure.

A call with no query (``{"query": []}``: the empty shard OpenRLHF 0.9.1-0.11.0 sends its other URLs) is answered with
empty lists. A call is judged within ``--get-reward-timeout-s`` (below OpenRLHF's 180 s client timeout; 504 past it).

A query that cannot be scored never gets a made-up number. Unless ``--get-reward-failure-reward`` is set, the call
fails: 422 ``INVALID_ARGUMENT`` naming ``query[i]`` when a query cannot be mapped or breaks a limit, 502 ``UNSCORED``
when the judge did not score one (parse failure, timeout, engine error). With it set, such a query gets that reward
and score 0, and ``extra_logs.compeer_scored`` is 0 for it (1 for a judged query); ``statuses`` names each outcome.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from cer import rewards
from cer.dialogue import Role, Turn
from cer.reasoning import parse
from cer.rewards import RewardKind
from reward_server.core import RewardCore, reply_text
from reward_server.errors import InvalidArgument, Unscored
from reward_server.types import GroupRequest, ScoreOptions, Status
from reward_server.validation import check_mode, validate_group

_CHATML = re.compile(r"<\|im_start\|>(system|user|assistant)[^\n]*\n(.*?)(?:<\|im_end\|>|(?=<\|im_start\|>)|\Z)",
                     re.DOTALL)
_LLAMA3 = re.compile(r"<\|start_header_id\|>(system|user|assistant)<\|end_header_id\|>\n*(.*?)(?:<\|eot_id\|>|"
                     r"(?=<\|start_header_id\|>)|\Z)", re.DOTALL)
_ASSISTANT_HEADER = re.compile(r"<\|im_start\|>assistant[^\n]*\n|<\|start_header_id\|>assistant<\|end_header_id\|>\n*")
#: End-of-turn and padding tokens cut from the end of a response.
_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<pad>", "<|end|>")
_ROLES = {"user": Role.SEEKER, "assistant": Role.SUPPORTER}


@dataclass(frozen=True)
class RewardQuery:
    """One OpenRLHF query read back as a conversation state and a candidate."""

    history: list[Turn]
    response: str
    reference: str | None


def _strip_end(text: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for tok in _END_TOKENS:
            if text.endswith(tok):
                text, changed = text[: -len(tok)].rstrip(), True
    return text


def parse_chat(prompt: str) -> list[Turn]:
    """The seeker and supporter turns of a chat-templated prompt (ChatML or Llama 3); ValueError when neither."""
    pattern = _CHATML if "<|im_start|>" in prompt else _LLAMA3 if "<|start_header_id|>" in prompt else None
    if pattern is None:
        raise ValueError("the prompt is in no chat format this server reads (ChatML <|im_start|>, Llama 3 "
                         "<|start_header_id|>)")
    turns = []
    for role, content in pattern.findall(prompt):
        content = _strip_end(content)
        if role == "system" or not content:  # the open generation prompt has no content
            continue
        text = content if _ROLES[role] is Role.SEEKER else reply_text(content, parse(content))
        turns.append(Turn(_ROLES[role], text))
    return turns


def map_query(query: str, prompt: str | None, label: Any) -> RewardQuery:
    """Read one query (with its prompt and label) as history + candidate + reference; ValueError says why not."""
    if prompt and query.startswith(prompt):
        context, response = prompt, query[len(prompt):]
    else:  # no prompt, or a decode round trip changed its text: split at the query's last assistant header
        heads = list(_ASSISTANT_HEADER.finditer(query))
        if not heads:
            raise ValueError("the query does not start with its prompt and has no assistant header to split it at")
        context, response = query[: heads[-1].end()], query[heads[-1].end():]
    response = _strip_end(response)
    if not response:
        raise ValueError("the response after the prompt is empty")
    if label is not None and not isinstance(label, str):
        raise ValueError(f"a label must be the reference reply (a string) or null, got {type(label).__name__}")
    history = parse_chat(context)
    if not any(t.role is Role.SEEKER for t in history):
        raise ValueError("the prompt has no user (seeker) turn")
    return RewardQuery(history, response, label if label and label.strip() else None)


def _column(data: dict[str, Any], key: str, n: int) -> list[Any]:
    value = data.get(key)
    if value is None:
        return [None] * n
    if not isinstance(value, list) or len(value) != n:
        raise InvalidArgument(f"expected a list of {n} entries, one per query (or null)", key)
    return value


async def get_reward(core: RewardCore, data: Any, timeout_s: float | None = None) -> dict[str, Any]:
    """Answer one ``/get_reward`` body (already JSON-decoded); raises :class:`ServiceError` as the docstring says."""
    core.check_ready()
    settings, limits = core.config.get_reward, core.config.limits
    check_mode(settings.mode, core.modes, "get_reward.mode (server setting --get-reward-mode)")
    graded = settings.kind is RewardKind.GRADED
    if graded and not core.graded:
        raise InvalidArgument("this server serves no graded rewards (its engine returns no logprobs, or "
                              "--no-verdict-probs is set); start it with --get-reward-kind discrete for the discrete "
                              "totals, or with an engine that returns logprobs", "get_reward.kind (server setting "
                              "--get-reward-kind)")
    if not isinstance(data, dict) or not isinstance(data.get("query"), list):
        raise InvalidArgument('expected a JSON object {"query": [str, ...], "prompts": [...], "labels": [...]}',
                              "query")
    queries: list[Any] = data["query"]
    n = len(queries)
    if n > limits.max_queries:
        raise InvalidArgument(f"{n} queries: expected 0..{limits.max_queries} per call (--max-queries)", "query")
    prompts, labels = _column(data, "prompts", n), _column(data, "labels", n)
    if n == 0:  # OpenRLHF 0.9.1-0.11.0 sends every URL but the first an empty shard of a one-query call
        return {"rewards": [], "scores": [], "extra_logs": {"compeer_scored": []}, "statuses": [], "errors": {}}
    failure = settings.failure_reward
    statuses: list[str] = [Status.INVALID_INPUT.value] * n
    errors: dict[int, str] = {}
    groups: dict[tuple[Any, ...], tuple[GroupRequest, list[int]]] = {}
    for i, (q, p, lab) in enumerate(zip(queries, prompts, labels)):
        try:
            if not isinstance(q, str) or (p is not None and not isinstance(p, str)):
                raise ValueError("query and prompt must be strings")
            m = map_query(q, p, lab)
            key = (tuple(m.history), m.reference)
            g = groups.get(key)
            req = GroupRequest(m.history, m.reference, [*(g[0].candidates if g else []), m.response],
                               ScoreOptions(mode=settings.mode, include_similarity=True))
            validate_group(req, settings.mode, limits, modes=core.modes)
            if len(req.candidates[-1]) > limits.max_text_chars:
                raise ValueError(f"the response's {len(req.candidates[-1])} characters exceed the limit of "
                                 f"{limits.max_text_chars}")
            groups[key] = (req, [*(g[1] if g else []), i])
        except (ValueError, InvalidArgument) as exc:
            msg = f"{exc.field}: {exc.message}" if isinstance(exc, InvalidArgument) else str(exc)
            if failure is None:
                raise InvalidArgument(f"query {i} cannot be judged: {msg}", f"query[{i}]") from None
            errors[i] = msg
    rewards_out: list[float | None] = [None] * n
    totals = list(groups.values())
    work = asyncio.gather(*(core.score_validated(req, settings.mode) for req, _ in totals))
    responses = await core.bounded(work, min(core.timeout_for(0, timeout_s), settings.timeout_s), "query")
    for (_, idx), resp in zip(totals, responses):
        for i, r in zip(idx, resp.results):
            statuses[i] = r.status.value
            chosen = r.graded_rewards if graded else r.rewards
            rewards_out[i] = chosen.total if r.status is Status.OK and chosen is not None else None
            if r.error is not None and r.status is not Status.OK:
                errors[i] = r.error.message
            elif r.status is Status.OK and rewards_out[i] is None:
                errors[i] = "no graded reward: the judge's verdict probabilities were not obtained"
    unscored = [i for i, r in enumerate(rewards_out) if r is None]
    if unscored and failure is None:
        detail = ", ".join(f"query[{i}]: {errors.get(i) if statuses[i] == Status.OK.value else statuses[i]}"
                           for i in unscored[:10])
        raise Unscored(f"{len(unscored)} of {n} queries were not scored ({detail}); nothing is made up for them: "
                       "retry, or start the server with --get-reward-failure-reward to train through them",
                       f"query[{unscored[0]}]")
    lo, hi = rewards.total_range(settings.mode)
    final = [failure if r is None else r for r in rewards_out]
    return {"rewards": final,
            "scores": [0.0 if r is None else (r - lo) / (hi - lo) for r in rewards_out],
            "extra_logs": {"compeer_scored": [0.0 if r is None else 1.0 for r in rewards_out]},
            "statuses": statuses, "errors": {str(i): e for i, e in sorted(errors.items())}}
