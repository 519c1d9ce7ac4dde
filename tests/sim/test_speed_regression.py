"""The simulator's speed-ups change no result: the fast paths against the code they replaced, in one process.

What was made faster (issue 14 item 8): ``as_dict`` of events and actions is
a shallow copy instead of ``dataclasses.asdict``; ``EventLog`` builds its
rows lazily; engines compute their speed once per (load, capacity); the
driver skips ``next_deadline()`` while no supply timer runs, calls
``env.step`` without ``peek`` and derives a group as ``x // group_size``; the
record stores an execution's end without ``dict.update``; a preset trace is
generated once per process.

How this is checked: each fast path beside the code it replaced (the reference
functions below are that code, verbatim), through the public objects: events'
and actions' ``as_dict``, the lazy log read midway, a group's number, the
cached preset trace, the ledger's running capacity. That whole runs stay bit
for bit what the code gave before the speed-ups (every table, the actions, the
summary) is held by tests/sim/test_golden_outputs.py, whose digests were
recorded from that code; no test here puts old code back into the simulator's
classes (the run-loop and start-up fast paths have no seam to swap, and need
none: a changed byte there changes a golden digest).
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pytest

from gyre import actions as act
from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.formats import eventlog
from gyre.formats.tables import write_csv
from gyre.ledger import RolloutLedger
from gyre.scheduler import Scheduler
from gyre.sim import runner
from gyre.sim.traces.presets import generate_trace


# ---- the code before the change (reference) ---------------------------------------------------------------
def _reference_as_dict(self) -> dict[str, Any]:
    return {"kind": self.kind, **dataclasses.asdict(self)}


class _EagerEventLog:
    """EventLog before the change: every event and action turned into its dict as it is recorded."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self.action_counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.rows)

    def record_event(self, event: ev.Event) -> None:
        row = event.as_dict()
        row["seq"] = len(self.rows)
        row["now"] = float(row["now"])
        self.rows.append(row)

    def record_actions(self, actions: Iterable[act.Action]) -> None:
        for a in actions:
            self.action_counts[a.kind] += 1
            self.actions.append(a.as_dict())

    def write_csv(self, path: str | Path) -> Path:
        return write_csv(path, eventlog.EVENT_COLUMNS, self.rows)


def _reference_ledger_capacity(self) -> int:
    return sum(self._capacity[e] for e in self._accepting)


# ---- the tests ------------------------------------------------------------------------------------------
def _example(cls: type) -> Any:
    """An instance of an event or action type with a distinct value in every field (tuples nested)."""
    values = {int: 7, float: 2.5, str: "rollout", bool: True, tuple[int, ...]: (1, 2, 3),
              tuple[tuple[int, int], ...]: ((4, 0), (5, -1))}
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: values[hints[f.name]] for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("cls", [*ev.EVENT_TYPES.values(), *act.ACTION_TYPES.values()], ids=lambda c: c.kind)
def test_as_dict_equals_the_deep_copy_key_for_key_and_in_order(cls):
    obj = _example(cls)
    fast, reference = obj.as_dict(), _reference_as_dict(obj)
    assert fast == reference and list(fast) == list(reference)
    assert all(type(fast[k]) is type(reference[k]) for k in fast)  # tuples stay tuples
    fast["kind"] = "changed"
    assert obj.as_dict()["kind"] == cls.kind  # a fresh dict each time: the caller may change it


def test_event_and_action_fields_are_immutable_so_a_shallow_copy_is_safe():
    allowed = {int, float, str, bool}
    for cls in [*ev.EVENT_TYPES.values(), *act.ACTION_TYPES.values()]:
        for name, hint in typing.get_type_hints(cls).items():
            if name == "kind":
                continue
            parts = {hint} if hint in allowed else set(typing.get_args(hint)) - {Ellipsis}
            while parts - allowed:  # unpack nested tuples; anything else (list, dict, set) fails here
                inner = parts - allowed
                assert all(typing.get_origin(p) is tuple for p in inner), f"{cls.__name__}.{name}: {hint}"
                parts = (parts & allowed) | {q for p in inner for q in typing.get_args(p)} - {Ellipsis}


def test_the_lazy_log_read_midway_equals_the_eager_log():
    cfg = SchedulerConfig(K=4, C_e=8, C_s=0, N=4, B=2, phi=0.5, mu=2, granularity="fine", streaming=True)
    lazy, eager, core = eventlog.EventLog(), _EagerEventLog(), Scheduler(cfg)
    for i, event in enumerate([ev.Begin(0), ev.Tick(1), ev.Tick(2.5), ev.Tick(4)]):
        actions = core.handle(event)
        for log in (lazy, eager):
            log.record_event(event)
            log.record_actions(actions)
        if i in (1, 3):  # read in the middle, then go on recording: the rows built so far are extended
            assert lazy.rows == eager.rows and lazy.actions == eager.actions
            assert lazy.action_counts == eager.action_counts and len(lazy) == len(eager)
    assert [row["seq"] for row in lazy.rows] == [0, 1, 2, 3]
    assert type(lazy.rows[0]["now"]) is float  # Begin(0) was given an int
    assert lazy.action_counts["start_executions"] > 0


def test_a_group_is_its_execution_divided_by_the_group_size_as_the_core_says():
    for oversample in (0, 3):
        cfg = SchedulerConfig(K=4, C_e=8, C_s=0, N=4, B=2, phi=0.5, mu=2, granularity="fine", streaming=True,
                              oversample=oversample)
        core = Scheduler(cfg)
        assert all(core.group_of(x) == x // cfg.group_size for x in range(200))


def test_the_preset_trace_is_generated_once_and_equals_a_fresh_one():
    first, name = runner.resolve_trace("nl2repo-122b", 11, N=16)
    again, _ = runner.resolve_trace("nl2repo-122b", 11, N=16)
    assert again is first and name == "nl2repo-122b"
    assert first.equals(generate_trace("nl2repo-122b", runner.TRACE_QUERIES, np.random.default_rng(11), N=16))
    assert not runner.resolve_trace("nl2repo-122b", 12, N=16)[0].equals(first)



def test_the_ledger_running_capacity_is_the_sum_over_accepting_engines_through_opens_and_closes():
    cfg = SchedulerConfig(K=4, C_e=8, C_s=5, N=4, B=2, phi=0.5, mu=2, granularity="fine", streaming=True)
    ledger = RolloutLedger(cfg)
    rng = np.random.default_rng(0)
    for _ in range(200):
        engine = int(rng.integers(-1, 4))
        (ledger.open if rng.random() < 0.5 else ledger.close)(engine)  # repeated opens/closes included
        assert ledger.capacity == _reference_ledger_capacity(ledger)
