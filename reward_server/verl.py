"""A veRL custom reward function that asks a running compeer reward service (``POST /v1/score``).

Point veRL at this file, unchanged::

    custom_reward_function.path=/path/to/reward_server/verl.py custom_reward_function.name=compute_score

The file imports nothing but the standard library, so veRL can load it by path into workers where compeer is not
installed. veRL calls ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` per
response (its ``naive`` reward manager; ``extra_info`` is the dataset row's ``extra_info`` column):

* ``solution_str``: the policy's decoded response, the candidate (CER output).
* ``ground_truth`` (the row's ``reward_model.ground_truth``): the reference reply, or empty/None for none (then use a
  mode without a preference round, e.g. ``prm``).
* ``extra_info["history"]``: the conversation before the response, as ``[{"role": "seeker"|"supporter", "text": ...}]``
  or as chat messages ``[{"role": "user"|"assistant"|"system", "content": ...}]`` (system messages are skipped).

Settings, from keyword arguments (veRL's ``custom_reward_function.reward_kwargs``) or the environment:
``url`` / ``COMPEER_REWARD_URL`` (default ``http://127.0.0.1:8000``), ``mode`` / ``COMPEER_REWARD_MODE`` (default: the
server's), ``timeout_s`` / ``COMPEER_REWARD_TIMEOUT_S`` (default 300), ``failure_reward`` /
``COMPEER_REWARD_FAILURE_REWARD`` (default unset).

For veRL's ``batch`` reward manager, name ``compute_score_batch`` instead: it takes the same items as lists
(``data_sources``, ``solution_strs``, ``ground_truths``, ``extra_infos``) and scores them in one
``POST /v1/score:batch`` call.

It returns the judged total reward. A response the service did not score (status other than ``ok``) or a call that
failed raises :class:`CompeerRewardError`, which stops veRL's step, unless a failure reward is set: then that value
is returned instead. Nothing is made up silently.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

_ROLES = {"seeker": "seeker", "supporter": "supporter", "user": "seeker", "assistant": "supporter"}


class CompeerRewardError(RuntimeError):
    """The service did not score the response (or could not be asked); the message says why."""


def history_from_extra_info(extra_info: dict[str, Any] | None) -> list[dict[str, str]]:
    """The conversation before the response, as the service's turns; ValueError when absent or malformed."""
    raw = (extra_info or {}).get("history")
    if not isinstance(raw, list) or not raw:
        raise ValueError('extra_info["history"] must be the conversation before the response: a non-empty list of '
                         '{"role": "seeker"|"supporter", "text": ...} or {"role": "user"|"assistant", "content": ...}')
    turns = []
    for i, t in enumerate(raw):
        role = t.get("role") if isinstance(t, dict) else None
        if role == "system":
            continue
        text = t.get("text", t.get("content")) if isinstance(t, dict) else None
        if role not in _ROLES or not isinstance(text, str):
            raise ValueError(f'extra_info["history"][{i}]: role must be one of {sorted(_ROLES)} and the text a string')
        turns.append({"role": _ROLES[role], "text": text})
    return turns


def _setting(kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
    if kwargs.get(name) is not None:
        return kwargs[name]
    return os.environ.get(f"COMPEER_REWARD_{name.upper()}", default)


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except urllib.error.HTTPError as exc:
        raise CompeerRewardError(f"{url} answered {exc.code}: {exc.read().decode('utf-8', 'replace')[:500]}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise CompeerRewardError(f"{url} could not be reached: {exc}") from exc


def _group(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, mode: Any) -> dict[str, Any]:
    """The ``/v1/score`` group of one response (ValueError when its history is missing)."""
    body: dict[str, Any] = {
        "history": history_from_extra_info(extra_info),
        "reference": ground_truth if isinstance(ground_truth, str) and ground_truth.strip() else None,
        "candidates": [solution_str], "options": {"include_similarity": False}}
    if mode:
        body["options"]["mode"] = mode
    return body


def _total(result: dict[str, Any]) -> float:
    if result.get("status") != "ok" or result["rewards"]["total"] is None:
        why = (result.get("error") or {}).get("message", "")
        raise CompeerRewardError(f"not scored: status {result.get('status')}{': ' + why if why else ''}")
    return float(result["rewards"]["total"])


def _url(kwargs: dict[str, Any], path: str) -> str:
    return str(_setting(kwargs, "url", "http://127.0.0.1:8000")).rstrip("/") + path


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> float:
    """veRL's reward function (``naive`` reward manager): the compeer total reward of ``solution_str``."""
    failure = _setting(kwargs, "failure_reward")
    try:
        body = _group(solution_str, ground_truth, extra_info, _setting(kwargs, "mode"))
        return _total(_post(_url(kwargs, "/v1/score"), body, float(_setting(kwargs, "timeout_s", 300)))["results"][0])
    except (CompeerRewardError, ValueError) as exc:
        if failure is None:
            raise CompeerRewardError(f"compeer reward for data_source {data_source!r}: {exc}") from exc
        return float(failure)


def compute_score_batch(data_sources: list[Any], solution_strs: list[str], ground_truths: list[Any],
                        extra_infos: list[dict[str, Any] | None], **kwargs: Any) -> list[float]:
    """veRL's ``batch`` reward manager form: every response of the batch in one ``POST /v1/score:batch`` call (each
    its own group), the same rules per response as :func:`compute_score`."""
    failure = _setting(kwargs, "failure_reward")
    mode = _setting(kwargs, "mode")
    bodies: list[dict[str, Any] | None] = []
    errors: dict[int, str] = {}
    for i, (s, g, e) in enumerate(zip(solution_strs, ground_truths, extra_infos)):
        try:
            bodies.append(_group(s, g, e, mode))
        except ValueError as exc:
            bodies.append(None)
            errors[i] = str(exc)
    sent = [b for b in bodies if b is not None]
    answers = iter(_post(_url(kwargs, "/v1/score:batch"), {"groups": sent},
                         float(_setting(kwargs, "timeout_s", 300)))["groups"] if sent else [])
    out: list[float] = []
    for i, b in enumerate(bodies):
        try:
            if b is None:
                raise CompeerRewardError(errors[i])
            a = next(answers)
            if "error" in a:
                raise CompeerRewardError(f"{a['error']['field']}: {a['error']['message']}")
            out.append(_total(a["results"][0]))
        except CompeerRewardError as exc:
            if failure is None:
                raise CompeerRewardError(f"compeer reward of item {i} (data_source {data_sources[i]!r}): {exc}") from exc
            out.append(float(failure))
    return out
