"""veRL custom reward functions that ask a running compeer reward service (``POST /v1/score``).

Point veRL (>= 0.9: only ``reward.custom_reward_function.*`` is read) at this file, unchanged::

    reward.custom_reward_function.path=/path/to/reward_server/verl.py \\
    reward.custom_reward_function.name=compute_score_async \\
    +reward.custom_reward_function.reward_kwargs.url=http://reward:8000

The file imports nothing but the standard library (and ``trainer_http.py`` and ``error_codes.py`` beside it), so veRL
can load it by path into workers where compeer is not installed. veRL's reward managers (``naive``, ``rate_limited``,
...) call ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` per response, awaiting
it when it is a coroutine function (:func:`compute_score_async`) and running it in a thread otherwise:

* ``solution_str``: the policy's decoded response, the candidate (CER output).
* ``ground_truth`` (the row's ``reward_model.ground_truth``): the reference reply, or empty/None for none (then use a
  mode without a preference round, e.g. ``prm``).
* ``extra_info["history"]``: the conversation before the response, as ``[{"role": "seeker"|"supporter", "text": ...}]``
  or as chat messages ``[{"role": "user"|"assistant"|"system", "content": ...}]`` (system messages are skipped).

Settings, from keyword arguments (``reward_kwargs``) or the environment (``COMPEER_REWARD_<NAME>``): ``url``,
``token`` / ``token_file``, ``timeout_s`` (one response's deadline, retries included; default 240 s, below the
``rate_limited`` manager's 300 s ``reward.timeout``), ``mode`` (default: the server's), ``reward_kind`` (``graded``,
the default: the judge's expected reward, as compeer's own GRPO trains on; or ``discrete``, the paper's ±1 total),
``failure_reward`` (default unset). Calls that the service sheds (429), a service not ready (503) and connection
failures are retried within the deadline, waiting the ``Retry-After`` it sends (``trainer_http.py``).

Each function returns a dict, so veRL logs every key beside the reward: ``score`` (the reward), ``status`` (the
service's status of the response: ``ok``, ``parse_failed``, ``timeout``, ...; ``invalid_input`` for a row without a
history or a group the service refused with 422; ``call_failed`` when the service could not be asked or refused the
call otherwise: 401, 429 or 503 past the deadline, ...), ``scored`` (1.0 when judged, else 0.0), ``discrete_total``,
``graded_total`` and the ``reward_kind`` components ``step_reward`` (the three steps' sum), ``preference_reward``,
``format_reward``, ``reply_reward`` (None where absent). A response that was not scored raises
:class:`CompeerRewardError` naming the status, unless ``failure_reward`` is set: then ``score`` is that value,
``scored`` 0.0 and ``status`` says why; nothing is made up silently. (veRL's ``rate_limited`` manager turns any
exception into reward 0.0 with only a log line: set ``failure_reward`` there so the failures are counted.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

try:
    from reward_server import trainer_http as _http
except ImportError:  # loaded by path where compeer is not installed: the module beside this file
    import importlib.util as _util
    import sys as _sys
    from pathlib import Path as _Path

    if "_compeer_trainer_http" not in _sys.modules:
        _spec = _util.spec_from_file_location("_compeer_trainer_http", _Path(__file__).with_name("trainer_http.py"))
        assert _spec is not None and _spec.loader is not None, "trainer_http.py must be beside this file"
        _sys.modules[_spec.name] = _util.module_from_spec(_spec)
        _spec.loader.exec_module(_sys.modules[_spec.name])
    _http = _sys.modules["_compeer_trainer_http"]

_ROLES = {"seeker": "seeker", "supporter": "supporter", "user": "seeker", "assistant": "supporter"}
CompeerRewardError = _http.CompeerRewardError
#: one response's deadline, retries included: below the rate_limited manager's default reward.timeout (300 s)
DEFAULT_DEADLINE_S = 240.0
REWARD_KINDS = ("graded", "discrete")
#: the keys of every returned dict (veRL needs the same keys for every response of a batch)
KEYS = ("score", "status", "scored", "discrete_total", "graded_total", "step_reward", "preference_reward",
        "format_reward", "reply_reward")


def history_from_extra_info(extra_info: dict[str, Any] | None) -> list[dict[str, str]]:
    """The conversation before the response, as the service's turns; ValueError when absent or malformed."""
    raw: Any = (extra_info or {}).get("history")
    if hasattr(raw, "tolist"):  # a numpy array: how a list column comes back from parquet through pandas
        raw = raw.tolist()
    if not isinstance(raw, (list, tuple)) or not raw:
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


def _group(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, mode: Any) -> dict[str, Any]:
    """The ``/v1/score`` group of one response (ValueError when its history is missing)."""
    body: dict[str, Any] = {
        "history": history_from_extra_info(extra_info),
        "reference": ground_truth if isinstance(ground_truth, str) and ground_truth.strip() else None,
        "candidates": [solution_str], "options": {"include_similarity": False}}
    if mode:
        body["options"]["mode"] = mode
    return body


class NotScored(CompeerRewardError):
    """The service answered, but did not score the response; ``result_status`` is its status."""

    def __init__(self, message: str, result_status: str) -> None:
        super().__init__(message)
        self.result_status = result_status


class ServerMismatch(CompeerRewardError):
    """The service cannot serve what the settings ask (``reward_kind`` graded from a server without graded rewards):
    raised even with ``failure_reward`` set, since no response of the run could be scored."""


class _Settings:
    """The keyword arguments and environment of one call, read once."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.remote = _http.Remote.from_settings(kwargs, DEFAULT_DEADLINE_S)
        self.mode = _http.setting(kwargs, "mode")
        self.kind = str(_http.setting(kwargs, "reward_kind", "graded"))
        if self.kind not in REWARD_KINDS:
            raise ValueError(f"reward_kind {self.kind!r}: expected one of {', '.join(REWARD_KINDS)}")
        failure = _http.setting(kwargs, "failure_reward")
        self.failure = None if failure is None else float(failure)


def _scored(result: dict[str, Any], meta: dict[str, Any], kind: str) -> dict[str, Any]:
    """The returned dict of one result; CompeerRewardError (with ``status``) when it was not scored."""
    status = result.get("status")
    if status != "ok":
        why = (result.get("error") or {}).get("message", "")
        raise NotScored(f"not scored: status {status}{': ' + why if why else ''}", str(status))
    graded = result.get("graded_rewards")
    if kind == "graded" and graded is None and not meta.get("graded", False):
        raise ServerMismatch("reward_kind graded: this server serves no graded rewards (meta.graded false: its engine "
                         "returns no logprobs, or it runs with --no-verdict-probs); set reward_kind=discrete or serve "
                         "a judge with logprobs")
    chosen = graded if kind == "graded" else result["rewards"]
    if chosen is None or chosen.get("total") is None:
        raise NotScored(f"not scored: no {kind} total (the judge's verdict probabilities were not obtained)",
                        "no_total")
    steps = [s for s in chosen.get("steps") or [] if s is not None]
    return {"score": float(chosen["total"]), "status": "ok", "scored": 1.0,
            "discrete_total": result["rewards"].get("total"), "graded_total": None if graded is None else
            graded.get("total"), "step_reward": float(sum(steps)) if steps else None,
            "preference_reward": chosen.get("preference"), "format_reward": chosen.get("format"),
            "reply_reward": chosen.get("reply")}


def _failed(settings: _Settings, exc: Exception, what: str) -> dict[str, Any]:
    """The dict of a response that was not scored (``failure_reward`` set), else raise naming ``what``."""
    if isinstance(exc, ServerMismatch):
        raise exc
    if isinstance(exc, NotScored):
        status = exc.result_status
    elif isinstance(exc, ValueError) or getattr(exc, "code", None) == _http.ErrorCode.INVALID_ARGUMENT:
        status = "invalid_input"  # the row (history) or the group the service refused (422)
    else:
        status = "call_failed"
    if settings.failure is None:
        raise CompeerRewardError(f"compeer reward of {what}: {exc}", getattr(exc, "status", None),
                                 getattr(exc, "code", None)) from exc
    return {**dict.fromkeys(KEYS), "score": settings.failure, "status": status, "scored": 0.0}


def _one(answer: dict[str, Any], settings: _Settings) -> dict[str, Any]:
    return _scored(answer["results"][0], answer.get("meta") or {}, settings.kind)


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """veRL's reward function: the compeer reward of ``solution_str`` and its components (module docstring)."""
    settings = _Settings(kwargs)
    try:
        body = _group(solution_str, ground_truth, extra_info, settings.mode)
        return _one(_http.post(settings.remote, "/v1/score", body), settings)
    except (CompeerRewardError, ValueError) as exc:
        return _failed(settings, exc, f"data_source {data_source!r}")


async def compute_score_async(data_source: Any, solution_str: str, ground_truth: Any,
                              extra_info: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """:func:`compute_score` as a coroutine function: veRL's reward loop awaits it on its event loop (each HTTP try
    in a worker thread, the retry waits on the loop) instead of holding an executor thread per response."""
    settings = _Settings(kwargs)
    try:
        body = _group(solution_str, ground_truth, extra_info, settings.mode)
        return _one(await _http.post_async(settings.remote, "/v1/score", body), settings)
    except (CompeerRewardError, ValueError) as exc:
        return _failed(settings, exc, f"data_source {data_source!r}")


def _max_groups(remote: Any) -> int:
    """The server's ``limits.max_groups`` (``GET /v1/info``, within 10 s; 256, the default, when it cannot be read:
    the batch call itself then says what is wrong)."""
    try:
        quick = dataclasses.replace(remote, deadline_s=min(10.0, remote.deadline_s))
        return max(1, int(_http.post(quick, "/v1/info", None)["limits"]["max_groups"]))
    except (CompeerRewardError, KeyError, TypeError, ValueError):
        return 256


def compute_score_batch(data_sources: list[Any], solution_strs: list[str], ground_truths: list[Any],
                        extra_infos: list[dict[str, Any] | None], **kwargs: Any) -> list[dict[str, Any]]:
    """Legacy: veRL's ``batch`` reward manager form (``verl/workers/reward_manager/batch.py``, which veRL's trainer
    reaches only up to veRL 0.7; 0.9's reward loop calls per-response functions). Every response its own group,
    sent in ``POST /v1/score:batch`` calls of at most the server's ``max_groups``; the same rules and dicts per
    response as :func:`compute_score` (with ``failure_reward`` set, a call that fails as a whole gives each of its
    responses the failure dict)."""
    settings = _Settings(kwargs)
    out: list[dict[str, Any] | None] = [None] * len(solution_strs)
    pending: list[tuple[int, dict[str, Any]]] = []
    for i, (s, g, e) in enumerate(zip(solution_strs, ground_truths, extra_infos)):
        try:
            pending.append((i, _group(s, g, e, settings.mode)))
        except ValueError as exc:
            out[i] = _failed(settings, exc, f"item {i} (data_source {data_sources[i]!r})")
    size = _max_groups(settings.remote) if pending else 1
    for start in range(0, len(pending), size):
        chunk = pending[start:start + size]
        try:
            answers = _http.post(settings.remote, "/v1/score:batch", {"groups": [b for _, b in chunk]})["groups"]
        except CompeerRewardError as exc:
            for i, _ in chunk:
                out[i] = _failed(settings, exc, f"items {chunk[0][0]}..{chunk[-1][0]}")
            continue
        for (i, _), a in zip(chunk, answers):
            try:
                if "error" in a:
                    raise NotScored(f"{a['error']['field']}: {a['error']['message']}", "invalid_input")
                out[i] = _one(a, settings)
            except CompeerRewardError as exc:
                out[i] = _failed(settings, exc, f"item {i} (data_source {data_sources[i]!r})")
    return [o for o in out if o is not None]
