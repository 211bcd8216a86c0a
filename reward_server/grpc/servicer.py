"""gRPC servicer: converts protobuf to neutral types, awaits the core, converts back; errors via the one table.

A group-level error aborts the call with the table's status code; its details read ``<field>: <message>`` and
the trailing metadata carries ``compeer-error-code`` / ``compeer-error-field``. Register it with
:func:`add_to_server`: bytes that are not a valid request message are the client's mistake (INVALID_ARGUMENT on
``body``), where the generated registration would let gRPC answer UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from reward_server.core import RewardCore
from reward_server.dialogue import score_dialogue
from reward_server.errors import InvalidArgument, ServiceError, grpc_trailers
from reward_server.grpc import convert, dialogue_convert
from reward_server.proto import pb, pb_grpc
from reward_server.types import ErrorInfo, GroupRequest

T = TypeVar("T")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RewardService"].full_name


class Undecodable:
    """A request whose bytes do not parse as its message type; the servicer answers INVALID_ARGUMENT."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error

    def problem(self) -> InvalidArgument:
        return InvalidArgument(f"the request is not a valid {self.type_name}: {self.error}", "body")


def _lenient(cls: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    def parse(raw: bytes) -> Message | Undecodable:
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            return Undecodable(cls.DESCRIPTOR.full_name, str(exc).split(": ")[-1])

    return parse


def _decoded(request: T | Undecodable) -> T:
    if isinstance(request, Undecodable):
        raise request.problem()
    return request


class RewardServicer(pb_grpc.RewardServiceServicer):
    """``compeer.reward.v1.RewardService`` over a :class:`RewardCore`."""

    def __init__(self, core: RewardCore) -> None:
        self.core = core

    async def _unary(self, method: str, context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            with self.core.metrics.track("grpc", method):
                return await fn()
        except ServiceError as exc:
            await context.abort(exc.grpc_code, f"{exc.field}: {exc.message}" if exc.field else exc.message,
                                trailing_metadata=grpc_trailers(exc))
            raise AssertionError("unreachable: context.abort raises") from exc

    async def ScoreGroup(self, request: pb.ScoreGroupRequest | Undecodable, context: Any) -> pb.ScoreGroupResponse:
        async def run() -> pb.ScoreGroupResponse:
            req = convert.group_request_from_pb(_decoded(request))
            return convert.group_response_to_pb(await self.core.score_group(req, context.time_remaining()))

        return await self._unary("ScoreGroup", context, run)

    async def ScoreBatch(self, request: pb.ScoreBatchRequest | Undecodable, context: Any) -> pb.ScoreBatchResponse:
        async def run() -> pb.ScoreBatchResponse:
            batch: pb.ScoreBatchRequest = _decoded(request)
            groups: list[GroupRequest | ErrorInfo] = []
            for i, g in enumerate(batch.groups):
                try:
                    groups.append(convert.group_request_from_pb(g, prefix=f"groups[{i}]."))
                except InvalidArgument as exc:
                    groups.append(exc.info())
            return convert.batch_to_pb(await self.core.score_batch(groups, context.time_remaining()))

        return await self._unary("ScoreBatch", context, run)

    async def ScoreDialogue(self, request: pb.ScoreDialogueRequest | Undecodable, context: Any
                            ) -> pb.ScoreDialogueResponse:
        async def run() -> pb.ScoreDialogueResponse:
            req = dialogue_convert.dialogue_request_from_pb(_decoded(request))
            resp = await score_dialogue(self.core, req, context.time_remaining())
            return dialogue_convert.dialogue_response_to_pb(resp)

        return await self._unary("ScoreDialogue", context, run)

    async def Info(self, request: pb.InfoRequest | Undecodable, context: Any) -> pb.InfoResponse:
        async def run() -> pb.InfoResponse:
            _decoded(request)
            return convert.info_to_pb(self.core.info())

        return await self._unary("Info", context, run)


def add_to_server(servicer: RewardServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` as the generated ``add_RewardServiceServicer_to_server`` does, with request parsing
    that hands undecodable bytes to the servicer (INVALID_ARGUMENT) instead of failing inside gRPC."""
    service = pb.DESCRIPTOR.services_by_name["RewardService"]
    handlers = {m.name: grpc.unary_unary_rpc_method_handler(
        getattr(servicer, m.name), request_deserializer=_lenient(getattr(pb, m.input_type.name)),
        response_serializer=getattr(pb, m.output_type.name).SerializeToString) for m in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
