"""One timeline for any run: a Perfetto-readable trace of a simulated or a real run folder.

``gyre timeline RUN_DIR [RUN_DIR ...] -o run.trace.json`` writes the runs'
time lines in the JSON trace event format (the Chrome format Perfetto's UI
and trace processor import). Both worlds keep the same event log
(``gyre.formats.eventlog``): a simulated run (``gyre sim --out``) holds
``events.csv`` and ``summary.json``; a real run (``gyre run``) holds them
under ``log/`` (``log/events.jsonl`` alone, for a run killed before it wrote
the CSV). Everything is read off that log by replaying it through a fresh core
(``gyre.analysis.role_timeline``), so a real run and its simulation are drawn
by the same code:

| track (per run = one process)     | what it shows                                                      |
|-----------------------------------|--------------------------------------------------------------------|
| thread ``cell k``                 | slices ``rollout``, ``to_training``, ``training``, ``to_rollout``: |
|                                   | the cell's roles and the transitions between them                  |
| thread ``steps``                  | slice ``step v`` from its StartBatch to its StepDone               |
| thread ``publications``           | slice ``publish v`` from Publish to PublishDone                    |
| thread ``reroutes``               | instant ``reroute`` per Reroute action (execution, source, dest)   |
| counter ``executions running``    | executions holding a slot, one series per engine (``cell k``,      |
|                                   | ``separate pool``), after every event that changes one             |
| counter ``waterlevel``            | ``w`` = d - f and ``C_R`` (rollout capacity), likewise             |

Times are seconds since the run's first event (``ts`` in microseconds), so
runs given together (a real run beside its simulation) share one axis; run
``i`` (from 0) is process ``i + 1`` and its tracks are threads ``1000 * (i + 1)
+ j``, so no two runs share a track; ``otherData.gyre_runs`` names each run,
its world and its event count. ``read_trace`` reads a file back into
tables after checking it against the format (``check_trace``).

Invariants: a pure function of the run folders' files; the slices of one
thread never overlap (each is a sequence of disjoint spans), so a viewer
nests nothing by mistake; every ``X`` event has ``dur >= 0``; the trace
checks clean (``check_trace`` returns no problem).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre import actions as act
from gyre import events as ev
from gyre.actions import SEPARATE
from gyre.config import SchedulerConfig

US = 1e6  # trace timestamps are microseconds
TRACKS = ("steps", "publications", "reroutes")  # after the cells' threads, in this order
PHASES = {"X", "C", "i", "M"}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


@dataclass(frozen=True)
class RunLog:
    """A run folder's event log and the schedule it ran under."""

    name: str
    world: str  # "simulated" or "real"
    cfg: SchedulerConfig
    events: list[ev.Event]


def load_run_log(run_dir: str | Path) -> RunLog:
    """The event log of a ``gyre sim --out`` or ``gyre run`` folder; FileNotFoundError names what is missing."""
    from gyre.formats.eventlog import load_events, run_config
    from gyre.formats.journal import read_journal

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    for folder, world in ((run_dir / "log", "real"), (run_dir, "simulated")):
        if not (folder / "summary.json").exists():
            continue
        if (folder / "events.csv").exists():
            return RunLog(run_dir.name, world, run_config(folder), load_events(folder / "events.csv"))
        if (folder / "events.jsonl").exists():
            return RunLog(run_dir.name, world, run_config(folder), read_journal(folder / "events.jsonl").events)
    raise FileNotFoundError(f"{run_dir} is not a run folder: no events.csv (or events.jsonl) beside a "
                            "summary.json, neither in it (gyre sim --out) nor in its log/ (gyre run)")


class _Collector:
    """Counters and instants seen while the run's log is replayed (``role_timeline``'s observer)."""

    def __init__(self, cfg: SchedulerConfig, t0: float) -> None:
        self.t0 = t0
        self.engines = list(range(cfg.K)) + ([SEPARATE] if cfg.C_s > 0 else [])
        self.loads: list[tuple[float, dict[str, int]]] = []
        self.water: list[tuple[float, dict[str, int]]] = []
        self.reroutes: list[tuple[float, dict[str, int]]] = []

    def __call__(self, event: ev.Event, actions: list[act.Action], core: Any) -> None:
        now = float(event.now) - self.t0
        loads = {_engine_name(e): core.engine_load(e) for e in self.engines}
        if not self.loads or self.loads[-1][1] != loads:
            self.loads.append((now, loads))
        water = {"w": core.waterlevel, "C_R": core.capacity}
        if not self.water or self.water[-1][1] != water:
            self.water.append((now, water))
        for action in actions:
            if isinstance(action, act.Reroute):
                self.reroutes.append((now, {"execution": action.execution, "source": action.source,
                                            "dest": action.dest}))


def _engine_name(engine: int) -> str:
    return "separate pool" if engine == SEPARATE else f"cell {engine}"


def _meta(name: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    key = "sort_index" if name.endswith("sort_index") else "name"
    event = {"ph": "M", "name": name, "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def _slice(name: str, pid: int, tid: int, start_s: float, end_s: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": round(start_s * US, 3),
            "dur": round(max(0.0, end_s - start_s) * US, 3), "args": args}


def run_trace_events(log: RunLog, index: int) -> list[dict[str, Any]]:
    """The trace events of one run as process ``index + 1`` (module docstring)."""
    from gyre.analysis.role_timeline import timeline

    pid = index + 1
    t0 = float(log.events[0].now) if log.events else 0.0
    collector = _Collector(log.cfg, t0)
    tl = timeline(log.cfg, log.events, observe=collector)
    tid = {f"cell {c}": 1000 * pid + c for c in range(log.cfg.K)}
    tid.update({name: 1000 * pid + log.cfg.K + j for j, name in enumerate(TRACKS)})
    out = [_meta("process_name", pid, None, f"{log.world}: {log.name}"), _meta("process_sort_index", pid, None, pid)]
    for order, (name, number) in enumerate(tid.items()):
        out += [_meta("thread_name", pid, number, name), _meta("thread_sort_index", pid, number, order)]
    for cell, spans in tl.roles.items():
        out += [_slice(s.label, pid, tid[f"cell {cell}"], s.start_s - t0, s.end_s - t0, {"cell": cell})
                for s in spans]
    for version, s in sorted(tl.steps.items()):
        cells = "+".join(map(str, tl.training_cells(version)))
        out.append(_slice(s.label, pid, tid["steps"], s.start_s - t0, s.end_s - t0,
                          {"version": version, "training_cells": cells}))
    for version, s in sorted(tl.publications.items()):
        out.append(_slice(s.label, pid, tid["publications"], s.start_s - t0, s.end_s - t0, {"version": version}))
    out += [{"ph": "i", "s": "t", "name": "reroute", "pid": pid, "tid": tid["reroutes"], "ts": round(t * US, 3),
             "args": args} for t, args in collector.reroutes]
    for name, series in (("executions running", collector.loads), ("waterlevel", collector.water)):
        out += [{"ph": "C", "name": name, "pid": pid, "ts": round(t * US, 3), "args": values}
                for t, values in series]
    return out


def build_trace(run_dirs: list[str | Path]) -> dict[str, Any]:
    """One trace document holding every run of ``run_dirs`` (run ``i`` is process ``i + 1``)."""
    if not run_dirs:
        raise ValueError("no run folder given")
    logs = [load_run_log(d) for d in run_dirs]
    events: list[dict[str, Any]] = []
    for index, log in enumerate(logs):
        events += run_trace_events(log, index)
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0.0)))  # stable: metadata first, then by time
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"gyre_runs": [{"name": g.name, "world": g.world, "events": len(g.events)} for g in logs]}}


def write_trace(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Write ``build_trace(run_dirs)`` to ``out`` as JSON; returns the path."""
    out = Path(out)
    doc = build_trace(run_dirs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return out


def check_trace(doc: Any) -> list[str]:
    """Problems of ``doc`` against the JSON trace event format, as far as this module writes it; [] if none."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a trace: a JSON object with a traceEvents list is required"]
    problems = []
    for i, e in enumerate(doc["traceEvents"]):
        problem = _event_problem(e)
        if problem:
            problems.append(f"traceEvents[{i}]: {problem}")
    return problems


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _event_problem(e: Any) -> str | None:
    if not isinstance(e, dict) or e.get("ph") not in PHASES:
        return f"not an event of phase {sorted(PHASES)}: {e!r:.80}"
    if not isinstance(e.get("name"), str) or not isinstance(e.get("pid"), int):
        return "an event needs a string name and an integer pid"
    if e["ph"] == "M":
        return None if e["name"] in METADATA and isinstance(e.get("args"), dict) else f"bad metadata event {e!r:.80}"
    if not _number(e.get("ts")) or e["ts"] < 0:
        return f"ts must be a number >= 0, got {e.get('ts')!r}"
    if e["ph"] == "X" and (not _number(e.get("dur")) or e["dur"] < 0 or not isinstance(e.get("tid"), int)):
        return "a complete event (X) needs an integer tid and a number dur >= 0"
    if e["ph"] == "C" and not (isinstance(e.get("args"), dict) and e["args"]
                               and all(_number(v) for v in e["args"].values())):
        return "a counter event (C) needs args of numbers"
    if e["ph"] == "i" and e.get("s") not in ("g", "p", "t"):
        return "an instant event (i) needs a scope s of g, p or t"
    return None


def read_trace(path: str | Path) -> dict[str, Any]:
    """A trace file read back (after ``check_trace``, ValueError on any problem) as pandas tables:
    ``slices`` (process, thread, name, start_s, end_s, args), ``counters`` (process, counter, series,
    time_s, value) and ``instants`` (process, thread, name, time_s, args)."""
    import pandas as pd

    doc = json.loads(Path(path).read_text())
    problems = check_trace(doc)
    if problems:
        raise ValueError(f"{path}: not a valid trace: {problems[0]} ({len(problems)} problem(s))")
    names = {("p", e["pid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    names.update({("t", e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"})
    slices, counters, instants = [], [], []
    for e in doc["traceEvents"]:
        process = names.get(("p", e["pid"]), str(e["pid"]))
        if e["ph"] == "X":
            start = e["ts"] / US
            slices.append((process, names.get(("t", e["tid"])), e["name"], start, start + e["dur"] / US,
                           e.get("args", {})))
        elif e["ph"] == "C":
            counters += [(process, e["name"], key, e["ts"] / US, value) for key, value in e["args"].items()]
        elif e["ph"] == "i":
            instants.append((process, names.get(("t", e.get("tid"))), e["name"], e["ts"] / US, e.get("args", {})))
    return {"slices": pd.DataFrame(slices, columns=["process", "thread", "name", "start_s", "end_s", "args"]),
            "counters": pd.DataFrame(counters, columns=["process", "counter", "series", "time_s", "value"]),
            "instants": pd.DataFrame(instants, columns=["process", "thread", "name", "time_s", "args"])}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("timeline", help="write a Perfetto-readable trace of run folders (simulated or real)")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="a `gyre sim --out` or `gyre run` folder; several are laid side by side")
    p.add_argument("-o", "--out", type=Path, required=True, help="the trace file, e.g. run.trace.json")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        path = write_trace(args.run_dirs, args.out)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"gyre timeline: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}: open it at ui.perfetto.dev (Open trace file) or with perfetto's TraceProcessor")
    return 0
