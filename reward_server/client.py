"""Typed async client of the reward service (grpc.aio), used by the GRPO trainer and the benchmarks.

Round-robin over several server addresses; a call that fails with UNAVAILABLE is retried on the next address
(bounded retries, exponential backoff), always within the call's deadline. Every other status is raised as
:class:`RewardCallError` at once (retrying INVALID_ARGUMENT would never help).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Self, TypeVar

import grpc

from reward_server.client_security import ClientSecurity
from reward_server.grpc import convert, dialogue_convert
from reward_server.proto import pb, pb_grpc
from reward_server.types import DialogueRequest, DialogueResponse, ErrorInfo, GroupRequest, GroupResponse, InfoResponse

__all__ = ["ClientSecurity", "RewardCallError", "RewardClient"]
T = TypeVar("T")
_MAX_MESSAGE = 256 * 1024 * 1024


class RewardCallError(RuntimeError):
    """A reward RPC failed; ``code`` is the gRPC status code, ``details`` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str, address: str) -> None:
        super().__init__(f"{code.name} from {address}: {details}")
        self.code = code
        self.details = details
        self.address = address


class RewardClient:
    """Async client for ``compeer.reward.v1.RewardService``.

    Args:
        addresses: ``host:port`` of one or more replicas (used round-robin), or gRPC targets such as
            ``dns:///compeer-reward-headless:50051`` (round-robin over every address the name resolves to).
        timeout_s: default deadline of a call, retries included.
        max_retries: extra attempts after an UNAVAILABLE answer.
        backoff_s: first backoff; doubles each retry.
        security: bearer token and TLS settings of a secured service (default: plaintext, no token).
    """

    def __init__(self, addresses: Sequence[str] | str, *, timeout_s: float = 120.0, max_retries: int = 3,
                 backoff_s: float = 0.2, security: ClientSecurity | None = None) -> None:
        addrs = [addresses] if isinstance(addresses, str) else list(addresses)
        if not addrs:
            raise ValueError("RewardClient: at least one server address is required")
        self.addresses = addrs
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        # round_robin: a "dns:///reward-headless:50051" address spreads calls over every pod behind the name and
        # follows replicas as they come and go; a plain host:port behaves as one server.
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE),
                   ("grpc.lb_policy_name", "round_robin")]
        self._channels = [(security or ClientSecurity()).channel(a, options) for a in addrs]
        self._stubs = [pb_grpc.RewardServiceStub(c) for c in self._channels]
        self._next = itertools.cycle(range(len(addrs)))

    async def _call(self, fn: Callable[[pb_grpc.RewardServiceStub, float], Awaitable[T]],
                    timeout_s: float | None) -> T:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        attempt = 0
        while True:
            i = next(self._next)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RewardCallError(grpc.StatusCode.DEADLINE_EXCEEDED, "client deadline passed before a reply",
                                      self.addresses[i])
            try:
                return await fn(self._stubs[i], remaining)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt >= self.max_retries:
                    raise RewardCallError(exc.code(), exc.details() or "", self.addresses[i]) from exc
            pause = min(self.backoff_s * (2**attempt), max(0.0, deadline - time.monotonic()))
            attempt += 1
            await asyncio.sleep(pause)

    async def score_group(self, request: GroupRequest, timeout_s: float | None = None) -> GroupResponse:
        """Score one group; raises :class:`RewardCallError` on a group-level error (e.g. INVALID_ARGUMENT)."""
        msg = convert.group_request_to_pb(request)
        reply = await self._call(lambda stub, t: stub.ScoreGroup(msg, timeout=t), timeout_s)
        return convert.group_response_from_pb(reply)

    async def score_batch(self, groups: Sequence[GroupRequest],
                          timeout_s: float | None = None) -> list[GroupResponse | ErrorInfo]:
        """Score many groups in one call; each entry is the group's response or its own error."""
        msg = pb.ScoreBatchRequest(groups=[convert.group_request_to_pb(g) for g in groups])
        reply = await self._call(lambda stub, t: stub.ScoreBatch(msg, timeout=t), timeout_s)
        return convert.batch_from_pb(reply)

    async def score_dialogue(self, request: DialogueRequest, timeout_s: float | None = None) -> DialogueResponse:
        """Score every supporter turn of a dialogue; raises :class:`RewardCallError` on a dialogue-level error."""
        msg = dialogue_convert.dialogue_request_to_pb(request)
        reply = await self._call(lambda stub, t: stub.ScoreDialogue(msg, timeout=t), timeout_s)
        return dialogue_convert.dialogue_response_from_pb(reply)

    async def info(self, timeout_s: float | None = None) -> InfoResponse:
        """Model, versions, limits and configuration of a server."""
        reply = await self._call(lambda stub, t: stub.Info(pb.InfoRequest(), timeout=t), timeout_s)
        return convert.info_from_pb(reply)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
