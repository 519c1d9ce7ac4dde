"""A resumed run's trace as its lineage lived it: what the simulator must replay to predict that run.

A real run's ``trace.csv`` holds each execution's true duration (``runtime.trace``):
for a harness a resume kept going (``attempts/N/resume.json``: re-attached,
re-admitted from its record, or still running or ended by itself under the
supervisor when the resumed core dispatched its id again), that is its whole run,
part of it while no driver ran. The resumed lineage's clock leaves the crash and the
restore out (docs/real-backend.md#resume), so such an execution took
less of that clock than its duration: one dispatched again after the resume is
finished within tens of milliseconds (measured: 14 kept harnesses of ~9.4 s each
finished 0.03 s after their second dispatch). Replayed with its true duration, the
simulator waits for it and mispredicts the steps that follow the resume (in one
CI run, a step of 1.0 s predicted at 9.2 s).

``lineage_trace(RUN_DIR, OUT_DIR)`` writes the trace with each kept execution's
``duration_s`` replaced by its span in the final event log: from the event after
which the core last started it to its ``ExecutionFinished`` (its ``harness_s``,
when the trace has one, loses the same amount, never below 0), with the sidecar
beside it. Every other row and column is copied unchanged. The run's own
``trace.csv`` is not touched: it still describes the harnesses' work, which is
what a later simulation of the workload wants.

Invariants: only executions a resume record names change (a damaged record
raises ValueError naming its file); a changed row's
duration is its final-log span; a run never resumed gives its own trace path back.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from gyre import actions as act
from gyre import events as ev
from gyre.analysis.role_timeline import timeline
from gyre.formats.eventlog import load_events, run_config
from gyre.formats.trace import HARNESS_COLUMN
from gyre.formats.trace_meta import meta_path

TRACE = "trace.csv"


def kept_across_resumes(run_dir: str | Path) -> set[int]:
    """Executions whose harness some resume kept (re-attached, re-admitted, or its work kept); a record that
    is not a JSON object of execution ids raises ValueError naming the file and the field."""
    kept: set[int] = set()
    for path in sorted(Path(run_dir).glob("attempts/*/resume.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable resume record ({exc})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: a resume record is a JSON object, got {type(record).__name__}")
        for key in ("reattached", "readmitted", "work_kept_s"):
            try:
                kept |= {int(x) for x in record.get(key) or ()}
            except (TypeError, ValueError):
                raise ValueError(f"{path}: {key} must list execution ids, got {record.get(key)!r:.80}") from None
    return kept


class LineageSpans:
    """An observer for ``role_timeline.timeline`` (so a caller replaying the log already needs no second
    replay): ``spans`` holds each finished execution's span, from the event after which the core last started
    it to its ExecutionFinished."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}
        self.spans: dict[int, float] = {}

    def __call__(self, event: ev.Event, actions: list[act.Action], core: object) -> None:
        for action in actions:
            if isinstance(action, act.StartExecutions):
                self._started.update((x, event.now) for x, _ in action.placements)
        if isinstance(event, ev.ExecutionFinished) and event.execution in self._started:
            self.spans[event.execution] = event.now - self._started[event.execution]


def lineage_spans(run_dir: str | Path) -> dict[int, float]:
    """Each finished execution's span in the final event log (``LineageSpans``), from one replay of it."""
    log = Path(run_dir) / "log"
    observer = LineageSpans()
    timeline(run_config(log), load_events(log / "events.csv"), observe=observer)
    return observer.spans


def lineage_trace(run_dir: str | Path, out_dir: str | Path, spans: dict[int, float] | None = None) -> Path:
    """The run's trace with kept executions' durations as the lineage saw them (module docstring); ``spans``:
    the final log's execution spans when the caller replayed it already (``LineageSpans``)."""
    run_dir = Path(run_dir)
    source = run_dir / TRACE
    kept = kept_across_resumes(run_dir)
    if not kept:
        return source
    if spans is None:
        spans = lineage_spans(run_dir)
    n = run_config(run_dir / "log").group_size
    with open(source, newline="") as fh:
        reader = csv.DictReader(fh)
        columns, rows = list(reader.fieldnames or ()), list(reader)
    for row in rows:
        x = int(row["query_id"]) * n + int(row["execution_index"])
        if x in kept and x in spans:
            cut = max(0.0, float(row["duration_s"]) - spans[x])
            row["duration_s"] = repr(spans[x])
            if row.get(HARNESS_COLUMN):
                row[HARNESS_COLUMN] = repr(max(0.0, float(row[HARNESS_COLUMN]) - cut))
    out = Path(out_dir) / TRACE
    with open(out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    if meta_path(source).is_file():
        shutil.copyfile(meta_path(source), meta_path(out))
    return out
