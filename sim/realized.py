"""The workload profile as a simulated run realized it (reported in ``summary.json``).

The paper's profile figures (docs/workload.md: mean execution and query
durations, the share of queries past 4 h, timeout rates) were measured under
the runs' real load; a trace preset must reproduce them as realized in the
simulated default run, not as trace durations (docs/simulator.md section 3).

Which executions count: every execution that ended on its own (not
cancelled) and started early enough that even the longest one could have
ended before the run stopped (``start_s <= end_s - longest``, ``longest`` the
trace's longest duration): later starts are censored (only their short ones
would be seen), which would bias the means down. A query counts when all its
designated executions count; its duration is its slowest execution's, from
its own start (the group's slowest of N).

Invariants: rates are shares of the counted executions; every figure is None
when nothing is counted; the result is a pure function of the record.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

HOUR_S = 3600.0
LONG_QUERY_H = 4.0


def realized_profile(record: Any, group_size: int, N: int, longest_s: float) -> dict[str, Any]:
    """Realized mean execution and query hours, share of queries past 4 h, timeout rates."""
    cutoff = record.end_s - longest_s
    per_group: dict[int, list[tuple[float, str]]] = defaultdict(list)
    censored: set[int] = set()
    for row in record.executions.values():
        g = row["group_id"]
        if row["execution"] - g * group_size >= N or row["outcome"] == "cancelled":
            continue  # oversampled surplus, or no duration of its own
        if row["start_s"] > cutoff or row["end_s"] is None:
            censored.add(g)
            continue
        per_group[g].append((row["end_s"] - row["start_s"], row["outcome"]))
    durations = [d for rows in per_group.values() for d, _ in rows]
    outcomes = [o for rows in per_group.values() for _, o in rows]
    queries = [max(d for d, _ in rows) for g, rows in per_group.items() if g not in censored and len(rows) == N]
    if not durations:
        return {"executions": 0, "queries": 0, "mean_execution_h": None, "mean_query_h": None,
                "queries_over_4h": None, "harness_timeout_rate": None, "overall_timeout_rate": None}
    return {
        "executions": len(durations), "queries": len(queries),
        "mean_execution_h": round(sum(durations) / len(durations) / HOUR_S, 6),
        "mean_query_h": round(sum(queries) / len(queries) / HOUR_S, 6) if queries else None,
        "queries_over_4h": round(sum(q > LONG_QUERY_H * HOUR_S for q in queries) / len(queries), 6)
        if queries else None,
        "harness_timeout_rate": round(outcomes.count("harness_timeout") / len(outcomes), 6),
        "overall_timeout_rate": round(outcomes.count("overall_timeout") / len(outcomes), 6),
    }
