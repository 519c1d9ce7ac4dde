"""The real-time controller: the unchanged policy core driving a real backend.

The controller owns a ``gyre.scheduler.Scheduler`` and an asyncio queue of
reports. Backends (SGLang engine manager, training cells, harness runner, or
a test double at the outer edge) never build events themselves: they call
``report(kind, **fields)`` from any thread, and the controller stamps ``now``
from its injected clock when it takes the report off the queue, so the core
sees a non-decreasing time exactly as it does under SimPy. Supply-timer
expiries become ``Tick`` events when the queue stays empty until
``core.next_deadline()``.

Every event fed to the core is recorded in the simulator's ``events.csv``
format (``write_log``), so ``gyre.sim.replay.replay_run`` regenerates the
controller's exact action sequence: the differential check that the real
backend and the simulator run the same policy.

Invariants: actions are applied in the order the core returns them, one
event at a time; a backend error while applying an action stops the run
with ``ControllerError`` naming the action, after the event log so far has
been kept (``events`` stays readable and writable).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Protocol

from gyre import actions as act
from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.scheduler import Scheduler


class Backend(Protocol):
    def apply(self, action: act.Action) -> None:
        """Start carrying out one action; must not block (spawn tasks instead)."""


class ControllerError(RuntimeError):
    """A backend failed to apply an action; the event log up to it is kept."""


class Controller:
    def __init__(self, cfg: SchedulerConfig, backend: Backend,
                 clock: Callable[[], float] | None = None) -> None:
        self.cfg = cfg
        self.core = Scheduler(cfg)
        self.backend = backend
        start = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - start)
        self.events: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self._queue: asyncio.Queue[tuple[type, dict[str, Any]]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- reports from backends -----------------------------------------------------
    def report(self, kind: type[ev.Event], **fields: Any) -> None:
        """Queue an event of ``kind`` (stamped with ``now`` on arrival); thread-safe."""
        if self._loop is None or self._queue is None:
            raise ControllerError("report() before run() started")
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, fields))

    # ---- the loop --------------------------------------------------------------------
    async def run(self, steps: int, timeout_s: float | None = None, finish_publication: bool = False) -> None:
        """Run until the core has completed ``steps`` optimizer steps.

        With ``finish_publication`` the run also waits for a publication still
        pending after the last step (the engines then serve the final weights).
        """
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._feed(ev.Begin(self.clock()))
        deadline_run = None if timeout_s is None else self.clock() + timeout_s
        while self.core.version < steps or (finish_publication and self.core.awaiting_publish):
            if deadline_run is not None and self.clock() > deadline_run:
                raise ControllerError(f"run exceeded {timeout_s} s at step {self.core.version} of {steps}")
            self._feed(await self._next_event(deadline_run))

    async def _next_event(self, deadline_run: float | None) -> ev.Event:
        deadline = self.core.next_deadline()
        limits = [t for t in (deadline, deadline_run) if t is not None]
        wait = None if not limits else max(0.0, min(limits) - self.clock())
        try:
            kind, fields = await asyncio.wait_for(self._queue.get(), wait)
        except asyncio.TimeoutError:
            return ev.Tick(max(self.clock(), deadline or 0.0))
        return kind(now=max(self.clock(), self.core.now or 0.0), **fields)

    def _feed(self, event: ev.Event) -> None:
        row = event.as_dict()
        row["seq"] = len(self.events)
        self.events.append(row)
        actions = self.core.handle(event)
        for action in actions:
            self.actions.append(action.as_dict())
            try:
                self.backend.apply(action)
            except Exception as exc:  # the backend is outside our control: keep the log, name the action
                raise ControllerError(f"backend failed to apply {action!r}: {exc}") from exc

    # ---- records ----------------------------------------------------------------------
    def write_log(self, out: str | Path) -> Path:
        """Write events.csv and a summary.json with the config, readable by gyre.sim.replay."""
        from gyre.sim.record import EVENT_COLUMNS, write_csv

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "events.csv", EVENT_COLUMNS, self.events)
        summary = {"source": "gyre.real.runtime_controller", "steps": self.core.version,
                   "config": asdict(self.cfg)}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return out
