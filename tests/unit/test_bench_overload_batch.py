"""bench/overload_batch.py's tally of one ``score:batch`` answer (the server run itself is the benchmark)."""

from __future__ import annotations

from bench.overload_batch import count


def test_candidates_are_counted_by_status_and_a_shed_group_counts_all_its_candidates() -> None:
    answer = {"groups": [
        {"results": [{"status": "ok"}, {"status": "timeout"}, {"status": "ok"}]},
        {"error": {"code": "RESOURCE_EXHAUSTED", "field": "groups[1]", "message": "m"}},
        {"error": {"code": "DEADLINE_EXCEEDED", "field": "groups[2]", "message": "m"}},
    ]}
    assert count(answer, 3) == {"ok": 2, "timeout": 1, "shed": 3, "deadline_exceeded": 3}
