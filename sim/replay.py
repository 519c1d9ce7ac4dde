"""Replay a recorded event log through a fresh policy core.

A run's ``events.csv`` plus the configuration in its ``summary.json`` are
enough to regenerate every action the core took: ``replay_run(DIR)`` returns
those actions as dicts. This is the differential check between drivers: the
simulator and the real controller feed the same core, so the same event log
must yield the same action sequence.

Invariant: ``replay(cfg, events)`` is a pure function of its inputs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable

from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.scheduler import Scheduler

_TYPES = {"now": float, "execution": int, "group": int, "cell": int, "version": int, "outcome": str, "role": str}


def load_events(path: str | Path) -> list[ev.Event]:
    """Events from an ``events.csv``; a malformed row raises ValueError naming its line."""
    out = []
    with open(path, newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                fields = {k: _TYPES[k](v) for k, v in row.items() if k in _TYPES and v != ""}
                out.append(ev.event_from_dict({"kind": row["kind"], **fields}))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: line {line}: bad event row ({exc})") from None
    return out


def replay(cfg: SchedulerConfig, events: Iterable[ev.Event]) -> list[dict[str, Any]]:
    core = Scheduler(cfg)
    actions: list[dict[str, Any]] = []
    for event in events:
        actions += [a.as_dict() for a in core.handle(event)]
    return actions


def replay_run(run_dir: str | Path) -> list[dict[str, Any]]:
    run_dir = Path(run_dir)
    config = json.loads((run_dir / "summary.json").read_text())["config"]
    return replay(SchedulerConfig(**config), load_events(run_dir / "events.csv"))
