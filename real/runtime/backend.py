"""RealBackend: the policy core's actions applied to real engines, proxy, harnesses and cells.

``RealBackend`` is the real world's ``gyre.loop.ActionHandler``, a thin handler
like the simulator's ``Simulation``: the controller's driver loop calls one
``on_<action>`` method per action on its event loop, one action at a time, in
the order the core returned them, and each delegates to the named part that
owns the state it touches:

| action           | part (module)                    | report                                        |
|------------------|----------------------------------|-----------------------------------------------|
| DispatchGroups   | executions (``runtime.executions``) | GroupDropped                               |
| StartExecutions  | executions                       | HarnessStopped, ExecutionFinished, GroupReady |
| CancelExecutions | executions                       | ExecutionFinished                             |
| Reroute          | proxy (``runtime.proxy_admin``)  |                                               |
| BeginTransition  | cells (``runtime.cell_switches``) | TransitionDone                               |
| StartBatch       | batches (``runtime.batch_feed``) | StepDone, GroupWanted                         |
| FeedGroups       | batches                          | GroupWanted                                   |
| Broadcast        | carried out by the core cell at the end of the step |                            |
| Publish          | publisher (``runtime.publisher``) | PublishDone                                  |

The parts share one ``BackendContext`` (``runtime.backend_context``): the live
components (``Parts``), the clock, the measurements (``Metrics``), ``report``
and ``spawn``. Each part's ``snapshot()`` / ``restore()`` is what a resumed run
(``runtime.restore``) reads and sets; ``snapshot()`` here gathers them.

Invariants: nothing here blocks the event loop: admin calls go through
``ProxyAdmin`` (a thread for HTTP, in the order sent), engine, plane and
record calls run in threads or tasks whose completion is reported back with
``controller.report(EventClass, **fields)``; engine ``c`` (cell c) is named
``engine_names[c]``, the separate pool ``engine_names[SEPARATE]``; every time
the backend reads comes from its ``clock`` (default ``time.monotonic``; the
differential tests pass a virtual one).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from gyre import actions as act
from gyre.loop import HANDLER_METHODS, ActionHandler
from gyre.real.runtime.backend_context import BackendContext, Metrics, Parts, TaskUnavailable
from gyre.real.runtime.batch_feed import BatchFeed
from gyre.real.runtime.cell_switches import CellSwitches
from gyre.real.runtime.executions import Executions, PickingBuffer
from gyre.real.runtime.proxy_admin import PROXY_WAIT_S, HttpAdmin, ProxyAdmin
from gyre.real.runtime.publisher import Publisher

__all__ = ["RealBackend", "Parts", "Metrics", "TaskUnavailable", "PickingBuffer", "PROXY_WAIT_S"]


class RealBackend(ActionHandler):
    def __init__(self, cfg, parts: Parts, *, seed: int, token_budget: int,
                 progress: Callable[[str], None] | None = None, steps: int | None = None,
                 clock: Callable[[], float] = time.monotonic, admin=None) -> None:
        """``admin``: the proxy's admin API (default: ``HttpAdmin`` on ``parts.proxy_url``)."""
        self.cfg, self.parts = cfg, parts
        self.ctx = ctx = BackendContext(cfg, parts, clock=clock, progress=progress)
        transport = admin if admin is not None else HttpAdmin(parts.proxy_url, parts.admin_token)
        self.proxy = ProxyAdmin(transport, ctx.failed, ctx.spawn)
        self.executions = Executions(ctx, self.proxy)
        self.publisher = Publisher(ctx, self.proxy, rollout_ready=lambda: self.cells.rollout_ready)
        self.batches = BatchFeed(ctx, self.executions.buffer, seed=seed, token_budget=token_budget,
                                 training_cells=lambda: len(self.cells.members), steps=steps)
        self.cells = CellSwitches(ctx, self.proxy, latest=lambda: self.publisher.latest,
                                  publishing=lambda: self.publisher.publishing,
                                  running=lambda: len(self.executions.running), joined=self.batches.ask)

    def bind(self, controller) -> RealBackend:
        self.ctx.controller = controller
        return self

    # ---- the actions -------------------------------------------------------------------
    def apply(self, a: act.Action) -> None:
        """Apply one action by the driver loop's own table (a resume re-applies outstanding ones)."""
        getattr(self, HANDLER_METHODS[type(a)])(a)

    def on_dispatch_groups(self, a: act.DispatchGroups) -> None:
        self.executions.dispatch(a)

    def on_start_executions(self, a: act.StartExecutions) -> None:
        self.executions.start(a)

    def on_cancel_executions(self, a: act.CancelExecutions) -> None:
        self.executions.cancel(a)

    def on_reroute(self, a: act.Reroute) -> None:
        t0 = self.ctx.clock()
        record: dict[str, float] = {"execution": a.execution, "source": a.source, "dest": a.dest}
        self.ctx.metrics.reroutes.append(record)
        done = self.proxy.reroute(a.execution, self.parts.engine_names[a.dest])
        done.add_done_callback(lambda _f: record.update(admin_s=self.ctx.clock() - t0))

    def on_begin_transition(self, a: act.BeginTransition) -> None:
        self.cells.begin(a)

    def on_start_batch(self, a: act.StartBatch) -> None:
        self.batches.start(a)

    def on_feed_groups(self, a: act.FeedGroups) -> None:
        self.batches.feed(a)

    def on_broadcast(self, a: act.Broadcast) -> None:
        """The core cell broadcasts to its seated satellites at the end of every non-final step."""

    def on_publish(self, a: act.Publish) -> None:
        self.publisher.publish(a)

    # ---- the engine watch's and the proxy supervisor's callbacks --------------------------
    def gate_engine(self, name: str, serving: bool) -> None:
        """The engine watch's gate (``runtime.engine_watch``): a dead engine is held in the proxy (its calls
        go elsewhere or wait; the core's routes to it are still taken) until it is back with the newest
        weights. Apart from the role's drain, so each is undone by its own owner."""
        self.proxy.gate(name, serving)

    def reapply_proxy_state(self) -> None:
        """A restarted proxy (``runtime.proxy_process``) kept keys and records on disk but nothing in memory:
        put back the policy version, the drains of engines not taking work, the holds of engines not back
        (``gate_engine``), the routes of running executions."""
        down = self.parts.watch.unavailable() if self.parts.watch is not None else set()
        latest = self.publisher.latest
        self.proxy.reapply(version=None if latest is None else latest[0], engines=self.cells.proxy_view(down),
                           running=list(self.executions.running))

    # ---- what the job, the metrics and a resume read ------------------------------------
    @property
    def metrics(self) -> Metrics:
        return self.ctx.metrics

    @property
    def errors(self) -> list[str]:
        return self.ctx.errors

    @property
    def errors_after_stop(self) -> list[str]:
        return self.ctx.errors_after_stop

    @property
    def tasks(self) -> set:
        return self.ctx.tasks

    @property
    def progress(self) -> Callable[[str], None]:
        return self.ctx.progress

    @property
    def latest(self) -> tuple[int, str] | None:
        return self.publisher.latest

    @property
    def rollout_ready(self) -> set[int]:
        return self.cells.rollout_ready

    def set_hooks(self, *, on_step: Callable[[int], Awaitable[None] | None] | None = None,
                  on_burst_end: Callable[[int], None] | None = None) -> None:
        """``on_step(version)``: live metrics, once per step before its StepDone (``runtime.metrics``);
        ``on_burst_end(version)``: the resume checkpoint, before a publication is sent (``runtime.restore``)."""
        if on_step is not None:
            self.batches.on_step = on_step
        if on_burst_end is not None:
            self.publisher.on_burst_end = on_burst_end

    def snapshot(self) -> dict[str, Any]:
        """Every part's own state (what ``runtime.restore`` sets on a resumed run)."""
        return {"proxy": self.proxy.snapshot(), "executions": self.executions.snapshot(),
                "cells": self.cells.snapshot(), "batches": self.batches.snapshot(),
                "publisher": self.publisher.snapshot()}

    # ---- shutdown -----------------------------------------------------------------------
    async def stop(self) -> None:
        """Cancel harnesses still running (the run is over) and wait for every task."""
        self.ctx.stopped = True
        await self.executions.stop()
        # Commands the finished run will never see answered (e.g. a step opened for the next
        # burst's batch) must not hold the process up: their waits end now (errors_after_stop).
        self.parts.plane.abandon()
        self.batches.stop()
        if self.ctx.tasks:
            await asyncio.wait(list(self.ctx.tasks), timeout=120)
        await self.parts.runner.close()
