"""The fault soak, shortened (``bench/soak.py`` is the long run): two real server processes sharing one real Redis,
two concurrent ScoreBatch clients over a fixed set of groups; Redis is SIGKILLed and restarted, then one replica
is SIGKILLed and restarted. Nothing is lost, nothing outlives its deadline, scored items equal the undisturbed
greedy run, the cache written after the restart decodes, and no dialogue text reaches the logs. Each call's deadline
is at least 60 s, more where an undisturbed call on this machine is slow (a CI worker beside another: bench.soak)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.soak import run_soak

pytestmark = pytest.mark.integration
BACKEND = os.environ.get("COMPEER_SOAK_BACKEND", "transformers")


def test_soak_with_redis_and_replica_killed(tmp_path: Path) -> None:
    # single_pass (one generation per candidate) keeps the judging short enough for the suite; bench/soak.py soaks
    # the unified mode
    report = run_soak(tmp_path, backend=BACKEND, clients=2, groups=3, batch=1, duration_s=60, fault_at=[8, 14, 20],
                      deadline_s=60, mode="single_pass", start_timeout_s=300)
    fig = report.to_json()
    print(fig)
    assert not report.problems, fig
    assert report.lost == 0 and report.scored > 0 and report.mismatches == 0
    assert len(report.faults) == 4  # redis kill, redis restart, replica kill, replica restarted and ready
    assert report.cache_entries_checked > 0 and report.cache_entries_bad == 0
    assert report.max_call_over_deadline_s <= 2.0
    # the deadline follows this machine's measured speed and never drops below the one asked for
    assert report.calibration_s > 0 and report.deadline_s >= 60
