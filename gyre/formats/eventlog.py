"""Event logs: the schema, the log a driver loop keeps, and replay through a fresh core.

A run's ``events.csv`` holds every event the policy core accepted, in order;
with the configuration in the run's ``summary.json`` it regenerates every
action the core took (``replay_run(DIR)``). Both worlds write it through
``EventLog``, so a simulated and a real run are read the same way.

The schema is derived from ``gyre.events`` and never listed by hand:
``EVENT_COLUMNS`` is ``seq``, ``kind``, then every event field in the order
the event types first declare it; each column's parser is the field's
annotated type. Adding a field to an event adds its column.

Recording is cheap: ``EventLog`` keeps the (frozen) event and action
objects and builds their dict rows only when ``rows`` / ``actions`` are read,
extending the rows built so far, so a driver pays one call and two list appends per event
and a simulation read only for its summary never builds them at all.

Invariants: ``load_events(write(log))`` returns the recorded events (times to
the microsecond the CSV keeps); ``replay(cfg, events)`` is a pure function of
its inputs; a malformed row raises ValueError naming its line; ``rows`` and
``actions`` read at any point equal the dicts that recording each event and
action as it came would have built (``as_dict``, plus ``seq`` and a float
``now`` for events).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import typing
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from gyre import actions as act
from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.formats.tables import write_csv
from gyre.scheduler import Scheduler


def _schema() -> tuple[tuple[str, ...], dict[str, Callable[[str], Any]]]:
    columns: list[str] = ["seq", "kind"]
    parsers: dict[str, Callable[[str], Any]] = {}
    for cls in ev.EVENT_TYPES.values():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if field.name not in parsers:
                columns.append(field.name)
                parsers[field.name] = hints[field.name]
    return tuple(columns), parsers


EVENT_COLUMNS, _PARSERS = _schema()


class EventLog:
    """Events a core accepted and the actions it returned, in order."""

    def __init__(self) -> None:
        self._events: list[ev.Event] = []
        self._actions: list[act.Action] = []
        self._rows: list[dict[str, Any]] = []
        self._action_rows: list[dict[str, Any]] = []
        self._counts: Counter[str] = Counter()
        self._counted = 0

    def __len__(self) -> int:
        """The number of recorded events."""
        return len(self._events)

    def record(self, event: ev.Event, actions: list[act.Action]) -> None:
        """An accepted event and the actions it returned: ``record_event`` then ``record_actions``, in one
        call (a driver loop's, once per event). A subclass that extends either extends this too."""
        self._events.append(event)
        self._actions.extend(actions)

    def record_event(self, event: ev.Event) -> None:
        self._events.append(event)

    def record_actions(self, actions: Iterable[act.Action]) -> None:
        self._actions.extend(actions)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per recorded event: ``as_dict()`` with ``seq`` and ``now`` as a float."""
        rows, events = self._rows, self._events
        for seq in range(len(rows), len(events)):
            row = events[seq].as_dict()
            row["seq"] = seq
            row["now"] = float(row["now"])
            rows.append(row)
        return rows

    @property
    def actions(self) -> list[dict[str, Any]]:
        """One ``as_dict()`` per returned action, in order."""
        out, actions = self._action_rows, self._actions
        out.extend(a.as_dict() for a in actions[len(out):])
        return out

    @property
    def action_counts(self) -> Counter[str]:
        """How many actions of each kind were returned."""
        counts, actions = self._counts, self._actions
        for a in actions[self._counted:]:
            counts[a.kind] += 1
        self._counted = len(actions)
        return counts

    def events(self) -> list[ev.Event]:
        """The recorded events as event objects."""
        return [ev.event_from_dict({k: v for k, v in row.items() if k != "seq"}) for row in self.rows]

    def write_csv(self, path: str | Path) -> Path:
        return write_csv(path, EVENT_COLUMNS, self.rows)


def load_events(path: str | Path) -> list[ev.Event]:
    """Events from an ``events.csv``; a malformed row raises ValueError naming its line."""
    out = []
    with open(path, newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                fields = {k: _PARSERS[k](v) for k, v in row.items() if k in _PARSERS and v != ""}
                out.append(ev.event_from_dict({"kind": row["kind"], **fields}))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: line {line}: bad event row ({exc})") from None
    return out


def replay(cfg: SchedulerConfig, events: Iterable[ev.Event]) -> list[dict[str, Any]]:
    """Every action a fresh core returns for ``events``, as dicts."""
    core = Scheduler(cfg)
    actions: list[dict[str, Any]] = []
    for event in events:
        actions += [a.as_dict() for a in core.handle(event)]
    return actions


def run_config(run_dir: str | Path) -> SchedulerConfig:
    """The schedule a run folder's ``summary.json`` was made with."""
    return SchedulerConfig(**json.loads((Path(run_dir) / "summary.json").read_text())["config"])


def replay_run(run_dir: str | Path) -> list[dict[str, Any]]:
    """Replay a run folder's ``events.csv`` under its recorded configuration."""
    return replay(run_config(run_dir), load_events(Path(run_dir) / "events.csv"))
