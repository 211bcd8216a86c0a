"""``reward_server/trainer_http.py``, the standard-library client of the trainer-side reward functions: retries of
429/503/connection failures that honour Retry-After within a deadline, the token, errors that name the status. A
scripted stdlib HTTP server in a thread plays the service."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reward_server import trainer_http
from reward_server.trainer_http import CompeerRewardError, Remote
from tests.conftest import free_port


class Scripted:
    """A server answering each POST with the next ``(status, headers, body)`` of ``script`` (the last repeats),
    recording each request's headers and body."""

    def __init__(self, script: list[tuple[int, dict[str, str], Any]]) -> None:
        self.script, self.requests = list(script), []  # type: list[tuple[dict[str, str], Any]]
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((dict(self.headers), body))
                status, headers, answer = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                data = json.dumps(answer).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[Scripted] = []

    def make(*script: tuple[int, dict[str, str], Any]) -> Scripted:
        s = Scripted(list(script))
        threading.Thread(target=s.server.serve_forever, daemon=True).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.server.shutdown()
        s.server.server_close()


SHED = (429, {"Retry-After": "0.2"}, {"error": {"code": "RESOURCE_EXHAUSTED", "field": "groups", "message": "busy"}})
OK = (200, {}, {"rewards": [1.0]})


def test_429_and_503_are_retried_after_the_retry_after_they_send(scripted: Any) -> None:
    s = scripted(SHED, (503, {}, {"error": {"code": "UNAVAILABLE", "field": "", "message": "loading"}}), OK)
    waits: list[float] = []
    out = trainer_http.post(Remote(s.url, deadline_s=30, token="tok-" + "x" * 20), "/get_reward", {"query": ["q"]},
                            sleep=waits.append)
    assert out == {"rewards": [1.0]} and waits == [0.2, 1.0]  # Retry-After, then the backoff (no header)
    assert [r[1] for r in s.requests] == [{"query": ["q"]}] * 3
    assert all(r[0]["Authorization"] == "Bearer tok-" + "x" * 20 for r in s.requests)


def test_no_retry_past_the_deadline_and_errors_name_the_status(scripted: Any) -> None:
    s = scripted((429, {"Retry-After": "5"}, SHED[2]))
    with pytest.raises(CompeerRewardError, match=r"HTTP 429 RESOURCE_EXHAUSTED \(field groups\): busy .*deadline") as e:
        trainer_http.post(Remote(s.url, deadline_s=2), "/v1/score", {}, sleep=lambda _: None)
    assert e.value.status == 429 and e.value.code == "RESOURCE_EXHAUSTED" and len(s.requests) == 1
    s = scripted((502, {}, {"error": {"code": "UNSCORED", "field": "query[0]", "message": "1 of 1 not scored"}}))
    with pytest.raises(CompeerRewardError, match=r"answered HTTP 502 UNSCORED \(field query\[0\]\): 1 of 1") as e:
        trainer_http.post(Remote(s.url, deadline_s=30), "/get_reward", {}, sleep=lambda _: None)
    assert len(s.requests) == 1 and e.value.status == 502  # the judge's failure is not retried


def test_connection_failures_are_retried_until_the_deadline() -> None:
    waits: list[float] = []
    clock = iter(range(100))  # each look at the clock: one more second
    with pytest.raises(CompeerRewardError, match="could not be reached.*tries") as e:
        trainer_http.post(Remote(f"http://127.0.0.1:{free_port()}", deadline_s=6), "/get_reward", {},
                          sleep=waits.append, clock=lambda: float(next(clock)))
    assert waits == [0.5, 1.0] and e.value.status is None


async def test_the_async_post_retries_on_the_loop(scripted: Any) -> None:
    s = scripted(SHED, OK)
    t0 = asyncio.get_running_loop().time()
    assert await trainer_http.post_async(Remote(s.url, deadline_s=10), "/x", {"a": 1}) == {"rewards": [1.0]}
    assert asyncio.get_running_loop().time() - t0 >= 0.2


def test_settings_from_keywords_then_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COMPEER_REWARD_URL", "http://reward:8000/")
    monkeypatch.setenv("COMPEER_REWARD_TOKEN_FILE", str(tmp_path / "token"))
    (tmp_path / "token").write_text("tok-from-file-0123456789\n")
    r = Remote.from_settings({}, 170)
    assert r.url == "http://reward:8000" and r.deadline_s == 170
    assert r.headers()["Authorization"] == "Bearer tok-from-file-0123456789"
    assert Remote.from_settings({"url": "http://other", "timeout_s": 5, "token": "t" * 20}, 170).headers()[
        "Authorization"] == "Bearer " + "t" * 20
    (tmp_path / "token").unlink()
    with pytest.raises(CompeerRewardError, match="token_file"):
        r.headers()
    with pytest.raises(ValueError, match="timeout_s"):
        Remote.from_settings({"timeout_s": 0}, 170)


def test_several_replicas_take_calls_in_turn_and_a_retry_goes_to_the_next(scripted: Any) -> None:
    a, b = scripted(OK), scripted(OK)
    remote = Remote.from_settings({"url": f"{a.url}, {b.url}/"}, 30)
    for _ in range(4):
        assert trainer_http.post(remote, "/get_reward", {"query": []}) == {"rewards": [1.0]}
    assert len(a.requests) == len(b.requests) == 2
    shedding, ok = scripted((429, {"Retry-After": "0"}, SHED[2])), scripted(OK)
    remote = Remote.from_settings({"url": f"{shedding.url},{ok.url}"}, 30)
    for _ in range(2):  # whichever replica a call starts at, it is answered
        assert trainer_http.post(remote, "/x", {}, sleep=lambda _: None) == {"rewards": [1.0]}
    assert len(shedding.requests) == 1 and len(ok.requests) == 2
