"""Prometheus metrics of the reward service (prefix ``compeer_``, unit suffixes, bounded labels).

Each server owns its registry so several servers can live in one process (tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from reward_server.error_codes import ErrorCode

log = logging.getLogger(__name__)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """All series the service exports. Label values are drawn from fixed sets (method, code, component, reason)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("compeer_requests_total", "Requests by front, method and result code.",
                                ["transport", "method", "code"], registry=r)
        self.request_latency = Histogram("compeer_request_duration_seconds", "End-to-end request latency.",
                                         ["transport", "method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.judge_latency = Histogram("compeer_judge_duration_seconds", "Judge time of one (uncached) candidate.",
                                       ["mode"], buckets=_LATENCY_BUCKETS, registry=r)
        self.judge_rounds = Counter("compeer_judge_rounds_total", "Engine generations for judging, retries included.",
                                    ["mode"], registry=r)
        self.candidates = Counter("compeer_candidates_total", "Candidates scored, by status.", ["status"], registry=r)
        self.parse_failures = Counter("compeer_parse_failures_total",
                                      "Components left unparsable after retries.", ["component"], registry=r)
        self.cache_hits = Counter("compeer_cache_hits_total", "Candidate results served from the cache.", registry=r)
        self.cache_misses = Counter("compeer_cache_misses_total", "Cacheable candidates not in the cache.", registry=r)
        self.auth_failures = Counter("compeer_auth_failures_total", "Calls refused for a missing, malformed or "
                                     "wrong bearer token.", ["transport", "reason"], registry=r)
        self.cache_errors = Counter("compeer_cache_errors_total", "Cache backend failures (served uncached).",
                                    ["op"], registry=r)
        self.queue_depth = Gauge("compeer_engine_queue_depth", "Generations waiting or running in the engine.",
                                 registry=r)
        self.in_flight = Gauge("compeer_in_flight_requests", "Requests being served.", registry=r)
        self.shed = Counter("compeer_shed_groups_total", "Groups refused by admission control (HTTP 429, gRPC "
                            "RESOURCE_EXHAUSTED).", ["reason"], registry=r)
        self.admission_in_flight = Gauge("compeer_admission_in_flight_groups", "Groups holding a judge slot.",
                                         registry=r)
        self.admission_waiting = Gauge("compeer_admission_waiting_groups", "Groups waiting for a judge slot.",
                                       registry=r)
        self.failures = Counter("compeer_request_failures_total", "Failed requests by reason.", ["reason"], registry=r)

    @contextlib.contextmanager
    def track(self, transport: str, method: str) -> Iterator[None]:
        """Count a request, its latency and the in-flight gauge; the code label comes from the error table.

        Any exception that is not a :class:`ServiceError` is logged and re-raised as ``Internal``.
        """
        from reward_server.errors import Internal, ServiceError

        code = "OK"
        self.in_flight.inc()
        start = time.perf_counter()
        try:
            yield
        except ServiceError as exc:
            code = exc.code.value
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as exc:
            code = ErrorCode.INTERNAL.value
            log.exception("unhandled error in %s %s", transport, method)
            raise Internal(f"internal error: {type(exc).__name__}") from exc
        finally:
            self.in_flight.dec()
            self.request_latency.labels(transport, method).observe(time.perf_counter() - start)
            self.requests.labels(transport, method, code).inc()

    def render(self) -> bytes:
        """The text exposition format for ``GET /metrics``."""
        return generate_latest(self.registry)
