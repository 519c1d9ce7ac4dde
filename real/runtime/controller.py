"""The real-time controller: the unchanged policy core driving a real backend.

The controller runs the shared ``gyre.loop.DriverLoop`` over an asyncio
queue of reports. The backend (``runtime.backend.RealBackend``, or a test
double at the outer edge) is the loop's ``ActionHandler``: one ``on_<action>``
method per action kind, exactly like the simulator's driver. Backends never
build events themselves: they call ``report(kind, **fields)`` from any
thread, and the controller stamps ``now`` from its injected clock when it
takes the report off the queue (``report(..., then=f)`` runs ``f`` on the loop
once the core has handled that event and its actions were applied), so the core sees a non-decreasing time
exactly as it does under SimPy. Supply-timer expiries become ``Tick`` events
when the queue stays empty until ``core.next_deadline()``.

Every event the core accepts is recorded in the shared event-log format
(``write_log``), so ``gyre.formats.eventlog.replay_run`` regenerates the
controller's exact action sequence. A real job passes a
``gyre.formats.journal.JournalLog``, so each event is also on disk as it is
fed (``events.jsonl``, readable after a kill -9); a resumed run passes the
core and log replayed from it, and its clock goes on from the last replayed
event's ``now``. The clock starts when ``run`` starts (before it, it reads
that starting time): set-up and a resume's restore are not in the log's
time, so a resumed attempt's time is continuous with the attempt it goes on
from (``analysis.calibrate`` measures a redone transition from there).

Invariants: actions are applied in the order the core returns them, one
event at a time; a backend error while applying an action stops the run
with ``gyre.loop.ActionFailed`` naming the action, after the event log so far
has been kept (``log`` stays readable and writable).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.formats.eventlog import EventLog
from gyre.loop import DriverLoop
from gyre.scheduler import Scheduler

# a queued report: the event's class, its fields but ``now``, and what to run once the core has acted on it
Report = tuple[type[ev.Event], dict[str, Any], Callable[[], None] | None]


class ControllerError(RuntimeError):
    """The run cannot go on: a report before the loop started, or the run's time limit passed."""


class Controller:
    def __init__(self, cfg: SchedulerConfig, backend: object,
                 clock: Callable[[], float] | None = None, *, core: Scheduler | None = None,
                 log: EventLog | None = None) -> None:
        self.cfg = cfg
        self.core = core if core is not None else Scheduler(cfg)  # a resumed run passes its replayed core
        self.backend = backend
        self.loop = DriverLoop(self.core, backend, log)
        self.log = self.loop.log
        self._offset = self.core.now or 0.0  # a resumed run's clock goes on from its log
        self._started: float | None = None  # time.monotonic() when run() began
        self.clock = clock or self._run_clock
        self._queue: asyncio.Queue[Report] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _run_clock(self) -> float:
        """Seconds since ``run`` began, plus the replayed log's last ``now``."""
        return self._offset if self._started is None else self._offset + time.monotonic() - self._started

    # ---- reports from backends -----------------------------------------------------
    def report(self, kind: type[ev.Event], *, then: Callable[[], None] | None = None, **fields: Any) -> None:
        """Queue an event of ``kind`` (stamped with ``now`` on arrival); thread-safe."""
        if self._loop is None or self._queue is None:
            raise ControllerError("report() before run() started")
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, fields, then))

    # ---- the loop --------------------------------------------------------------------
    async def run(self, steps: int, timeout_s: float | None = None, finish_publication: bool = False,
                  resume: Callable[[], None] | None = None) -> None:
        """Run until the core has completed ``steps`` optimizer steps.

        With ``finish_publication`` the run also waits for a publication still
        pending after the last step (the engines then serve the final weights).
        ``resume`` (a resumed run, whose core already had its ``Begin``) runs on the
        loop once reports can be queued, instead of feeding ``Begin``: it re-applies
        the actions still outstanding in the replayed log (``runtime.resume``).
        """
        self._loop = asyncio.get_running_loop()
        queue = self._queue = asyncio.Queue()
        self._started = time.monotonic()
        if resume is None:
            self.loop.feed(ev.Begin(self.clock()))
        else:
            resume()
        deadline_run = None if timeout_s is None else self.clock() + timeout_s
        while self.core.version < steps or (finish_publication and self.core.awaiting_publish):
            if deadline_run is not None and self.clock() > deadline_run:
                raise ControllerError(f"run exceeded {timeout_s} s at step {self.core.version} of {steps}")
            event, then = await self._next_event(queue, deadline_run)
            self.loop.feed(event)
            if then is not None:  # the reporter wanted to act once the core had acted on its event
                then()

    async def _next_event(self, queue: asyncio.Queue[Report],
                          deadline_run: float | None) -> tuple[ev.Event, Callable[[], None] | None]:
        deadline = self.core.next_deadline()
        limits = [t for t in (deadline, deadline_run) if t is not None]
        wait = None if not limits else max(0.0, min(limits) - self.clock())
        try:
            kind, fields, then = await asyncio.wait_for(queue.get(), wait)
        except TimeoutError:
            return ev.Tick(max(self.clock(), deadline or 0.0)), None
        return kind(now=max(self.clock(), self.core.now or 0.0), **fields), then

    # ---- records ----------------------------------------------------------------------
    def write_log(self, out: str | Path) -> Path:
        """Write events.csv and a summary.json with the config, readable by ``replay_run``."""
        out = self.write_summary(out)
        self.log.write_csv(out / "events.csv")
        return out

    def write_summary(self, out: str | Path) -> Path:
        """Write the log folder's summary.json (the config ``replay_run`` and ``replay_journal`` read)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        summary = {"source": "gyre.real.runtime.controller", "steps": self.core.version,
                   "config": asdict(self.cfg)}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return out
