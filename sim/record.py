"""What a simulation run records, and the tables it writes.

Tables (one CSV each, written by ``write_tables``):
- ``events.csv``: every event the policy core received, in order (replayable);
- ``steps.csv``: step, start_s, end_s, duration_s, training_cells_max, published;
- ``groups.csv``: group_id, query_id, v_d, v_t, staleness, dispatched_at_s,
  ready_at_s, consumed_at_s, consumed_step, tokens, participants (designated
  executions whose rewards enter the advantages), excluded (designated
  executions without a valid reward; both count in the batch's B x N),
  dropped_at_s (the group could never complete and was replaced);
- ``roles.csv``: cell, role, start_s, end_s (one row per interval);
- ``executions.csv``: execution, group_id, engine, start_s, end_s, outcome, reroutes.

``SimRecord.log`` is the driver loop's ``EventLog`` (events and actions);
the rest are the cluster facts only the simulator knows.

An execution's row is kept as a list in ``EXECUTION_FIELDS`` order (one
per started execution, built and written by the driver on its hot path:
``execution_row`` at the start, its ``END``/``OUTCOME`` slots at the finish), and
``executions`` gives them as dicts keyed by those names (``harness_end_s``
after them where the harness stopped early): built afresh at each read
while the run goes on, and once, then kept, after ``close``.

Invariants: rows are in a deterministic order (by id or by time of record),
floats are written with fixed formatting, so equal runs give equal bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gyre.config import SchedulerConfig
from gyre.formats.eventlog import EventLog
from gyre.formats.tables import write_csv
from gyre.staleness import group_staleness

#: an execution's row, in the order of its list and of executions.csv's columns
EXECUTION_FIELDS = ("execution", "group_id", "engine", "start_s", "end_s", "outcome", "reroutes")
START, ENGINE, END, OUTCOME, REROUTES, HARNESS_END = 3, 2, 4, 5, 6, 7  # positions in a row's list


def execution_row(x: int, g: int, engine: int, now: float) -> list[Any]:
    """A started execution's row (``EXECUTION_FIELDS``): no end or outcome yet, never rerouted.

    ``start_s`` becomes a float when the row is read (``SimRecord.executions``), not here."""
    return [x, g, engine, now, None, None, 0]


class SimRecord:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.log = EventLog()
        self.groups: dict[int, dict[str, Any]] = {}
        self.execution_rows: dict[int, list[Any]] = {}  # x -> its row (EXECUTION_FIELDS, then harness_end_s)
        self._closed_executions: dict[int, dict[str, Any]] | None = None  # ``executions``, once closed
        self._closed = False
        self.roles: list[dict[str, Any]] = []
        self.steps: dict[int, dict[str, Any]] = {}
        self._current_role: dict[int, tuple[str, float]] = {}
        self._training: set[int] = set()
        for cell in range(cfg.K):
            role = "training" if cell < cfg.static_train_cells else "rollout"
            self._current_role[cell] = (role, 0.0)
            if role == "training":
                self._training.add(cell)
        self.end_s = 0.0
        self.publications: list[list[float | None]] = []  # [start_s, end_s] of each publication

    # ---- cluster facts -------------------------------------------------------------
    def group_dispatched(self, g: int, query_id: Any, v_d: int, now: float, tokens: float) -> None:
        self.groups[g] = {"group_id": g, "query_id": query_id, "v_d": v_d, "v_t": None, "staleness": None,
                          "dispatched_at_s": float(now), "ready_at_s": None, "consumed_at_s": None,
                          "consumed_step": None, "tokens": tokens, "participants": None, "excluded": None,
                          "dropped_at_s": None}

    def group_ready(self, g: int, now: float, participants: int, excluded: int) -> None:
        row = self.groups[g]  # once per group: plain stores, not update(**kw)
        row["ready_at_s"] = now
        row["participants"] = participants
        row["excluded"] = excluded

    def group_dropped(self, g: int, now: float) -> None:
        self.groups[g]["dropped_at_s"] = now

    def groups_fed(self, groups: tuple[int, ...], version: int, now: float) -> None:
        for g in groups:  # plain stores into keys the row has since its dispatch (their order unchanged)
            row = self.groups[g]
            row["v_t"] = version
            row["staleness"] = group_staleness(row["v_d"], version)
            row["consumed_at_s"] = now
            row["consumed_step"] = version

    def harness_stopped(self, x: int, now: float) -> None:
        """Its rollout slot is free from ``now`` (kept in memory as ``harness_end_s``, not in executions.csv)."""
        self.execution_rows[x].append(now)  # HARNESS_END

    def slot_interval(self, x: int) -> tuple[float, float | None]:
        """(start, end) of the rollout slot ``x`` held: until its harness stopped, else until it ended."""
        row = self.execution_rows[x]
        return float(row[START]), row[HARNESS_END] if len(row) > HARNESS_END else row[END]

    def reroute(self, x: int, source: int, dest: int, now: float) -> None:
        row = self.execution_rows[x]
        row[ENGINE] = dest
        row[REROUTES] += 1

    @property
    def executions(self) -> dict[int, dict[str, Any]]:
        """Execution -> its row as a dict (``EXECUTION_FIELDS``, then ``harness_end_s`` where it stopped early).

        Built from the rows at each read while the run goes on (a copy: changing it records nothing), and
        once after ``close``, then kept (nothing changes a closed record)."""
        if self._closed_executions is not None:
            return self._closed_executions
        rows = {}
        for x, row in self.execution_rows.items():
            out = dict(zip(EXECUTION_FIELDS, row))
            out["start_s"] = float(row[START])
            if len(row) > HARNESS_END:
                out["harness_end_s"] = row[HARNESS_END]
            rows[x] = out
        if self._closed:
            self._closed_executions = rows
        return rows

    def role(self, cell: int, role: str, now: float) -> None:
        previous, since = self._current_role[cell]
        self.roles.append({"cell": cell, "role": previous, "start_s": since, "end_s": now})
        self._current_role[cell] = (role, float(now))
        if role == "training":
            self._training.add(cell)
            for step in self.steps.values():
                if step["end_s"] is None:
                    step["training_cells_max"] = max(step["training_cells_max"], len(self._training))
        else:
            self._training.discard(cell)

    def step_started(self, version: int, now: float, training_cells: int) -> None:
        self.steps[version] = {"step": version, "start_s": float(now), "end_s": None,
                               "training_cells_max": max(training_cells, len(self._training)),
                               "published": False}

    def step_finished(self, version: int, now: float) -> None:
        self.steps[version]["end_s"] = now

    def publish_done(self, now: float) -> None:
        self.publications[-1][1] = now

    def published(self, version: int, now: float) -> None:
        self.publications.append([float(now), None])
        self.steps[version - 1]["published"] = True

    def close(self, now: float) -> None:
        """End every open role interval at ``now``."""
        self.end_s = now
        self._closed, self._closed_executions = True, None
        for cell, (role, since) in sorted(self._current_role.items()):
            self.roles.append({"cell": cell, "role": role, "start_s": since, "end_s": now})
        self._current_role = {cell: (role, now) for cell, (role, _) in self._current_role.items()}

    # ---- summaries -------------------------------------------------------------------
    def consumed_groups(self, steps: int | None = None) -> list[dict[str, Any]]:
        """Groups fed to a batch (of a step below ``steps``, when given)."""
        return [row for _, row in sorted(self.groups.items())
                if row["v_t"] is not None and (steps is None or row["v_t"] < steps)]

    def step_rows(self) -> list[dict[str, Any]]:
        rows = []
        for _, step in sorted(self.steps.items()):
            if step["end_s"] is not None:
                rows.append({**step, "duration_s": step["end_s"] - step["start_s"]})
        return rows


def write_tables(record: SimRecord, out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record.log.write_csv(out / "events.csv")
    write_csv(out / "steps.csv", ("step", "start_s", "end_s", "duration_s", "training_cells_max", "published"),
              record.step_rows())
    write_csv(out / "groups.csv", ("group_id", "query_id", "v_d", "v_t", "staleness", "dispatched_at_s",
                                   "ready_at_s", "consumed_at_s", "consumed_step", "tokens", "participants", "excluded",
                                   "dropped_at_s"),
              (row for _, row in sorted(record.groups.items())))
    write_csv(out / "roles.csv", ("cell", "role", "start_s", "end_s"),
              sorted(record.roles, key=lambda r: (r["cell"], r["start_s"], r["end_s"])))
    write_csv(out / "executions.csv", ("execution", "group_id", "engine", "start_s", "end_s", "outcome", "reroutes"),
              (row for _, row in sorted(record.executions.items())))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
