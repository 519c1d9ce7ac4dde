"""The SimPy driver: applies the policy core's actions and feeds it events.

``Simulation`` is the simulator's ``ActionHandler`` (``gyre.loop``): the
shared ``DriverLoop`` feeds each event to a ``gyre.scheduler.Scheduler``,
records it and calls one ``on_<action>`` method per returned action. The
driver never decides anything itself: executions carry their trace durations as work
on processor-sharing engines (``engines.py``: the rate follows each engine's load,
and the durations hold at the reference load), transitions take their
costs, the training plane (``training.py``) models micro-steps, and every
resulting event goes back to the core. Supply-timer expiries are delivered as
``Tick`` events at exactly ``core.next_deadline()``.

Harness stop: an execution's work is its trace ``harness_s`` (the duration
when the trace has no such column), of which only its ``model_call_share``
slows with its engine's load. Time limits are wall-clock deadlines
(``deadlines.py``): a timed-out row stops its harness at exactly its start
plus ``harness_s``, however loaded or rerouted, and a slow execution that
reaches the trace's ceiling is cut there as a harness timeout. When its
harness stops before its duration (evaluation retries after a harness
timeout), the driver sends ``HarnessStopped`` then, the engine stops counting
its load, and ``ExecutionFinished`` follows ``duration_s - harness_s`` wall
seconds later (evaluation uses no engine, so that tail does not scale with
load, and an overall timeout ends at its start plus its budget). A
cancellation in that tail ends the evaluation at once ("cancelled").

Invariants: every event the core receives is recorded (in order) and
replaying that log through a fresh core reproduces the same actions; every
dispatched execution that starts ends exactly once (finished or cancelled);
a run stops at the StepDone of its last step, or raises ``SimulationStalled``
naming the core's state when no event is left. Timers run on ``gyre.sim.clock``
(SimPy's order of timeouts), and Python's cyclic garbage collector is paused
while a run's loop runs and resumed after, however it ends.

Groups become ready by the rule the real trajectory buffer uses
(``gyre.trajectory.outcomes.GroupOutcomes``): each execution's trace outcome
maps to its designated outcome, the group is ready once N executions have one
(an excluded execution never blocks it), ``evaluation_s`` later. Groups named
in ``dropped_groups`` model queries that can never complete (cancelled by an
operator, task not set up): the driver reports ``GroupDropped`` as soon as
they are dispatched and the core replaces them. A cell returning to rollout
waits for a publication in flight, whichever cell it is: its engine must
serve the published weights (the real backend does the same).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
from heapq import heappop
from typing import Callable, Iterator

from gyre import actions as act
from gyre import events as ev
from gyre.actions import SEPARATE
from gyre.config import SchedulerConfig
from gyre.driver_rules import is_satellite
from gyre.formats.trace import HARNESS_COLUMN, Trace
from gyre.loop import ActionHandler, DriverLoop
from gyre.roles import ROLLOUT
from gyre.scheduler import Scheduler
from gyre.sim.clock import Chain, Clock
from gyre.sim.costs import CostModel
from gyre.sim.deadlines import TIMED_OUT, Grid, execution_plan
from gyre.sim.engines import EngineBank
from gyre.sim.record import END, OUTCOME, SimRecord, execution_row
from gyre.sim.training import SimTrainingPlane
from gyre.trajectory.outcomes import Designated, GroupOutcomes, designated_outcome


class SimulationStalled(RuntimeError):
    """No event is pending but the requested steps are not done."""


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a run, and resume it (if it ran) however the run ends.

    A run allocates a few objects per event and keeps most of them (its record) to the end; what it
    drops is freed by reference counting, so the collector finds nothing to free mid-run (peak memory
    is the same) but rescans the growing record again and again: a fifth of a sweep's CPU time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@functools.lru_cache(maxsize=8)
def trace_lists(trace: Trace) -> tuple[Grid, Grid | None, Grid | None, Grid, Grid]:
    """(durations, harness times or None, evaluation tails or None, outcomes as str, ends) by (query, index).

    An end is the row's outcome where the execution ends when its harness stops, and None where an
    evaluation tail (> 0) follows (the driver reads it once per execution).

    Plain nested lists, which the driver reads once per execution (faster than numpy's scalars). A
    Trace is never modified and a sweep simulates hundreds of schedules on one, so each trace's lists
    are built once (building them was ~2% of a sweep schedule's CPU) and shared: read them, never
    change them. A tail is ``duration_s - harness_s`` in floats (the time from the harness's stop to
    the execution's end)."""
    durations = trace.durations_s.tolist()
    harness = trace.harness_s.tolist() if HARNESS_COLUMN in trace.columns else None
    tails = None if harness is None else (trace.durations_s.astype(float) - trace.harness_s.astype(float)).tolist()
    outcomes = trace.outcomes
    grid = outcomes.tolist() if outcomes.dtype.kind == "U" else [[str(o) for o in row] for row in outcomes.tolist()]
    ends = grid if tails is None else [[None if t > 0 else o for o, t in zip(row, tail_row)]
                                       for row, tail_row in zip(grid, tails)]
    return durations, harness, tails, grid, ends


class Simulation(ActionHandler):
    def __init__(self, cfg: SchedulerConfig, trace: Trace, costs: CostModel, steps: int,
                 on_step: Callable[[int], None] | None = None, dropped_groups: frozenset[int] = frozenset()) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if trace.N != cfg.N:
            raise ValueError(f"trace has groups of {trace.N} executions but the schedule has N={cfg.N}")
        self.cfg, self.trace, self.costs, self.steps = cfg, trace, costs, steps
        self.env = Clock()
        self.core = Scheduler(cfg)
        self.record = SimRecord(cfg)
        self._execution_rows = self.record.execution_rows  # made per start, written per finish (_close)
        self.loop = DriverLoop(self.core, self, self.record.log)
        bound = costs.bind(cfg, trace)  # gyre.sim.sizes: training work, publication, sandbox start
        self.costs, self.trace = bound, bound.trace
        self.plane = SimTrainingPlane(self.env, cfg, bound, self.send)
        self._on_step = on_step
        self._done = False  # the last step is done: nothing more is fed to the core
        self.engines = EngineBank(self.env, bound.engine_curve(), self._capacity, self._execution_done)
        self._durations, self._harness, self._tails, self._outcome_grid, self._ends = trace_lists(self.trace)
        plan = execution_plan(self.trace, self.engines.curve, (cfg.C_e, cfg.C_s))
        self._work, self._shares, self._limits, self.ceiling_s, self._plan_cells = plan
        self._deadlines: dict[int, float] = {}  # execution -> wall-clock time its harness must stop
        self._deadline_calls = Chain(self.env)  # start + limit: in order of start, mostly (the limit is the ceiling)
        self._cut: set[int] = set()  # stopped at the ceiling before their work was done: harness timeouts
        self._evaluating: set[int] = set()  # harness stopped, evaluation tail still running
        self._outcomes: dict[int, GroupOutcomes[int]] = {}  # dispatched groups not ready yet
        self._evaluated: dict[int, GroupOutcomes[int]] = {}  # ready groups whose evaluation is under way
        self._dropped = frozenset(dropped_groups)
        self._tick_at = -math.inf  # the supply deadline a Tick is armed for (-inf: none; a float, cheap to compare)
        self._publish_until = 0.0
        tokens = trace.column("output_tokens")  # each query's sum, once (int64 sums: exact, as np.sum per group)
        self._query_tokens = None if tokens is None else tokens.sum(axis=1).tolist()
        self._group_size = cfg.group_size  # hot: read per execution (Scheduler.group_of is x // group_size)
        self._N, self._rows = cfg.N, len(self._durations)  # the trace's queries: read per execution too
        self._tau = cfg.tau
        self._designated: dict[str, Designated] = {}  # trace outcome -> designated_outcome(it), read per finish
        # read per group and per reroute: BoundCosts reads them through its __getattr__ (a failed lookup first)
        self._evaluation_s, self._reroute_s = bound.evaluation_s, bound.reroute_recompute_s

    # ---- running ---------------------------------------------------------------
    def run(self) -> SimRecord:
        for cell in range(self.cfg.static_train_cells):
            self.plane.join(cell)
        with cyclic_gc_paused():
            self.send(ev.Begin(0.0))
            clock = self.env
            queue = clock.queue  # Clock.step, inlined: this loop runs once per scheduled call
            while not self._done:
                try:
                    clock.now, _, fn, args = heappop(queue)
                except IndexError:  # nothing is scheduled (a try costs nothing until it raises)
                    raise SimulationStalled(self._stall_message()) from None
                fn(*args)
        self.record.close(self.env.now)
        return self.record

    def _stall_message(self) -> str:
        s = self.core
        return (f"simulation stalled at t={self.env.now:.1f}s after {s.version} of {self.steps} steps: "
                f"d={s.d} p={s.p} f={s.f} roles={s.roles} ready={s.ready_unclaimed} "
                f"batch_open={s.batch_open} fed={s.fed}")

    def send(self, event: ev.Event) -> None:
        """Feed one event through the driver loop (the core's actions come back as on_* calls)."""
        if type(event) is not ev.StepDone:
            self._send(event)
            return
        if self._done:
            return
        self.loop.feed(event)
        self.engines.flush()
        self.record.step_finished(event.version, event.now)
        if self._on_step:
            self._on_step(self.core.version)
        if self.core.version >= self.steps:
            self._done = True
            return
        self._schedule_tick()

    def _send(self, event: ev.Event) -> None:
        """``send`` for any event but a StepDone (an execution's finish sends here directly: once per event)."""
        if self._done:
            return
        self.loop.feed(event)
        self.engines.flush()
        since = self.core.supply_since
        if since is not None:  # _schedule_tick's first tests, here: they end it after most events
            due = since + self._tau
            if due != self._tick_at and due > self.core.now:  # type: ignore[operator]  # set by the feed
                self._schedule_tick()

    def _schedule_tick(self) -> None:
        core = self.core
        since = core.supply_since
        if since is None:
            return  # no supply timer runs: next_deadline() is None (the common case, checked without it)
        # next_deadline() is None or since + tau; either way nothing is to be done when that time is past
        # or already armed (most events while a timer runs), so the rule is asked only otherwise
        due, now = since + self._tau, core.now
        assert now is not None  # the core has taken an event: its time is set
        if due == self._tick_at or due <= now:
            return
        deadline = core.next_deadline()
        if deadline is None or deadline == self._tick_at:
            return
        self._tick_at = deadline
        self.env.call_in(deadline - self.env.now, self._tick, deadline)

    def _tick(self, deadline: float) -> None:
        if self._tick_at == deadline:
            self._tick_at = -math.inf
            self.send(ev.Tick(self.env.now))

    # ---- applying actions (one on_* method per action kind) ---------------------------
    def on_dispatch_groups(self, a: act.DispatchGroups) -> None:
        for g in a.groups:
            self.record.group_dispatched(g, self.trace.query_at(g).query_id, a.version, self.env.now,
                                         self._group_tokens(g))
            self._outcomes[g] = GroupOutcomes(self.cfg.N)
            if g in self._dropped:
                self._after(0.0, functools.partial(self._drop, g))

    def on_start_executions(self, a: act.StartExecutions) -> None:
        start, records, cell, size, now = (self.engines.start_planned, self._execution_rows, self._cell,
                                           self._group_size, self.env.now)
        plan, N, rows = self._plan_cells, self.cfg.N, len(self._durations)
        for x, engine in a.placements:
            g, i = divmod(x, size)
            q, i = (g % rows, i) if i < N else cell(x)  # _cell's first case (no surplus), inlined
            work, share, limit = plan[q][i]
            start(x, engine, work, share)
            if limit is not None:  # it can reach its ceiling: a wall-clock deadline ends its harness
                self._arm_deadline(x, now + limit)
            records[x] = execution_row(x, g, engine, now)

    def _arm_deadline(self, x: int, at: float) -> None:
        self._deadlines[x] = at
        self._deadline_calls.call_in(at - self.env.now, self._deadline_due, x, at)

    def _deadline_due(self, x: int, at: float) -> None:
        """``x``'s harness ceiling (its start plus the limit, however loaded or rerouted) has come."""
        if self._deadlines.get(x) != at:
            return  # finished or cancelled meanwhile
        del self._deadlines[x]
        remaining = self.engines.remove(x)
        if remaining > 1e-6 * max(1.0, at) and not self._stuck(x):
            self._cut.add(x)  # a slow execution cut at the ceiling: a harness timeout, not its trace outcome
        self._execution_done(x)

    def _stuck(self, x: int) -> bool:
        q, i = self._cell(x)
        return self._outcome_grid[q][i] in TIMED_OUT

    def _cell(self, x: int) -> tuple[int, int]:
        """The trace row and column of execution ``x``."""
        g, i = divmod(x, self._group_size)
        if i < self.cfg.N:
            return g % len(self._durations), i
        return (g + 1) % len(self._durations), i % self.cfg.N  # oversampling surplus

    def _duration(self, x: int) -> float:
        """Seconds ``x``'s harness runs by its trace (the reference load, or its ceiling when stuck)."""
        q, i = self._cell(x)
        return float((self._durations if self._harness is None else self._harness)[q][i])

    def _evaluation_tail(self, x: int) -> float:
        """Seconds from ``x``'s harness stop to its end (0 without a ``harness_s`` column)."""
        if self._tails is None:
            return 0.0
        q, i = self._cell(x)
        return self._tails[q][i]

    def _capacity(self, engine: int) -> int:
        return self.cfg.C_s if engine == SEPARATE else self.cfg.C_e

    def _group_tokens(self, g: int) -> float:
        sums = self._query_tokens
        if sums is None:
            return float(self.cfg.N)
        return float(sums[g % len(sums)])

    def _execution_done(self, x: int) -> None:
        """``x``'s harness stopped (work done, or its deadline): it ends now, or evaluates first."""
        self._deadlines.pop(x, None)
        g, i = divmod(x, self._group_size)
        q, i = (g % self._rows, i) if i < self._N else self._cell(x)  # _cell's first case, inlined
        outcome = self._ends[q][i]  # None: an evaluation tail follows (_evaluation_tail > 0), read once per execution
        if outcome is None:
            self._evaluating.add(x)
            self.record.harness_stopped(x, self.env.now)
            self.send(ev.HarnessStopped(self.env.now, x))
            self._after(self._tails[q][i], lambda: self._evaluation_done(x))  # type: ignore[index]  # a tail
        else:  # _finish, inlined
            self._close(x, "harness_timeout" if x in self._cut else outcome)

    def _evaluation_done(self, x: int) -> None:
        if x in self._evaluating:  # not cancelled meanwhile
            self._evaluating.discard(x)
            self._finish(x)

    def _finish(self, x: int) -> None:
        q, i = self._cell(x)
        outcome = "harness_timeout" if x in self._cut else self._outcome_grid[q][i]
        self._close(x, outcome)

    def _close(self, x: int, outcome: str) -> None:
        now = self.env.now
        row = self._execution_rows[x]  # the row on_start_executions made: its end and outcome
        row[END] = now
        row[OUTCOME] = outcome
        self._send(ev.ExecutionFinished(now, x, outcome))
        g = x // self._group_size
        outcomes = self._outcomes.get(g)  # gone once the group is ready
        if outcomes is None or outcome == "cancelled" or g in self._dropped:
            return  # cancelled work and late surplus have no designated outcome
        designated = self._designated.get(outcome)
        if designated is None:
            designated = self._designated[outcome] = designated_outcome(outcome)
        if outcomes.resolve(x, designated):  # keyed by the integer: counts only, no string id per execution
            self._evaluated[g] = self._outcomes.pop(g)
            self.env.call_in(self._evaluation_s, self._group_ready, g)  # _after, without a closure

    def _group_ready(self, g: int) -> None:
        outcomes = self._evaluated.pop(g)
        excluded = len(outcomes.excluded)  # participants + excluded == N once ready (GroupOutcomes' invariant)
        self.record.group_ready(g, self.env.now, outcomes.N - excluded, excluded)
        self.send(ev.GroupReady(self.env.now, g))

    def _drop(self, g: int) -> None:
        self.record.group_dropped(g, self.env.now)
        self.send(ev.GroupDropped(self.env.now, g))

    def on_cancel_executions(self, a: act.CancelExecutions) -> None:
        for x in a.executions:
            self._deadlines.pop(x, None)
            if x in self.engines:
                self.engines.remove(x)
                self._after(0.0, functools.partial(self._close, x, "cancelled"))
            elif x in self._evaluating:  # harness already stopped: its evaluation is cancelled
                self._evaluating.discard(x)
                self._after(0.0, functools.partial(self._close, x, "cancelled"))

    def on_reroute(self, a: act.Reroute) -> None:
        self.record.reroute(a.execution, a.source, a.dest, self.env.now)
        if a.execution in self.engines:
            self.engines.move(a.execution, a.dest, self._reroute_s)

    def on_begin_transition(self, a: act.BeginTransition) -> None:
        self.record.role(a.cell, "to_" + a.role, self.env.now)
        satellite = is_satellite(self.cfg, a.cell)
        if a.role == "rollout":
            self.plane.leave(a.cell)
            start = max(self.env.now, self._publish_until)
            delay = start - self.env.now + self.costs.transition_s("rollout", satellite)
        else:
            delay = self.costs.transition_s("training", satellite)
        self._after(delay, lambda: self._transition_done(a.cell, a.role))

    def _transition_done(self, cell: int, role: str) -> None:
        self.record.role(cell, role, self.env.now)
        if role == "training":
            satellite = is_satellite(self.cfg, cell)
            self.plane.join(cell, self.costs.weight_pull_s if satellite else 0.0)
        self.send(ev.TransitionDone(self.env.now, cell, role))

    def on_start_batch(self, a: act.StartBatch) -> None:
        self.record.step_started(a.version, self.env.now, len(self.core.training_cells()))
        self.plane.start_batch(a.version)

    def on_feed_groups(self, a: act.FeedGroups) -> None:
        self.record.groups_fed(a.groups, a.version, self.env.now)
        self.plane.feed(a.version, a.groups)

    def on_broadcast(self, a: act.Broadcast) -> None:
        self.plane.hold(a.cells, self.costs.broadcast_s)

    def on_publish(self, a: act.Publish) -> None:
        seconds = self.costs.publish_s
        if self.costs.publish_engine_s:  # grows with the engines that load the weights
            engines = sum(role == ROLLOUT for role in self.core.roles) + (self.cfg.C_s > 0)
            seconds += engines * self.costs.publish_engine_s
        self._publish_until = self.env.now + seconds
        self.record.published(a.version, self.env.now)
        self._after(seconds, lambda: self._publish_done(a.version))

    def _publish_done(self, version: int) -> None:
        self.record.publish_done(self.env.now)
        self.send(ev.PublishDone(self.env.now, version))

    def _after(self, seconds: float, fn: Callable[[], None]) -> None:
        self.env.call_in(seconds, fn)

