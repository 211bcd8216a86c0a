"""Fuzzing the HTTP front with schemathesis from the service's own ``/openapi.json``, against the live service
(uvicorn on a real socket, FAKE engine).

Properties, for bodies that fit the schema (positive) and bodies that break it (negative): never a 5xx; every
answer is declared in the schema and matches its response model; a body that breaks the schema is refused with
a 4xx; a malformed group beside a good one in a batch fails alone; the server stays ready. Bounded: a few dozen
examples per operation and mode.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.unit.live_service import LiveService, live_service
from tests.unit.test_reward_service import GOOD, body

FUZZ = settings(max_examples=50, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


def _sets_a_deadline(value: Any) -> bool:
    """The request body sets ``timeout_ms`` somewhere (a group's options, a batch's groups' options)."""
    if isinstance(value, dict):
        return bool(value.get("timeout_ms")) or any(_sets_a_deadline(v) for v in value.values())
    return isinstance(value, list) and any(_sets_a_deadline(v) for v in value)


def not_a_server_error_but_its_own_deadline(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's ``not_a_server_error``, except a 504 ``DEADLINE_EXCEEDED`` answering a request that set its own
    ``timeout_ms`` (the fuzzer makes it as short as 1 ms): that is the documented answer to the client's deadline
    (docs/reward_server.md, "Errors"), not a server error. Any other 5xx still fails."""
    if response.status_code == 504 and _sets_a_deadline(case.body):
        try:
            code = json.loads(response.text)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code == "DEADLINE_EXCEEDED":
            return None
    return not_a_server_error(ctx, response, case)


CHECKS = [not_a_server_error_but_its_own_deadline, status_code_conformance, content_type_conformance,
          response_schema_conformance]
#: A batch answers 200 with an error entry for each malformed group (the others are scored), so a schema-breaking
#: batch is not refused as a whole: that contract is checked by test_bad_group_beside_a_good_one_fails_alone.
REFUSED_WHOLE = {"/v1/score"}
OPERATIONS = [("POST", "/v1/score"), ("POST", "/v1/score:batch"), ("GET", "/v1/info"), ("GET", "/healthz"),
              ("GET", "/readyz"), ("GET", "/metrics"), ("POST", "/v1/dialogues:score"), ("POST", "/get_reward")]


@pytest.fixture(scope="module")
def service() -> Iterator[LiveService]:
    with live_service() as svc:
        yield svc


@pytest.fixture(scope="module")
def schema(service: LiveService) -> Any:
    return schemathesis.openapi.from_url(f"{service.http_url}/openapi.json")


def test_every_route_is_fuzzed(schema: Any) -> None:
    assert {(op.method.upper(), op.path) for op in (r.ok() for r in schema.get_all_operations())} == set(OPERATIONS)


# a GET without parameters has no invalid request to generate: negative mode for the bodies only
@pytest.mark.parametrize("method,path,mode", [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS]
                         + [(m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"])
def test_http_api_holds_its_schema(schema: Any, service: LiveService, method: str, path: str,
                                   mode: GenerationMode) -> None:
    operation = schema[path][method]

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(base_url=service.http_url, timeout=20)
        case.validate_response(response, checks=CHECKS + ([negative_data_rejection] if path in REFUSED_WHOLE else []))

    run()


def test_bad_group_beside_a_good_one_fails_alone(schema: Any, service: LiveService) -> None:
    """Any body /v1/score refuses, sent as a batch group beside a good group: the good group is still scored."""
    operation = schema["/v1/score"]["POST"]

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def run(case: Any) -> None:
        assume(not isinstance(case.body, bytes))  # a group is a JSON value inside the batch
        batch = {"groups": [case.body, body([GOOD])]}
        r = requests.post(f"{service.http_url}/v1/score:batch", json=batch, timeout=20)
        assert r.status_code == 200, r.text
        groups = r.json()["groups"]
        assert groups[0]["error"]["field"].startswith("groups[0]"), groups[0]
        assert [c["status"] for c in groups[1]["results"]] == ["ok"]

    run()


EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "group.json").read_text())
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3), max_leaves=6)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    kids = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    return [path] + [p for k, v in kids for p in _paths(v, (*path, k))]


@st.composite
def mutated_examples(draw: st.DrawFn) -> Any:
    """examples/group.json with 1-3 nodes replaced by any JSON value (the issue's mutation test, 21 of 150 -> 500)."""
    doc = copy.deepcopy(EXAMPLE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        value = draw(JSON_VALUES)
        if not path:
            return value
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return doc


def test_mutated_example_is_never_a_server_error(service: LiveService) -> None:
    @FUZZ
    @given(doc=mutated_examples())
    def run(doc: Any) -> None:
        r = requests.post(f"{service.http_url}/v1/score", json=doc, timeout=20)
        assert r.status_code in (200, 422), r.text
        if r.status_code == 422:
            assert r.json()["error"]["field"], r.text
        batch = requests.post(f"{service.http_url}/v1/score:batch", json={"groups": [doc, body([GOOD])]}, timeout=20)
        assert batch.status_code == 200 and batch.json()["groups"][1]["results"][0]["status"] == "ok", batch.text

    run()


def test_server_stays_ready_after_fuzzing(service: LiveService) -> None:
    assert requests.get(f"{service.http_url}/readyz", timeout=5).status_code == 200
    r = requests.post(f"{service.http_url}/v1/score", json=body([GOOD]), timeout=20)
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "ok"


def test_only_a_deadline_the_request_set_itself_passes_as_no_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz check lets through a 504 DEADLINE_EXCEEDED when the body set ``timeout_ms`` (found by the fuzzer: 1 ms
    on /v1/dialogues:score), and hands everything else to schemathesis's ``not_a_server_error``."""
    handed: list[int] = []
    monkeypatch.setattr(sys.modules[__name__], "not_a_server_error", lambda ctx, r, c: handed.append(r.status_code))

    class Reply:
        def __init__(self, status: int, code: str) -> None:
            self.status_code, self.text = status, json.dumps({"error": {"code": code, "message": "m"}})

    class Case:
        def __init__(self, body: Any) -> None:
            self.body = body

    deadline = {"turns": [{"role": "seeker", "text": "hi"}], "options": {"timeout_ms": 1}}
    assert not_a_server_error_but_its_own_deadline(None, Reply(504, "DEADLINE_EXCEEDED"), Case(deadline)) is None
    nested = {"groups": [{"options": {"timeout_ms": 5}}]}
    assert not_a_server_error_but_its_own_deadline(None, Reply(504, "DEADLINE_EXCEEDED"), Case(nested)) is None
    assert handed == []
    not_a_server_error_but_its_own_deadline(None, Reply(504, "DEADLINE_EXCEEDED"), Case({"turns": []}))
    not_a_server_error_but_its_own_deadline(None, Reply(500, "INTERNAL"), Case(deadline))
    not_a_server_error_but_its_own_deadline(None, Reply(504, "UNAVAILABLE"), Case(deadline))
    assert handed == [504, 500, 504]
