"""Fuzzing the gRPC front: hypothesis-generated protobuf messages, built from the message descriptors of
``reward.proto``, and mutated wire bytes, against the live service (FAKE engine).

Property: a client's mistake is never INTERNAL / UNKNOWN (only OK, INVALID_ARGUMENT naming a field, or
DEADLINE_EXCEEDED for a tiny ``timeout_ms``), a good group in the same batch is still scored, and the server stays
ready. Bounded: a few dozen examples per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_server.grpc import convert
from reward_server.http.convert import group_from_json
from reward_server.proto import pb, pb_grpc
from tests.unit.live_service import LiveService, live_service
from tests.unit.test_reward_service import GOOD, body

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED}
_TEXTS = st.one_of(st.text(max_size=30), st.sampled_from(["", "  ", GOOD, GOOD[:40], "<<<", "x" * 8001]))


def _value(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(f.message_type, depth + 1)
    if f.type == FieldDescriptor.TYPE_ENUM:  # proto3 enums are open: unknown numbers reach the server too
        return st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-3, 40))
    if f.type == FieldDescriptor.TYPE_STRING:
        return _TEXTS
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if f.type == FieldDescriptor.TYPE_UINT32:
        return st.one_of(st.integers(0, 2000), st.integers(0, 2**32 - 1))
    raise NotImplementedError(f"no strategy for {f.full_name} (type {f.type}): add one")


def messages(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Any message of type ``desc``: each field unset or set, repeated fields 0-4 entries (fewer when nested)."""
    cls = getattr(pb, desc.name)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for f in desc.fields:
            if f.is_repeated:
                getattr(msg, f.name).extend(draw(st.lists(_value(f, depth), max_size=4 if depth == 0 else 2)))
            elif draw(st.booleans()):
                value = draw(_value(f, depth))
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, f.name).CopyFrom(value)
                else:
                    setattr(msg, f.name, value)
        return msg

    return build()


GROUPS = messages(pb.DESCRIPTOR.message_types_by_name["ScoreGroupRequest"])
GOOD_GROUP = convert.group_request_to_pb(group_from_json(body([GOOD])))


@pytest.fixture(scope="module")
def service() -> Iterator[LiveService]:
    with live_service() as svc:
        yield svc


@pytest.fixture(scope="module")
def stub(service: LiveService) -> Iterator[pb_grpc.RewardServiceStub]:
    with grpc.insecure_channel(service.grpc_address) as channel:
        yield pb_grpc.RewardServiceStub(channel)


def _code(call: Any) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_CODES, f"{exc.code()}: {exc.details()}"
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            assert dict(exc.trailing_metadata())["compeer-error-field"], exc.details()
        return exc.code()
    return grpc.StatusCode.OK


@FUZZ
@given(group=GROUPS)
def test_score_group_never_internal(stub: pb_grpc.RewardServiceStub, group: pb.ScoreGroupRequest) -> None:
    _code(lambda: stub.ScoreGroup(group, timeout=20))


@FUZZ
@given(before=st.lists(GROUPS, max_size=2), after=st.lists(GROUPS, max_size=2))
def test_batch_scores_the_good_group_beside_fuzzed_ones(stub: pb_grpc.RewardServiceStub,
                                                         before: list[pb.ScoreGroupRequest],
                                                         after: list[pb.ScoreGroupRequest]) -> None:
    reply = stub.ScoreBatch(pb.ScoreBatchRequest(groups=[*before, GOOD_GROUP, *after]), timeout=20)
    assert len(reply.groups) == len(before) + 1 + len(after)
    good = reply.groups[len(before)]
    assert good.WhichOneof("outcome") == "response", good
    assert [r.status for r in good.response.results] == [pb.STATUS_OK]
    for outcome in reply.groups:
        if outcome.WhichOneof("outcome") == "error":
            assert outcome.error.code in {"INVALID_ARGUMENT", "DEADLINE_EXCEEDED"} and outcome.error.field


def _mutations() -> st.SearchStrategy[bytes]:
    wire = GOOD_GROUP.SerializeToString()

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(wire)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data[: draw(st.integers(0, len(data)))])

    return st.one_of(mutate(), st.binary(max_size=64))


@FUZZ
@given(raw=_mutations())
def test_mutated_wire_bytes_never_internal(service: LiveService, raw: bytes) -> None:
    with grpc.insecure_channel(service.grpc_address) as channel:
        call = channel.unary_unary("/compeer.reward.v1.RewardService/ScoreGroup",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
        _code(lambda: call(raw, timeout=20))


@pytest.mark.parametrize("raw", [b"\x0a\xff\xff", b"\x1a\x02\xff\xfe"])  # corrupt wire format; bad UTF-8 string
def test_undecodable_request_is_invalid_argument_on_body(service: LiveService, raw: bytes) -> None:
    """Found by the mutation test above: gRPC's own parsing answered UNKNOWN for these bytes."""
    with grpc.insecure_channel(service.grpc_address) as channel:
        call = channel.unary_unary("/compeer.reward.v1.RewardService/ScoreGroup",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as exc:
            call(raw, timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(exc.value.trailing_metadata())["compeer-error-field"] == "body"
    assert "ScoreGroupRequest" in exc.value.details()


def test_server_stays_ready_after_fuzzing(service: LiveService, stub: pb_grpc.RewardServiceStub) -> None:
    assert service.core.ready
    assert stub.Info(pb.InfoRequest(), timeout=10).model == "fake-judge"
    assert [r.status for r in stub.ScoreGroup(GOOD_GROUP, timeout=10).results] == [pb.STATUS_OK]
