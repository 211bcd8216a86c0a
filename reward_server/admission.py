"""Admission control in front of the judge: a bounded amount of work judged at once, a bounded FIFO of groups
waiting for it, and past that bound an immediate :class:`~reward_server.errors.Overloaded` carrying a retry
hint, so an overloaded replica tells callers to go elsewhere instead of growing its memory and latency.

Work, not only groups: with a ``window_s``, what is in flight is bounded by the work the engine finishes in that
many seconds at its measured rate (:mod:`reward_server.workload`), so what is admitted finishes in order and in
time instead of all of it sharing the engine and missing the deadline together; a group whose estimated finish
(the work ahead of it, then its own) falls past its deadline is refused at once rather than judged in vain.

One instance lives in the transport-neutral core, so both fronts shed the same way (HTTP 429 + ``Retry-After``,
gRPC RESOURCE_EXHAUSTED + ``compeer-retry-after-ms`` trailing metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from reward_server.errors import Overloaded
from reward_server.metrics import Metrics
from reward_server.workload import Throughput

#: weight of the newest judged group in the moving average of a slot's hold time
_EWMA_ALPHA = 0.2
#: retry hints are clamped to this range (seconds)
MIN_RETRY_S, MAX_RETRY_S = 1.0, 60.0


@dataclass
class _Waiter:
    """A group waiting for admission: its estimated cost, its deadline (monotonic) and the future that admits it."""

    cost: float
    deadline: float | None
    field: str
    admitted: asyncio.Future[None] = dataclass_field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Admission:
    """At most ``max_in_flight`` groups hold a judge slot at once and, with ``window_s`` > 0, at most the work the
    engine finishes in ``window_s`` seconds at its measured rate (a group always starts on an idle engine; until
    the rate is measured, one group at a time). At most ``max_waiting`` more wait (FIFO: the earliest admitted
    starts first; ``None``: no bound, the behaviour without shedding). A group arriving when the waiting room is
    full is refused at once; with ``window_s`` a group that cannot finish before its deadline is refused too, on
    arrival or when its turn comes (shed reason ``deadline``).

    A waiting group that reaches its deadline leaves the queue (its request's timeout cancels the wait), so
    queued work that can no longer finish in time never reaches the engine.
    """

    def __init__(self, max_in_flight: int, max_waiting: int | None, metrics: Metrics, window_s: float = 0.0) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight {max_in_flight}: expected >= 1")
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting {max_waiting}: expected >= 0 (or None for no bound)")
        if window_s < 0:
            raise ValueError(f"window_s {window_s}: expected >= 0 seconds (0: count groups only)")
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self.window_s = window_s
        self.throughput = Throughput()
        self._queue: deque[_Waiter] = deque()
        self._in_flight = 0
        self._in_flight_cost = 0.0
        self._hold_s: float | None = None  # moving average of how long a group holds a slot
        self._metrics = metrics
        metrics.admission_in_flight.set_function(lambda: float(self._in_flight))
        metrics.admission_waiting.set_function(lambda: float(len(self._queue)))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _ahead_s(self) -> float | None:
        """Seconds the engine needs for what is in flight and waiting, at its measured rate (None: not measured,
        or admission by count only)."""
        rate = self.throughput.rate
        if not self.window_s or rate is None:
            return None
        return (self._in_flight_cost + sum(w.cost for w in self._queue)) / rate

    def retry_after_s(self) -> float:
        """When a refused caller should try again: the time the current queue needs to drain (from the measured
        rate with ``window_s``, else from the moving average of slot hold times), whole seconds clamped to
        [1, 60]; 1 before any group finished."""
        drain = self._ahead_s()
        if drain is None:
            if self._hold_s is None:
                return MIN_RETRY_S
            drain = self._hold_s * (len(self._queue) + 1) / self.max_in_flight
        return float(min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil(drain))))

    def _full(self) -> bool:
        busy = self._in_flight >= self.max_in_flight or bool(self._queue)
        return busy and self.max_waiting is not None and len(self._queue) >= self.max_waiting

    def _fits(self, cost: float) -> bool:
        if self._in_flight >= self.max_in_flight:
            return False
        if self._in_flight == 0 or not self.window_s:
            return True
        rate = self.throughput.rate
        return rate is not None and self._in_flight_cost + cost <= rate * self.window_s

    def _late(self, cost: float, deadline: float | None, waiting: bool) -> bool:
        """With ``window_s``: the group would finish past ``deadline`` at the measured rate (everything in flight,
        and with ``waiting`` everything queued, is finished first or alongside)."""
        rate = self.throughput.rate
        if not self.window_s or deadline is None or rate is None:
            return False
        ahead = self._in_flight_cost + (sum(w.cost for w in self._queue) if waiting else 0.0)
        return time.monotonic() + (ahead + cost) / rate > deadline

    def _refuse_late(self, cost: float, field: str) -> Overloaded:
        self._metrics.shed.labels("deadline").inc()
        hint = self.retry_after_s()
        rate = self.throughput.rate or 1.0
        return Overloaded(f"the server cannot judge this group within its deadline: about {cost / rate:.0f} s of "
                          f"judging behind {self._in_flight} groups in flight and {len(self._queue)} waiting; retry "
                          f"in {hint:.0f} s, on another replica, or with a longer deadline", field, retry_after_s=hint)

    def _start(self, cost: float) -> None:
        self._in_flight += 1
        self._in_flight_cost += cost
        self.throughput.started()

    def _wake(self) -> None:
        """Admit waiting groups in order while the head fits; a head that can no longer finish in time is refused."""
        while self._queue:
            head = self._queue[0]
            if head.admitted.done():  # its caller gave up (cancelled) meanwhile
                self._queue.popleft()
                continue
            if self._late(head.cost, head.deadline, waiting=False):
                self._queue.popleft()
                head.admitted.set_exception(self._refuse_late(head.cost, head.field))
                continue
            if not self._fits(head.cost):
                return
            self._queue.popleft()
            self._start(head.cost)
            head.admitted.set_result(None)

    @contextlib.asynccontextmanager
    async def slot(self, field: str = "", cost: float = 1.0, deadline: float | None = None) -> AsyncIterator[None]:
        """Hold a judge slot for ``cost`` work units for the body of the ``async with``; wait for it in FIFO order,
        or raise :class:`Overloaded` (counted in ``compeer_shed_groups_total``) when the waiting room is full or,
        with ``window_s``, when the group cannot finish before ``deadline`` (``time.monotonic()`` seconds)."""
        if self._full():
            self._metrics.shed.labels("queue_full").inc()
            hint = self.retry_after_s()
            raise Overloaded(f"the server is overloaded: {self._in_flight} groups are being judged and "
                             f"{len(self._queue)} are waiting (the limit is {self.max_waiting}); retry in {hint:.0f} "
                             "s or on another replica", field, retry_after_s=hint)
        if self._late(cost, deadline, waiting=True):
            raise self._refuse_late(cost, field)
        if not self._queue and self._fits(cost):
            self._start(cost)
        else:
            waiter = _Waiter(cost, deadline, field)
            self._queue.append(waiter)
            try:
                await waiter.admitted
            except asyncio.CancelledError:
                if waiter.admitted.done() and not waiter.admitted.cancelled() and waiter.admitted.exception() is None:
                    self._release(cost, t0=None, completed=False)  # admitted just as its caller gave up
                else:
                    with contextlib.suppress(ValueError):
                        self._queue.remove(waiter)
                    self._wake()
                raise
        t0 = time.monotonic()
        completed = False
        try:
            yield
            completed = True
        finally:
            self._release(cost, t0, completed)

    def _release(self, cost: float, t0: float | None, completed: bool) -> None:
        self._in_flight -= 1
        self._in_flight_cost = max(0.0, self._in_flight_cost - cost)
        self.throughput.finished(cost, completed)
        if t0 is not None:
            held = time.monotonic() - t0
            self._hold_s = held if self._hold_s is None else (1 - _EWMA_ALPHA) * self._hold_s + _EWMA_ALPHA * held
        self._wake()
