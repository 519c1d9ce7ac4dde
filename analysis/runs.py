"""Simulator outputs as pandas tables: one ``Run`` per ``gyre sim --out`` folder.

A run folder holds ``steps.csv``, ``groups.csv``, ``roles.csv``,
``executions.csv``, ``events.csv`` and ``summary.json`` (see
``gyre.sim.record``). ``load_run(dir)`` reads them; ``run_from_result(result)``
builds the same tables from an in-memory ``SimResult`` without touching the
disk, so analysis code never cares where a run came from.

Invariants of a ``Run``:
- every table has exactly the columns of ``COLUMNS`` (an absent file gives an
  empty table with those columns);
- blank cells (a group never consumed, an execution still running at the end)
  are NaN; times are float seconds since the run began;
- ``end_s`` is the time the run stopped: the latest role-interval end, else the
  latest step end, else 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

COLUMNS: dict[str, tuple[str, ...]] = {
    "steps": ("step", "start_s", "end_s", "duration_s", "training_cells_max", "published"),
    "groups": ("group_id", "query_id", "v_d", "v_t", "staleness", "dispatched_at_s", "ready_at_s",
               "consumed_at_s", "consumed_step", "tokens"),
    "roles": ("cell", "role", "start_s", "end_s"),
    "executions": ("execution", "group_id", "engine", "start_s", "end_s", "outcome", "reroutes"),
    "events": ("seq", "kind", "now", "execution", "outcome", "group", "cell", "role", "version"),
}


@dataclass
class Run:
    """The tables of one simulation run, plus its summary dict."""

    steps: pd.DataFrame
    groups: pd.DataFrame
    roles: pd.DataFrame
    executions: pd.DataFrame
    events: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def end_s(self) -> float:
        for table, column in ((self.roles, "end_s"), (self.steps, "end_s")):
            if len(table) and table[column].notna().any():
                return float(table[column].max())
        return 0.0

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.summary.get("config", {}))


def _frame(rows: Any, columns: tuple[str, ...]) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        frame = rows.reindex(columns=list(columns)).reset_index(drop=True)
    else:
        frame = pd.DataFrame(list(rows), columns=list(columns))
    return frame.mask(frame.eq("")).infer_objects()


def make_run(name: str = "", summary: dict[str, Any] | None = None, **tables: Any) -> Run:
    """A Run from row dicts or DataFrames per table name; missing tables are empty.

    Used by tests to build tiny hand-made runs.
    """
    unknown = set(tables) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown tables {sorted(unknown)}; known: {', '.join(COLUMNS)}")
    frames = {key: _frame(tables.get(key, []), columns) for key, columns in COLUMNS.items()}
    for key in ("groups", "executions", "roles", "steps"):
        frames[key] = _numeric(frames[key], skip=("role", "outcome", "query_id", "published"))
    return Run(**frames, summary=dict(summary or {}), name=name)


def _numeric(frame: pd.DataFrame, skip: tuple[str, ...]) -> pd.DataFrame:
    out = frame.copy()
    for column in out.columns:
        if column not in skip:
            out[column] = pd.to_numeric(out[column], errors="coerce")
    return out


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a ``gyre sim --out`` folder; a missing folder raises FileNotFoundError."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no run folder at {path}")
    tables = {}
    for key, columns in COLUMNS.items():
        csv_path = path / f"{key}.csv"
        tables[key] = pd.read_csv(csv_path) if csv_path.exists() else pd.DataFrame(columns=list(columns))
    summary_path = path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return make_run(name=name or path.name, summary=summary, **tables)


def run_from_result(result: Any, name: str | None = None) -> Run:
    """The tables of an in-memory ``gyre.sim.runner.SimResult``, as ``load_run`` would read them."""
    record = result.record
    return make_run(
        name=name or str(result.summary.get("preset", "")),
        summary=result.summary,
        steps=record.step_rows(),
        groups=[row for _, row in sorted(record.groups.items())],
        roles=sorted(record.roles, key=lambda r: (r["cell"], r["start_s"], r["end_s"])),
        executions=[row for _, row in sorted(record.executions.items())],
        events=record.log.rows,
    )


def consumed_groups(run: Run) -> pd.DataFrame:
    """Groups fed to a batch, in group-id order (rows with a staleness)."""
    groups = run.groups
    return groups[groups["staleness"].notna()].sort_values("group_id").reset_index(drop=True)
