"""An OpenRLHF remote reward function that asks a running compeer reward service (``POST /get_reward``).

OpenRLHF accepts a ``.py`` file where it takes the reward URL, loads it by path and calls its
``reward_func(queries, prompts, labels)`` in a thread, one sample per call (openrlhf 0.9.1 to 0.11.2,
``openrlhf/utils/agent.py``)::

    --reward.remote_url /path/to/reward_server/openrlhf.py      # openrlhf >= 0.10 (before: --remote_rm_url)

It sends what OpenRLHF's own HTTP client would (``{"query", "prompts", "labels"}``) and returns the service's answer
(``rewards``, ``scores``, ``extra_logs``, ...), adding what that client lacks: a bearer token, retries of 429, 503 and
connection failures that wait the ``Retry-After`` the service sends, within a deadline, and a clear error. OpenRLHF
passes no settings, so they come from the environment of its rollout workers (Ray: ``--runtime-env-json
'{"env_vars": {...}}'``): ``COMPEER_REWARD_URL`` (the service's base URL, default ``http://127.0.0.1:8000``),
``COMPEER_REWARD_TOKEN`` or ``COMPEER_REWARD_TOKEN_FILE``, ``COMPEER_REWARD_TIMEOUT_S`` (one call, retries included;
default 170 s).

A call that fails raises :class:`CompeerRewardError` naming the HTTP status and the service's error (e.g. ``HTTP 502
UNSCORED (field query[0]): ...``), and logs it at ERROR first: OpenRLHF catches the exception, logs it at INFO and
leaves the sample without a reward, which stops the run later with an error of its own. Like ``POST /get_reward``
itself, it never makes a reward up; start the service with ``--get-reward-failure-reward`` to train through unscored
samples instead. It imports only the standard library (and ``trainer_http.py`` and ``error_codes.py`` beside it), so
OpenRLHF's workers need no compeer install.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger("compeer.openrlhf")
CompeerRewardError = _http.CompeerRewardError
#: one call's deadline, retries included: below the server's own /get_reward deadline plus its retries
DEFAULT_DEADLINE_S = 170.0


def reward_func(queries: list[str], prompts: list[str] | None = None, labels: list[Any] | None = None,
                **kwargs: Any) -> dict[str, Any]:
    """OpenRLHF's ``reward_func``: the service's ``/get_reward`` answer for these queries. Keyword arguments
    (``url``, ``token``, ``token_file``, ``timeout_s``) override the environment, for callers that can pass them."""
    remote = _http.Remote.from_settings(kwargs, DEFAULT_DEADLINE_S)
    body: dict[str, Any] = {"query": list(queries), "prompts": None if prompts is None else list(prompts),
            "labels": None if labels is None else list(labels)}
    try:
        out: dict[str, Any] = _http.post(remote, "/get_reward", body)
    except CompeerRewardError as exc:
        log.error("compeer reward of %d queries failed: %s", len(queries), exc)
        raise
    return out
