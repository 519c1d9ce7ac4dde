"""What a switch to training waits for: executions stuck at a ceiling, or still progressing.

For every switch to training (the cells that begin ``to_training`` at one
instant T: one cell for fine cells, a block, or every cell for a global
switch), from the record (docs/simulator.md section 6):

- ``outstanding_stuck``: executions running at T that end at a ceiling or a
  budget (outcome ``harness_timeout`` or ``overall_timeout``: the wall-clock
  deadline, not their progress, ends them);
- ``outstanding_progressing``: executions running at T that end by finishing
  their work (completed or failed) or are cancelled later;
- ``last_progress_s``: when the last execution that finished its own work
  before T ended (its start too, if none); ``stuck_tail_s = T -
  last_progress_s`` and ``stuck_in_tail``: how many executions that ended in
  that tail ended at a ceiling. A switch that waits for stragglers stuck at
  their ceiling shows a long tail full of them (Colocate, coarse blocks).

Invariants: counts are >= 0; ``stuck_tail_s >= 0``; one row per switch, in
time order; a pure function of the record.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

AT_A_LIMIT = ("harness_timeout", "overall_timeout")


def switch_waits(record: Any) -> list[dict[str, Any]]:
    """One row per switch to training (see the module docstring)."""
    switches: dict[float, list[int]] = defaultdict(list)
    for row in record.roles:
        if row["role"] == "to_training":
            switches[row["start_s"]].append(row["cell"])
    executions = [r for r in record.executions.values()]
    rows = []
    for t, cells in sorted(switches.items()):
        running = [r for r in executions if r["start_s"] <= t and (r["end_s"] is None or r["end_s"] > t)]
        ended = [r for r in executions if r["end_s"] is not None and r["end_s"] <= t]
        progressed = [r["end_s"] for r in ended if r["outcome"] not in AT_A_LIMIT and r["outcome"] != "cancelled"]
        last = max(progressed, default=0.0)
        rows.append({"at_s": round(t, 3), "cells": len(cells),
                     "outstanding_stuck": sum(r["outcome"] in AT_A_LIMIT for r in running),
                     "outstanding_progressing": sum(r["outcome"] not in AT_A_LIMIT for r in running),
                     "last_progress_s": round(last, 3), "stuck_tail_s": round(t - last, 3),
                     "stuck_in_tail": sum(r["outcome"] in AT_A_LIMIT and r["end_s"] > last for r in ended)})
    return rows


def switch_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over switches of more than one cell (blocks and global switches) and over all."""
    def totals(chosen: list[dict[str, Any]]) -> dict[str, Any]:
        return {"switches": len(chosen),
                "outstanding_stuck": sum(r["outstanding_stuck"] for r in chosen),
                "outstanding_progressing": sum(r["outstanding_progressing"] for r in chosen),
                "stuck_tail_s_mean": round(sum(r["stuck_tail_s"] for r in chosen) / len(chosen), 3)
                if chosen else None}
    return {"all": totals(rows), "blocks": totals([r for r in rows if r["cells"] > 1])}
