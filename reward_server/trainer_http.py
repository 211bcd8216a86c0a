"""Standard-library HTTP for the reward functions trainers load by path (``reward_server/openrlhf.py``,
``reward_server/verl.py``): one JSON POST with a bearer token, retried within a deadline.

It imports nothing but the standard library, so a trainer's workers can load it without compeer installed (the
reward function files load it by path from beside them when ``reward_server`` is not importable; it loads the error
codes, ``error_codes.py``, from beside itself the same way).

Retried: HTTP 429 (the service shed the call) and 503 (not ready), and connection failures (refused, reset), each
after the ``Retry-After`` the service sent or else a backoff doubling from 0.5 s to 8 s, as long as the deadline
leaves time. Every other answer fails at once with :class:`CompeerRewardError`, whose message names the URL, the HTTP
status and the service's error code, field and message (``{"error": {...}}``), never the request's text or the token.

Settings, by keyword argument or environment (keyword first): ``url`` / ``COMPEER_REWARD_URL`` (default
``http://127.0.0.1:8000``; several replicas comma-separated: calls start at the next one in turn, and each retry goes
to the next), ``token`` / ``COMPEER_REWARD_TOKEN`` or ``token_file`` / ``COMPEER_REWARD_TOKEN_FILE``
(a file holding the token, re-read at each call so a rotation needs no restart), ``timeout_s`` /
``COMPEER_REWARD_TIMEOUT_S`` (the deadline of one call, retries included).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

try:
    from reward_server import error_codes as _codes
except ImportError:  # loaded by path where compeer is not installed: the module beside this file
    import importlib.util as _util
    import sys as _sys

    if "_compeer_error_codes" not in _sys.modules:
        _spec = _util.spec_from_file_location("_compeer_error_codes", Path(__file__).with_name("error_codes.py"))
        assert _spec is not None and _spec.loader is not None, "error_codes.py must be beside this file"
        _sys.modules[_spec.name] = _util.module_from_spec(_spec)
        _spec.loader.exec_module(_sys.modules[_spec.name])
    _codes = _sys.modules["_compeer_error_codes"]

ErrorCode = _codes.ErrorCode

#: answers worth another try: shed (429) and not ready (503)
RETRY_STATUSES = frozenset({429, 503})
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0
DEFAULT_URL = "http://127.0.0.1:8000"
#: where the next call starts among several replicas (round robin, process-wide)
_TURN = itertools.count()


class CompeerRewardError(RuntimeError):
    """The service did not score (or could not be asked); the message says why. ``status`` is the HTTP status of
    the service's last answer (None: no answer), ``code`` its error code (e.g. ``ErrorCode.UNSCORED``; None: no
    answer, or a code this client does not know, which the message still names)."""

    def __init__(self, message: str, status: int | None = None, code: _codes.ErrorCode | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def setting(kwargs: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """Keyword argument ``name``, else the environment's ``COMPEER_REWARD_<NAME>``, else ``default``."""
    if kwargs.get(name) is not None:
        return kwargs[name]
    return os.environ.get(f"COMPEER_REWARD_{name.upper()}", default)


@dataclass(frozen=True)
class Remote:
    """Where and how to call the service."""

    url: str
    deadline_s: float
    token: str | None = None
    token_file: str | None = None

    @classmethod
    def from_settings(cls, kwargs: Mapping[str, Any], default_deadline_s: float) -> Remote:
        deadline = float(setting(kwargs, "timeout_s", default_deadline_s))
        if not deadline > 0:
            raise ValueError(f"timeout_s {deadline}: expected a positive number of seconds")
        urls = ",".join(u.strip().rstrip("/") for u in str(setting(kwargs, "url", DEFAULT_URL)).split(",") if u.strip())
        return cls(url=urls or DEFAULT_URL, deadline_s=deadline,
                   token=setting(kwargs, "token"), token_file=setting(kwargs, "token_file"))

    def urls(self, path: str) -> Iterator[str]:
        """The replicas' URLs for ``path``, endlessly, starting at the next one in turn (round robin over calls)."""
        bases = self.url.split(",")
        start = next(_TURN)
        return (bases[(start + i) % len(bases)] + path for i in itertools.count())

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        token = self.token
        if token is None and self.token_file:
            try:
                token = Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CompeerRewardError(f"token_file {self.token_file}: {exc.strerror or exc}") from None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers


class _Retry(Exception):
    def __init__(self, why: str, wait_s: float | None, status: int | None, code: _codes.ErrorCode | None) -> None:
        super().__init__(why)
        self.why, self.wait_s, self.status, self.code = why, wait_s, status, code


def _retry_after(headers: Message | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: not sent by this service
        return None


def _describe(url: str, status: int, raw: bytes) -> tuple[str, _codes.ErrorCode | None]:
    """``(message, error code)`` of an error answer: the service's ``{"error": {code, field, message}}``."""
    try:
        err = json.loads(raw).get("error") or {}
        code, field, msg = err.get("code"), err.get("field"), err.get("message", "")
    except (ValueError, AttributeError):
        code, field, msg = None, None, raw.decode("utf-8", "replace")[:300]
    where = f" (field {field})" if field else ""
    return f"{url} answered HTTP {status}{f' {code}' if code else ''}{where}: {msg}", _codes.parse_code(code)


def _attempt(url: str, data: bytes | None, headers: dict[str, str], timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except urllib.error.HTTPError as exc:
        message, code = _describe(url, exc.code, exc.read())
        if exc.code in RETRY_STATUSES:
            raise _Retry(message, _retry_after(exc.headers), exc.code, code) from None
        raise CompeerRewardError(message, exc.code, code) from None
    except TimeoutError:
        raise CompeerRewardError(f"{url} did not answer within {timeout_s:.1f} s (the call's deadline)") from None
    except (urllib.error.URLError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _Retry(f"{url} could not be reached: {reason}", None, None, None) from None
    except ValueError as exc:  # not JSON
        raise CompeerRewardError(f"{url} answered something that is not JSON: {exc}") from None


def _next_wait(retry: _Retry, tries: int, left_s: float, deadline_s: float) -> float:
    """How long to wait before the next try; raises :class:`CompeerRewardError` when the deadline leaves no time."""
    wait = retry.wait_s if retry.wait_s is not None else min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (tries - 1))
    if wait >= left_s:
        raise CompeerRewardError(f"{retry.why} (after {tries} tries; the {deadline_s:g} s deadline leaves no time "
                                 f"to wait {wait:.1f} s for another)", retry.status, retry.code)
    return wait


def post(remote: Remote, path: str, body: dict[str, Any] | None, *, sleep: Callable[[float], None] = time.sleep,
         clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """POST ``body`` to ``remote.url + path`` (None: GET it), retrying as the module says; the decoded JSON answer."""
    urls, end = remote.urls(path), clock() + remote.deadline_s
    data = None if body is None else json.dumps(body).encode("utf-8")
    tries = 0
    while True:
        tries += 1
        try:
            return _attempt(next(urls), data, remote.headers(), max(0.001, end - clock()))
        except _Retry as retry:
            sleep(_next_wait(retry, tries, end - clock(), remote.deadline_s))


async def post_async(remote: Remote, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """:func:`post` for an event loop: each try in a worker thread, the waits on the loop."""
    loop = asyncio.get_running_loop()
    urls, data, end = remote.urls(path), json.dumps(body).encode("utf-8"), loop.time() + remote.deadline_s
    tries = 0
    while True:
        tries += 1
        try:
            return await asyncio.to_thread(_attempt, next(urls), data, remote.headers(), max(0.001, end - loop.time()))
        except _Retry as retry:
            await asyncio.sleep(_next_wait(retry, tries, end - loop.time(), remote.deadline_s))
