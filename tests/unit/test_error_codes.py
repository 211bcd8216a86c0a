"""The service's error codes (``reward_server/error_codes.py``) and the one table (``reward_server/errors.py``):
every code a front can emit is a member, both fronts map each one as the table says, the clients read them back as
members, and no module spells a code as a string of its own."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from reward_server import errors, trainer_http
from reward_server.client import RewardCallError, _call_error
from reward_server.error_codes import ERROR_CODE_KEY, ERROR_FIELD_KEY, ErrorCode, parse_code
from reward_server.errors import ERROR_TABLE, BodyTooLarge, Overloaded, ServiceError, code_for_grpc_status
from reward_server.grpc import convert
from reward_server.http.convert import group_from_json
from reward_server.http.models import Error as ErrorModel
from reward_server.proto import pb
from reward_server.types import ErrorInfo, GroupRequest
from tests.unit.test_reward_service import GOOD, Service, body, make_service

ROOT = Path(__file__).resolve().parents[2]
#: the wire strings, as they were before the enum: a change here breaks every client
WIRE = {"INVALID_ARGUMENT", "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "UNSCORED",
        "UNAUTHENTICATED"}


def _error_classes() -> list[type[ServiceError]]:
    """Every ServiceError class the service defines (what a front can turn into an error answer)."""
    out, todo = [ServiceError], [ServiceError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__ == errors.__name__:
                out.append(sub)
                todo.append(sub)
    return out


ERROR_CLASSES = _error_classes()


def test_the_wire_values_are_unchanged_and_the_table_covers_every_code() -> None:
    assert {c.value for c in ErrorCode} == WIRE and all(c.value == c.name == str(c) == f"{c}" for c in ErrorCode)
    assert set(ERROR_TABLE) == set(ErrorCode)
    assert json.dumps({"code": ErrorCode.UNSCORED}) == '{"code": "UNSCORED"}'
    http = [status for status, _ in ERROR_TABLE.values()]
    assert len(set(http)) == len(http) and all(400 <= s < 600 for s in http)
    assert all(status is not grpc.StatusCode.OK for _, status in ERROR_TABLE.values())


def test_every_code_a_front_can_emit_is_a_member_and_every_member_is_emitted() -> None:
    assert {cls.code for cls in ERROR_CLASSES} == set(ErrorCode)
    assert all(isinstance(cls.code, ErrorCode) for cls in ERROR_CLASSES)


@pytest.mark.parametrize("status", list(grpc.StatusCode))
def test_a_grpc_status_reads_back_as_the_code_the_table_gives_it(status: grpc.StatusCode) -> None:
    code = code_for_grpc_status(status)
    sent = {c for c, (_, s) in ERROR_TABLE.items() if s is status and c is not ErrorCode.UNSCORED}
    assert (code is None and not sent) or (code in sent and len(sent) == 1)


def test_no_module_spells_a_code_as_a_string() -> None:
    """A code is ``ErrorCode.X`` everywhere but its definition (docstrings and comments may name it)."""
    found = []
    for path in sorted((ROOT / "reward_server").rglob("*.py")):
        if path.name == "error_codes.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{path.relative_to(ROOT)}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in WIRE and id(n) not in docstrings]
    assert found == []


# ------------------------------------------------------------------------------------------------ both fronts
@pytest.fixture
async def svc() -> AsyncIterator[Service]:
    async for s in make_service():
        yield s


def _raise(exc: ServiceError) -> Any:
    async def score_group(*_: Any, **__: Any) -> None:
        raise exc

    return score_group


@pytest.mark.parametrize("cls", [c for c in ERROR_CLASSES if c is not ServiceError], ids=lambda c: c.__name__)
async def test_both_fronts_answer_each_error_as_the_table_says(svc: Service, cls: type[ServiceError],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    exc = cls("refused for the test", "candidates[0]")
    http_status, grpc_status = ERROR_TABLE[exc.code]
    monkeypatch.setattr(svc.core, "score_group", _raise(exc))
    r = await svc.http.post("/v1/score", json=body([GOOD]))
    # the one exception to the table: an HTTP body over the limit is 413 (over gRPC the transport refuses it)
    assert r.status_code == (413 if cls is BodyTooLarge else http_status)
    err = r.json()["error"]
    assert parse_code(err["code"]) is exc.code and err["field"] == "candidates[0]"
    assert ("Retry-After" in r.headers) == (cls is Overloaded)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await svc.grpc_score(body([GOOD]))
    assert caught.value.code() is grpc_status
    meta = dict(caught.value.trailing_metadata() or ())
    assert parse_code(meta[ERROR_CODE_KEY]) is exc.code and meta[ERROR_FIELD_KEY] == "candidates[0]"
    assert caught.value.details() == "candidates[0]: refused for the test"
    # a client holding only the status reads the same code back (UNSCORED is HTTP-only: gRPC's UNKNOWN says nothing)
    assert code_for_grpc_status(caught.value.code()) is (None if exc.code is ErrorCode.UNSCORED else exc.code)


async def test_a_batch_entry_carries_its_code_over_both_fronts(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    async def score_batch(groups: list[GroupRequest | ErrorInfo], *_: Any) -> list[ErrorInfo]:
        return [ErrorInfo(code, f"groups[{i}]", "x") for i, code in enumerate(ErrorCode)][:len(groups)]

    monkeypatch.setattr(svc.core, "score_batch", score_batch)
    groups = [body([GOOD])] * len(ErrorCode)
    r = await svc.http.post("/v1/score:batch", json={"groups": groups})
    assert [g["error"]["code"] for g in r.json()["groups"]] == [c.value for c in ErrorCode]
    msg = pb.ScoreBatchRequest(groups=[convert.group_request_to_pb(group_from_json(g)) for g in groups])
    entries = convert.batch_from_pb(await svc.stub.ScoreBatch(msg))
    assert [e.code for e in entries if isinstance(e, ErrorInfo)] == list(ErrorCode)


# ------------------------------------------------------------------------------------------------ clients
@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_grpc_client_reads_each_code_back_as_a_member(code: ErrorCode) -> None:
    back = convert.error_from_pb(convert.error_to_pb(ErrorInfo(code, "groups[0]", "m")))
    assert back == ErrorInfo(code, "groups[0]", "m") and type(back.code) is ErrorCode


def test_a_code_the_client_does_not_know_is_internal_and_named_in_the_message() -> None:
    back = convert.error_from_pb(pb.Error(code="NEW_CODE", field="f", message="m"))
    assert back == ErrorInfo(ErrorCode.INTERNAL, "f", "NEW_CODE: m")


@pytest.mark.parametrize("status", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED])
def test_a_group_of_a_failed_batch_call_gets_the_code_of_the_status(status: grpc.StatusCode) -> None:
    """``RewardClient.score_batch``: a sub-batch that failed as a whole gives each of its groups an error."""
    err = _call_error(RewardCallError(status, "why", "host:1"), "groups[3]")
    if status is grpc.StatusCode.CANCELLED:  # no front sends it for a domain error: INTERNAL, the status named
        assert err == ErrorInfo(ErrorCode.INTERNAL, "groups[3]", "CANCELLED: why")
    else:
        assert err == ErrorInfo(ErrorCode.RESOURCE_EXHAUSTED, "groups[3]", "why")


@pytest.mark.parametrize("code", [*ErrorCode, "NEW_CODE"])
def test_the_trainer_http_client_reads_each_code(code: str) -> None:
    raw = json.dumps({"error": {"code": code, "field": "query[0]", "message": "m"}}).encode()
    message, parsed = trainer_http._describe("http://x", 422, raw)
    assert parsed is parse_code(code) and f"HTTP 422 {code} (field query[0])" in message


def test_the_trainer_http_client_loads_the_codes_by_path_without_compeer(tmp_path: Path) -> None:
    """As a trainer's worker loads it: the two files side by side, no site-packages (so no reward_server)."""
    for name in ("trainer_http.py", "error_codes.py"):
        (tmp_path / name).write_text((ROOT / "reward_server" / name).read_text())
    probe = ("import importlib.util as u, sys;"
             f"s = u.spec_from_file_location('t', {str(tmp_path / 'trainer_http.py')!r});"
             "m = u.module_from_spec(s); sys.modules['t'] = m; s.loader.exec_module(m);"
             "assert 'reward_server' not in sys.modules;"
             "print(m._describe('u', 502, b'{\"error\": {\"code\": \"UNSCORED\"}}')[1].name)")
    out = subprocess.run([sys.executable, "-S", "-P", "-c", probe], capture_output=True, text=True, timeout=60,
                         check=False, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "UNSCORED"


def test_the_http_schema_names_the_codes() -> None:
    """A string, as in the proto (an open set: a newer server may add a code), its description naming them."""
    code = ErrorModel.model_json_schema()["properties"]["code"]
    assert code["type"] == "string" and all(c in code["description"] for c in WIRE)
