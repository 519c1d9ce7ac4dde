"""What every part of the real backend shares: the live components, the clock, the measurements, and
the ways to report an event and start a task.

``RealBackend`` (``runtime.backend``) is a thin handler over named parts
(``runtime.proxy_admin``, ``runtime.executions``, ``runtime.cell_switches``,
``runtime.batch_feed``, ``runtime.publisher``); each part owns its state and
gets this one ``BackendContext``.

Invariants: ``spawn`` keeps every task until it ends and files a task's
exception under ``errors`` (or ``errors_after_stop`` once the run is over);
``report`` goes to the controller bound last; every time a part reads comes
from ``clock``; ``send_to_cell`` numbers a plane command on the loop (a
cell's commands run in the order the actions were applied) and writes it to
the control store on another thread, so a slow store never stalls the loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gyre.real.harness.runner import HarnessRunner
from gyre.real.runtime.trace import ExecutionResult as TraceResult
from gyre.staleness import staleness_by_group


class TaskUnavailable(RuntimeError):
    """A task source cannot set up a group's task (raised by ``task(query_id)``): the group is dropped."""


@dataclass
class Parts:
    """The live components the backend drives (built by ``runtime.job``)."""

    proxy_url: str
    admin_token: str
    engines: Any                      # engines.manager.EngineManager
    engine_names: dict[int, str]      # cell index (or SEPARATE) -> engine id
    plane: Any                        # train.plane.TrainingPlane
    runner: HarnessRunner
    records_dir: Path
    checkpoint_dir: Path
    task: Any                         # has .task(task_id) and .evaluate(execution_id, workspace)
    watch: Any = None                 # runtime.engine_watch.EngineWatch (dead engines revived), or None
    publication: str = "disk"         # how weights reach the engines: "disk" or "memory" (JobConfig.publication)
    engine_tp: int = 1                # each engine's tensor-parallel ranks (its weight-update group members)


@dataclass
class Metrics:
    v_d: dict[int, int] = field(default_factory=dict)
    v_t: dict[int, int] = field(default_factory=dict)
    rewards: dict[int, list[float]] = field(default_factory=dict)   # version -> rewards of fed groups
    steps: dict[int, dict] = field(default_factory=dict)            # version -> step report + wall time
    publishes: list[dict] = field(default_factory=list)
    transitions: list[dict] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)
    trace: list[TraceResult] = field(default_factory=list)
    reroutes: list[dict] = field(default_factory=list)
    in_flight_at_transition: list[int] = field(default_factory=list)
    move_stalls_ms: list[float] = field(default_factory=list)  # per moved call: the pause its harness saw
    excluded: list[int] = field(default_factory=list)          # executions out of budget without a valid reward

    def staleness(self) -> list[int]:
        return list(staleness_by_group(self.v_d, self.v_t).values())


class BackendContext:
    def __init__(self, cfg, parts: Parts, *, clock: Callable[[], float] = time.monotonic,
                 progress: Callable[[str], None] | None = None) -> None:
        self.cfg, self.parts, self.clock = cfg, parts, clock
        self.progress = progress or (lambda line: None)
        self.metrics = Metrics()
        self.controller: Any = None
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[str] = []
        self.errors_after_stop: list[str] = []  # waits abandoned when the run ended (not failures of the run)
        self.stopped = False

    def report(self, kind, **fields) -> None:
        self.controller.report(kind, **fields)

    def send_to_cell(self, cell: int, op: str, **args: Any) -> Any:
        """Send plane command ``op`` to ``cell``: numbered now, written off the loop; its ``Ticket``."""
        ticket, write = self.parts.plane.prepare(cell, op, **args)
        self.spawn(asyncio.to_thread(write))
        return ticket

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def failed(self, error: BaseException) -> None:
        """A failure outside a spawned task (an admin call sent without a waiter)."""
        (self.errors_after_stop if self.stopped else self.errors).append(repr(error))

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.failed(error)
