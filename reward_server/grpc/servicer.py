"""gRPC servicer: converts protobuf to neutral types, awaits the core, converts back; errors via the one table.

A group-level error aborts the call with the table's status code; its details read ``<field>: <message>`` and
the trailing metadata carries ``compeer-error-code`` / ``compeer-error-field``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from reward_server.core import RewardCore
from reward_server.errors import RETRY_AFTER_KEY, InvalidArgument, Overloaded, ServiceError
from reward_server.grpc import convert
from reward_server.proto import pb, pb_grpc
from reward_server.types import ErrorInfo, GroupRequest

T = TypeVar("T")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RewardService"].full_name


class RewardServicer(pb_grpc.RewardServiceServicer):
    """``compeer.reward.v1.RewardService`` over a :class:`RewardCore`."""

    def __init__(self, core: RewardCore) -> None:
        self.core = core

    async def _unary(self, method: str, context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            with self.core.metrics.track("grpc", method):
                return await fn()
        except ServiceError as exc:
            retry = ((RETRY_AFTER_KEY, str(round(exc.retry_after_s * 1000))),) if isinstance(exc, Overloaded) else ()
            await context.abort(exc.grpc_code, f"{exc.field}: {exc.message}" if exc.field else exc.message,
                                trailing_metadata=(("compeer-error-code", exc.code.value),
                                                   ("compeer-error-field", exc.field), *retry))
            raise AssertionError("unreachable: context.abort raises") from exc

    async def ScoreGroup(self, request: pb.ScoreGroupRequest, context: Any) -> pb.ScoreGroupResponse:
        async def run() -> pb.ScoreGroupResponse:
            req = convert.group_request_from_pb(request)
            return convert.group_response_to_pb(await self.core.score_group(req, context.time_remaining()))

        return await self._unary("ScoreGroup", context, run)

    async def ScoreBatch(self, request: pb.ScoreBatchRequest, context: Any) -> pb.ScoreBatchResponse:
        async def run() -> pb.ScoreBatchResponse:
            groups: list[GroupRequest | ErrorInfo] = []
            for i, g in enumerate(request.groups):
                try:
                    groups.append(convert.group_request_from_pb(g, prefix=f"groups[{i}]."))
                except InvalidArgument as exc:
                    groups.append(exc.info())
            return convert.batch_to_pb(await self.core.score_batch(groups, context.time_remaining()))

        return await self._unary("ScoreBatch", context, run)

    async def Info(self, request: pb.InfoRequest, context: Any) -> pb.InfoResponse:
        async def run() -> pb.InfoResponse:
            return convert.info_to_pb(self.core.info())

        return await self._unary("Info", context, run)
