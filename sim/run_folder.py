"""A real run's folder seen from the simulator: how many steps the run made.

``gyre sim --trace RUN/trace.csv`` simulates the run's own steps unless
``--steps`` says otherwise: the StepDone events of ``RUN/log/events.csv``
(the events the run's policy core received). Anything else (a preset name,
a trace outside a run folder, a folder without a log) has no recorded step
count: None.

Invariants: a pure function of the files; a malformed log raises the event
log loader's error naming the file.
"""

from __future__ import annotations

from pathlib import Path

from gyre.formats.eventlog import load_events


def recorded_steps(trace: str | Path) -> int | None:
    """Steps the run that wrote ``trace`` completed, or None when ``trace`` is not in a run folder."""
    log = Path(str(trace)).parent / "log" / "events.csv"
    if not Path(str(trace)).is_file() or not log.is_file():
        return None
    done = sum(1 for e in load_events(log) if e.kind == "step_done")
    return done or None
