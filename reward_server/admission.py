"""Admission control in front of the judge: a bounded number of groups judged at once, a bounded FIFO of groups
waiting for a slot, and past that bound an immediate :class:`~reward_server.errors.Overloaded` carrying a retry
hint, so an overloaded replica tells callers to go elsewhere instead of growing its memory and latency.

One instance lives in the transport-neutral core, so both fronts shed the same way (HTTP 429 + ``Retry-After``,
gRPC RESOURCE_EXHAUSTED + ``compeer-retry-after-ms`` trailing metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator

from reward_server.errors import Overloaded
from reward_server.metrics import Metrics

#: weight of the newest judged group in the moving average of a slot's hold time
_EWMA_ALPHA = 0.2
#: retry hints are clamped to this range (seconds)
MIN_RETRY_S, MAX_RETRY_S = 1.0, 60.0


class Admission:
    """``max_in_flight`` groups hold a judge slot at once; at most ``max_waiting`` more wait for one (FIFO,
    ``None``: no bound, the behaviour without shedding). A group arriving when both are full is refused at once.

    A waiting group that reaches its deadline leaves the queue (its request's timeout cancels the wait), so
    queued work that can no longer finish in time never reaches the engine.
    """

    def __init__(self, max_in_flight: int, max_waiting: int | None, metrics: Metrics) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight {max_in_flight}: expected >= 1")
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting {max_waiting}: expected >= 0 (or None for no bound)")
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self._slots = asyncio.Semaphore(max_in_flight)
        self._in_flight = 0
        self._waiting = 0
        self._hold_s: float | None = None  # moving average of how long a group holds a slot
        self._metrics = metrics
        metrics.admission_in_flight.set_function(lambda: float(self._in_flight))
        metrics.admission_waiting.set_function(lambda: float(self._waiting))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return self._waiting

    def retry_after_s(self) -> float:
        """When a refused caller should try again: the time the current queue needs to drain, from the moving
        average of slot hold times (whole seconds, clamped to [1, 60]; 1 before any group finished)."""
        if self._hold_s is None:
            return MIN_RETRY_S
        drain = self._hold_s * (self._waiting + 1) / self.max_in_flight
        return float(min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil(drain))))

    def _full(self) -> bool:
        busy = self._in_flight >= self.max_in_flight or self._waiting > 0
        return busy and self.max_waiting is not None and self._waiting >= self.max_waiting

    @contextlib.asynccontextmanager
    async def slot(self, field: str = "") -> AsyncIterator[None]:
        """Hold one judge slot for the body of the ``async with``; wait for it in FIFO order, or raise
        :class:`Overloaded` (counted in ``compeer_shed_groups_total``) when the waiting room is full."""
        if self._full():
            self._metrics.shed.labels("queue_full").inc()
            hint = self.retry_after_s()
            raise Overloaded(f"the server is overloaded: {self._in_flight} groups are being judged and "
                             f"{self._waiting} are waiting (the limit is {self.max_waiting}); retry in {hint:.0f} s "
                             "or on another replica", field, retry_after_s=hint)
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._in_flight += 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._in_flight -= 1
            self._slots.release()
            held = time.monotonic() - t0
            self._hold_s = held if self._hold_s is None else (1 - _EWMA_ALPHA) * self._hold_s + _EWMA_ALPHA * held
