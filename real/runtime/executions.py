"""The backend's part for executions: a group's task, each execution's harness, record and evaluation.

``Executions`` applies DispatchGroups (each group's task set up once and the
group opened in the trajectory buffer, v_d recorded; a task that cannot be set
up drops its group: ``GroupDropped``), StartExecutions (keys and routes in one
admin call, then one harness task each) and CancelExecutions. At a harness's
exit the execution's recorded calls go into its trajectory tree and it is
closed and evaluated (``harness.evaluation``) within its overall budget.

Harness stop: when the evaluation's first attempt leaves the execution
pending (evaluator failure: retries within the budget follow), it reports
``HarnessStopped`` then and ``ExecutionFinished`` when the evaluation ends,
so the core hands the rollout slot to a queued execution meanwhile (the
simulator's rule for a trace row with ``harness_s < duration_s``). Cancelling
an execution whose evaluation is retrying cancels the evaluation: it reports
``ExecutionFinished("cancelled")``, as the simulator does.

State it owns (``snapshot()`` / ``restore()``): the groups dropped, the
executions closed per group, the groups reported ready, the executions whose
``HarnessStopped`` a resumed core already holds. A resumed run re-opens its
groups (``reopen_group``), replays the executions finished before its
checkpoint (``replay_finished``) and re-admits those whose harness exited
meanwhile (``readmit``).

Invariants: a group is reported ready only once every one of its N closes
was reported; a dropped group's executions start no harness and finish
"cancelled" when the core cancels them; an execution in
``harness_stopped_before`` never reports ``HarnessStopped`` again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from gyre import actions as act
from gyre import events as ev
from gyre.ids import execution_id, group_id, query_id
from gyre.real.harness.evaluation import close_and_evaluate
from gyre.real.harness.runner import ExecutionResult
from gyre.real.runtime.backend_context import BackendContext, TaskUnavailable
from gyre.real.runtime.proxy_admin import ProxyAdmin
from gyre.real.runtime.trace import ExecutionResult as TraceResult
from gyre.real.runtime.trace import counts_from_calls
from gyre.real.store.tito_log import ExecutionStore
from gyre.trajectory.evaluation import EvalState
from gyre.trajectory.groups import ReadyGroup, TrajectoryBuffer


class PickingBuffer(TrajectoryBuffer):
    """A trajectory buffer whose next pop is the group the core chose (``want``)."""

    want: str | None = None
    popped: list[ReadyGroup]

    def ready_group_ids(self) -> list[str]:
        ready = super().ready_group_ids()
        if self.want is None:
            return ready
        return [self.want] if self.want in ready else []

    def pop_ready_group(self) -> ReadyGroup | None:
        group = super().pop_ready_group()
        if group is not None:
            self.__dict__.setdefault("popped", []).append(group)
        return group

    def holds(self, group: str) -> bool:
        """The group is open here (dispatched, not popped or dropped)."""
        return group in self._groups


class Executions:
    def __init__(self, ctx: BackendContext, proxy: ProxyAdmin) -> None:
        self.ctx, self.proxy = ctx, proxy
        self.buffer = PickingBuffer(ctx.cfg.N)
        self.store = ExecutionStore(ctx.parts.records_dir)
        self.running: dict[int, asyncio.Task] = {}
        self.dropped: set[int] = set()    # groups whose task could not be set up (GroupDropped)
        self.harness_stopped_before: set[int] = set()  # resumed: HarnessStopped already in the replayed log
        self._tasks: dict[int, Any] = {}  # group -> its task, set up once at dispatch
        self._closed: Counter[int] = Counter()  # ExecutionFinished reported, per group
        self._ready_reported: set[int] = set()
        self._unstarted_futures: dict[int, asyncio.Future] = {}
        self._evaluating: dict[int, asyncio.Future] = {}  # harness stopped, retrying: set to cancel
        self._stopped_at: dict[int, float] = {}  # when HarnessStopped was reported (clock), for the trace
        self._start_s: dict[int, float] = {}  # when StartExecutions was applied (runner's clock), for the trace

    # ---- actions ---------------------------------------------------------------------
    def dispatch(self, a: act.DispatchGroups) -> None:
        for g in a.groups:
            self.ctx.metrics.v_d[g] = a.version
            if self._set_up_task(g):
                self._open(g, a.version)
            else:
                self.ctx.report(ev.GroupDropped, group=g)

    def start(self, a: act.StartExecutions) -> None:
        # the core's start instant, on the runner's clock (the event loop's: time.monotonic() for asyncio's own):
        # the trace's durations count the backend's start latency (key, route, workspace, spawn) as the simulator does
        # one admin call for the whole action (keys and routes): per-execution calls held the loop ~1.8 s per
        # burst of 16 on 2 cores, and the StartBatch behind it waited, a delay the simulator does not have
        started = asyncio.get_running_loop().time()
        routes = {x: self.ctx.parts.engine_names[engine] for x, engine in a.placements}
        if not routes:
            return
        keys = self.proxy.start_executions(routes)
        for x in routes:
            self._start_s[x] = started
            self.running[x] = self.ctx.spawn(self._execute(x, keys))

    def cancel(self, a: act.CancelExecutions) -> None:
        for x in a.executions:
            if x // self.ctx.cfg.group_size in self.dropped:
                self._unstarted(x).set_result(None)
            elif x in self._evaluating:  # harness stopped, evaluation retrying: cancel the evaluation
                self._evaluating.pop(x).set_result(None)
            else:
                self.ctx.spawn(self.ctx.parts.runner.cancel(x))

    async def stop(self) -> None:
        """Cancel the harnesses still running (the run is over). Under a supervisor only the waits end: the
        harnesses are the supervisor's, which the job stops at a clean end and keeps for a resume otherwise."""
        for x in list(self.running):
            if self._supervised():
                self.running[x].cancel()
            else:
                await self.ctx.parts.runner.cancel(x)

    def _supervised(self) -> bool:
        """The harnesses run under the run's supervisor (``real.supervisor``; a runner without one: no)."""
        return getattr(self.ctx.parts.runner, "supervisor", None) is not None

    # ---- one execution -----------------------------------------------------------------
    def _set_up_task(self, g: int) -> bool:
        try:
            self._tasks[g] = self.ctx.parts.task.task(query_id(g))
        except TaskUnavailable as exc:  # the group can never complete: the core replaces it
            self.dropped.add(g)
            self.ctx.progress(f"group {group_id(g)} dropped: {exc}")
            return False
        return True

    def _open(self, g: int, v_d: int) -> None:
        ids = [execution_id(x) for x in range(g * self.ctx.cfg.group_size, (g + 1) * self.ctx.cfg.group_size)]
        deadline = self.ctx.clock() + self.ctx.parts.runner.budgets.overall_timeout_s  # each execution's budget
        self.buffer.open_group(group_id(g), v_d, ids, deadline=deadline)

    def _unstarted(self, x: int) -> asyncio.Future:
        """The cancellation of an execution of a dropped group, which never started a harness."""
        return self._unstarted_futures.setdefault(x, asyncio.get_running_loop().create_future())

    async def _execute(self, x: int, keys: asyncio.Future | None, exited: ExecutionResult | None = None) -> None:
        """Run ``x``'s harness (or, resumed, take ``exited``: the result of a harness that already exited),
        then record, evaluate and report it."""
        g = x // self.ctx.cfg.group_size
        if g in self.dropped:  # nothing to run: wait for the core's CancelExecutions
            self._start_s.pop(x, None)
            await self._unstarted(x)
            self.running.pop(x, None)
            self._finish(x, "cancelled")
            return
        if exited is None:
            if keys is None:
                raise RuntimeError(f"execution {x}: neither its keys' future nor a harness result to take")
            key = (await asyncio.shield(keys))[execution_id(x)]  # shared: one cancelled start leaves the others
            exited = await self.ctx.parts.runner.run(x, self._tasks[g], key)
            if x in getattr(self.ctx.parts.runner, "attached", ()):  # one the crashed driver started: its true start
                self._start_s.pop(x, None)
        self.running.pop(x, None)
        self.proxy.finished(x)
        calls = await self._read_calls(x)
        self.ctx.metrics.move_stalls_ms += [float(v) for c in calls
                                            for v in c.role_hints.get("move_stalls_ms", "").split(",") if v]
        outcome, evaluated_s, stopped_s = await self._score(x, g, exited, calls)
        self.ctx.metrics.trace.append(TraceResult(
            query_id=g, execution_index=x - g * self.ctx.cfg.group_size,
            start_s=self._start_s.pop(x, exited.started_at), end_s=exited.ended_at + evaluated_s,
            harness_end_s=None if stopped_s is None else exited.ended_at + stopped_s,
            outcome=outcome, **counts_from_calls(calls)))
        self._finish(x, outcome)

    async def _read_calls(self, x: int) -> list:
        eid = execution_id(x)
        return await asyncio.to_thread(self.store.read, eid) if self.store.path_for(eid).exists() else []

    async def _score(self, x: int, g: int, exited: ExecutionResult, calls: list) -> tuple[str, float, float | None]:
        """The outcome, the evaluation's time and when its retries began (both after the harness's exit)."""
        outcome, evaluated_s, stopped_s = exited.outcome, 0.0, None
        if not self.buffer.holds(group_id(g)) or g in self._ready_reported:
            return outcome, evaluated_s, stopped_s
        for call in calls:
            self.buffer.add(call)
        before = self.ctx.clock()
        state = await self._evaluate(x, exited.workspace)
        evaluated_s = self.ctx.clock() - before
        stopped_at = self._stopped_at.pop(x, None)
        stopped_s = None if stopped_at is None else stopped_at - before
        if state is None:  # cancelled by the core while its evaluation was retrying
            outcome = "cancelled"
        elif state is EvalState.INVALID:  # excluded, and its group still becomes ready
            outcome = "overall_timeout"
            self.ctx.metrics.excluded.append(x)
            eid = execution_id(x)
            self.ctx.progress(f"execution {eid} excluded: {self.buffer.evaluation(eid).exclusion_reason}")
        return outcome, evaluated_s, stopped_s

    def _finish(self, x: int, outcome: str) -> None:
        g = x // self.ctx.cfg.group_size
        self.ctx.metrics.outcomes[x] = outcome
        self.ctx.report(ev.ExecutionFinished, execution=x, outcome=outcome)
        self._closed[g] += 1
        # Ready only once every execution's finish is reported: evaluations run as tasks, so a group's
        # buffer can turn ready while another execution's ExecutionFinished is still to come (the core
        # refuses a GroupReady before N of its executions closed).
        if g not in self._ready_reported and self._closed[g] >= self.ctx.cfg.N \
                and group_id(g) in self.buffer.ready_group_ids():
            self._ready_reported.add(g)
            self.ctx.report(ev.GroupReady, group=g)

    async def _evaluate(self, x: int, workspace: Path) -> EvalState | None:
        """Close and evaluate ``x``; report HarnessStopped if it goes into retries. None: cancelled then."""
        cancelled = asyncio.get_running_loop().create_future()

        def harness_stopped() -> None:
            self._evaluating[x] = cancelled
            self._stopped_at[x] = self.ctx.clock()
            if x not in self.harness_stopped_before:  # a resumed run's core already holds it stopped
                self.ctx.report(ev.HarnessStopped, execution=x)

        evaluation = self.ctx.spawn(close_and_evaluate(self.buffer, self.ctx.parts.task, execution_id(x), workspace,
                                                       self.ctx.clock, on_pending=harness_stopped))
        try:
            await asyncio.wait({evaluation, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._evaluating.pop(x, None)
            if not evaluation.done():
                evaluation.cancel()
        return evaluation.result() if evaluation.done() else None

    # ---- a resumed run -------------------------------------------------------------------
    def reopen_group(self, g: int, v_d: int, *, ready: bool) -> bool:
        """Open group ``g`` again (its task set up unless it is ready: it runs nothing more); False: its
        task is gone now (the group is dropped)."""
        if not ready:
            try:
                self._tasks[g] = self.ctx.parts.task.task(query_id(g))
            except TaskUnavailable as exc:
                self.ctx.progress(f"group {group_id(g)} dropped on resume: {exc}")
                self.dropped.add(g)
                return False
        self._open(g, v_d)
        return True

    async def replay_finished(self, x: int, outcome: str, workspace: Path) -> None:
        """An execution finished before the checkpoint: its calls and a fresh evaluation, silently."""
        g = x // self.ctx.cfg.group_size
        self._closed[g] += 1
        if g in self.dropped or not self.buffer.holds(group_id(g)) or outcome == "cancelled":
            return
        for call in await self._read_calls(x):
            self.buffer.add(call)
        state = await close_and_evaluate(self.buffer, self.ctx.parts.task, execution_id(x), workspace,
                                         self.ctx.clock)
        if state is EvalState.INVALID:
            self.ctx.metrics.excluded.append(x)
        self.ctx.metrics.outcomes[x] = outcome

    def mark_ready(self, g: int) -> bool:
        """A group the resumed core holds ready: False when its records no longer make it ready."""
        if group_id(g) not in self.buffer.ready_group_ids():
            return False
        self._ready_reported.add(g)
        return True

    def cancelled_before(self, x: int) -> None:
        """An execution the resumed core had cancelled: it reports cancelled (its harness, if a supervisor
        still runs it, is stopped)."""
        if self._supervised():
            self.ctx.spawn(self.ctx.parts.runner.stop_supervised(x))
        self.ctx.metrics.outcomes[x] = "cancelled"
        self._closed[x // self.ctx.cfg.group_size] += 1
        self.ctx.report(ev.ExecutionFinished, execution=x, outcome="cancelled")

    def readmit(self, x: int, exited: ExecutionResult) -> None:
        """An execution whose harness exited after the checkpoint: the finish path from its record."""
        self.running[x] = self.ctx.spawn(self._execute(x, None, exited=exited))

    def snapshot(self) -> dict[str, Any]:
        return {"dropped": sorted(self.dropped), "closed": dict(self._closed),
                "ready_reported": sorted(self._ready_reported),
                "harness_stopped_before": sorted(self.harness_stopped_before)}

    def restore(self, state: dict[str, Any]) -> None:
        self.dropped = set(state["dropped"])
        self._closed = Counter({int(g): n for g, n in state["closed"].items()})
        self._ready_reported = set(state["ready_reported"])
        self.harness_stopped_before = set(state["harness_stopped_before"])
