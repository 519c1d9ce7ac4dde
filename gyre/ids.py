"""String ids for the core's integer executions, groups and queries, defined once.

The policy core numbers executions and groups with integers; the data plane
(trajectory buffer, proxy keys and routes, record logs, task ids) names them
with strings. Every conversion goes through these functions.

Invariant: distinct integers give distinct ids, and the three kinds never
collide (each has its own one-letter prefix).
"""

from __future__ import annotations


def execution_id(execution: int) -> str:
    return f"x{execution}"


def group_id(group: int) -> str:
    return f"g{group}"


def query_id(group: int) -> str:
    """The task a group's executions run (one query per group)."""
    return f"q{group}"
