"""Typed async client of the reward service (grpc.aio), used by the GRPO trainer and the benchmarks.

Round-robin over several server addresses; a call that fails with UNAVAILABLE, or that a replica sheds for load
(RESOURCE_EXHAUSTED with a retry hint), is retried on the next address (bounded retries, jittered exponential
backoff; a replica that shed is not tried again before its hint), always within the call's deadline. A ScoreBatch
shed as a whole is not sent again whole: it is split in two halves, each sent on its own (to the next replicas), so
a batch larger than any replica takes at once is still judged in parts. Every other status is raised as
:class:`RewardCallError` at once (retrying INVALID_ARGUMENT would never help).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Self, TypeVar

import grpc

from reward_server.client_security import ClientSecurity
from reward_server.errors import RETRY_AFTER_KEY, ErrorCode, code_for_grpc_status
from reward_server.grpc import convert, dialogue_convert
from reward_server.proto import pb, pb_grpc
from reward_server.types import DialogueRequest, DialogueResponse, ErrorInfo, GroupRequest, GroupResponse, InfoResponse

__all__ = ["ClientSecurity", "RewardCallError", "RewardClient"]
T = TypeVar("T")
_MAX_MESSAGE = 256 * 1024 * 1024
#: group-level error codes inside a batch answer that another attempt (another replica, later) may fix
_RETRY_GROUP = frozenset({ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.UNAVAILABLE})


def _batch_call(msg: pb.ScoreBatchRequest) -> Callable[[pb_grpc.RewardServiceStub, float],
                                                       Awaitable[pb.ScoreBatchResponse]]:
    return lambda stub, t: stub.ScoreBatch(msg, timeout=t)  # type: ignore[no-any-return]


def _renumber(entry: GroupResponse | ErrorInfo, k: int, j: int) -> GroupResponse | ErrorInfo:
    """A sub-batch's entry ``k`` as the caller's group ``j``: an error's field ``groups[k]...`` names ``groups[j]``."""
    if isinstance(entry, ErrorInfo) and entry.field.startswith(f"groups[{k}]"):
        return ErrorInfo(entry.code, re.sub(r"^groups\[\d+\]", f"groups[{j}]", entry.field), entry.message)
    return entry


def _call_error(exc: RewardCallError, field: str) -> ErrorInfo:
    """A group's error from the call that carried it failing as a whole: the error table's code of its gRPC status
    (INTERNAL, with the status named in the message, for one no front sends for a domain error)."""
    code = code_for_grpc_status(exc.code)
    if code is None:
        return ErrorInfo(ErrorCode.INTERNAL, field, f"{exc.code.name}: {exc.details}")
    return ErrorInfo(code, field, exc.details)


def _retryable(entry: GroupResponse | ErrorInfo | None) -> bool:
    return isinstance(entry, ErrorInfo) and entry.code in _RETRY_GROUP


def _shed_hint(exc: grpc.aio.AioRpcError) -> float | None:
    """The retry hint (seconds) of a RESOURCE_EXHAUSTED from load shedding; None for any other answer (the
    transport's own RESOURCE_EXHAUSTED for an oversized message carries no hint and is not retried)."""
    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                return max(0.0, int(value) / 1000.0)
            except (TypeError, ValueError):
                return None
    return None


class RewardCallError(RuntimeError):
    """A reward RPC failed; ``code`` is the gRPC status code, ``details`` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str, address: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code.name} from {address}: {details}")
        self.code = code
        self.details = details
        self.address = address
        #: the server's retry hint when it shed the call for load (RESOURCE_EXHAUSTED), else None
        self.retry_after_s = retry_after_s


class RewardClient:
    """Async client for ``compeer.reward.v1.RewardService``.

    Args:
        addresses: ``host:port`` of one or more replicas (used round-robin), or gRPC targets such as
            ``dns:///compeer-reward-headless:50051`` (round-robin over every address the name resolves to).
        timeout_s: default deadline of a call, retries included.
        max_retries: extra attempts after a retryable answer (UNAVAILABLE, or RESOURCE_EXHAUSTED from the
            server's load shedding); each goes to the next replica.
        backoff_s: first backoff; doubles each retry, with jitter (x0.5-1.0), and never shorter than the retry
            hint of a replica that shed the call when that replica is tried again.
        security: bearer token and TLS settings of a secured service (default: plaintext, no token).
    """

    def __init__(self, addresses: Sequence[str] | str, *, timeout_s: float = 120.0, max_retries: int = 4,
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
        self._turn = 0  # the replica tried next (round-robin)
        self._cool_until = [0.0] * len(addrs)  # monotonic time before which a replica that shed is not retried
        self.retries = 0  # retried attempts over the client's life (calls and groups), for benchmarks and tests

    def _pick(self, advance: bool = True) -> int:
        """The next replica in turn that is not cooling down after shedding (the soonest ready if all are)."""
        now, n = time.monotonic(), len(self.addresses)
        order = [(self._turn + k) % n for k in range(n)]
        ready = [i for i in order if self._cool_until[i] <= now]
        i = ready[0] if ready else min(order, key=lambda j: self._cool_until[j])
        if advance:
            self._turn = (i + 1) % n
        return i

    def _backoff(self, attempt: int) -> float:
        return self.backoff_s * (2**attempt) * random.uniform(0.5, 1.0)

    async def _wait(self, attempt: int, deadline: float) -> bool:
        """Sleep before retry ``attempt``; False when the deadline leaves no time for another attempt."""
        i = self._pick(advance=False)
        pause = max(self._backoff(attempt), self._cool_until[i] - time.monotonic())
        if time.monotonic() + pause >= deadline:
            return False
        await asyncio.sleep(pause)
        self.retries += 1
        return True

    async def _call(self, fn: Callable[[pb_grpc.RewardServiceStub, float], Awaitable[T]],
                    timeout_s: float | None, deadline: float | None = None) -> T:
        return (await self._call_on(fn, timeout_s, deadline))[0]

    async def _call_on(self, fn: Callable[[pb_grpc.RewardServiceStub, float], Awaitable[T]],
                       timeout_s: float | None, deadline: float | None = None,
                       retry_shed: bool = True) -> tuple[T, int]:
        """``fn`` on one replica after another until it answers; the answer and the replica that gave it.
        ``retry_shed`` False: a call shed for load is raised at once (with its hint) instead of sent again."""
        deadline = deadline if deadline is not None else \
            time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        attempt = 0
        while True:
            i = self._pick()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RewardCallError(grpc.StatusCode.DEADLINE_EXCEEDED, "client deadline passed before a reply",
                                      self.addresses[i])
            try:
                return await fn(self._stubs[i], remaining), i
            except grpc.aio.AioRpcError as exc:
                hint = _shed_hint(exc)
                if hint is not None:
                    self._cool_until[i] = time.monotonic() + hint
                retryable = exc.code() == grpc.StatusCode.UNAVAILABLE or (hint is not None and retry_shed)
                if not retryable or attempt >= self.max_retries or not await self._wait(attempt, deadline):
                    raise RewardCallError(exc.code(), exc.details() or "", self.addresses[i], hint) from exc
            attempt += 1

    async def score_group(self, request: GroupRequest, timeout_s: float | None = None) -> GroupResponse:
        """Score one group; raises :class:`RewardCallError` on a group-level error (e.g. INVALID_ARGUMENT)."""
        msg = convert.group_request_to_pb(request)
        reply = await self._call(lambda stub, t: stub.ScoreGroup(msg, timeout=t), timeout_s)
        return convert.group_response_from_pb(reply)

    async def score_batch(self, groups: Sequence[GroupRequest],
                          timeout_s: float | None = None) -> list[GroupResponse | ErrorInfo]:
        """Score many groups in one call; each entry is the group's response or its own error.

        A call shed as a whole (RESOURCE_EXHAUSTED with a retry hint: the replica admitted none of its groups) is
        split in two halves, sent apart to the next replicas, and so on down to single groups. Groups a replica
        refused for load or readiness (RESOURCE_EXHAUSTED / UNAVAILABLE entries) while others in the batch were
        scored are sent again, to the next replica. All of it within the same deadline and at most ``max_retries``
        retries on any group's path; what is still refused then is returned as that group's error. Raises
        :class:`RewardCallError` when the first, whole call fails otherwise (e.g. INVALID_ARGUMENT).
        """
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        out: list[GroupResponse | ErrorInfo | None] = [None] * len(groups)
        await self._send_batch(groups, list(range(len(groups))), out, deadline, 0)
        return [o if o is not None else ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, f"groups[{j}]", "no answer")
                for j, o in enumerate(out)]

    async def _send_batch(self, groups: Sequence[GroupRequest], idx: list[int],
                          out: list[GroupResponse | ErrorInfo | None], deadline: float, attempt: int) -> None:
        """Send ``groups[j] for j in idx`` as one ScoreBatch; put each answer at ``out[j]`` (see :meth:`score_batch`)."""
        try:
            reply, i = await self._call_on(_batch_call(pb.ScoreBatchRequest(
                groups=[convert.group_request_to_pb(groups[j]) for j in idx])), None, deadline, retry_shed=False)
        except RewardCallError as exc:
            if attempt == 0 and exc.retry_after_s is None:
                raise  # the caller's whole batch failed for another reason than load
            if exc.retry_after_s is None or attempt >= self.max_retries or not await self._wait(attempt, deadline):
                for j in idx:
                    out[j] = _call_error(exc, f"groups[{j}]")
                return
            # shed as a whole: that replica cools down for its hint; the halves go to the next ones
            half = (len(idx) + 1) // 2
            await asyncio.gather(*(self._send_batch(groups, part, out, deadline, attempt + 1)
                                   for part in (idx[:half], idx[half:]) if part))
            return
        for k, (j, o) in enumerate(zip(idx, convert.batch_from_pb(reply))):
            out[j] = _renumber(o, k, j)
        pending = [j for j in idx if _retryable(out[j])]
        if pending:  # that replica is full: the refused groups go to another one first
            self._cool_until[i] = max(self._cool_until[i], time.monotonic() + self._backoff(attempt))
            if attempt < self.max_retries and await self._wait(attempt, deadline):
                await self._send_batch(groups, pending, out, deadline, attempt + 1)

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
