"""RealBackend: the policy core's actions applied to real engines, proxy, harnesses and cells.

``RealBackend`` is the real world's ``gyre.loop.ActionHandler``: the
controller's driver loop calls one ``on_<action>`` method per action on its
event loop, one action at a time, in the order the core returned them. It
never blocks: quick loopback calls (proxy admin API) run inline, everything
slow (harness processes, SGLang memory calls, training-cell commands) runs as
an asyncio task whose completion is reported back with
``controller.report(EventClass, **fields)``.

| action                         | real effect                                               | report            |
|--------------------------------|-----------------------------------------------------------|-------------------|
| DispatchGroups                 | set up each group's task and open the group in the        | GroupDropped      |
|                                | trajectory buffer (v_d recorded); a task that cannot be   |                   |
|                                | set up (``TaskUnavailable``) drops its group              |                   |
| StartExecutions                | keys + routes (one admin call), HarnessRunner tasks; at   | HarnessStopped,   |
|                                | exit: records -> tree, close + evaluate with retries       | ExecutionFinished,|
|                                | (``harness.evaluation``) within the execution's budget     | GroupReady        |
| CancelExecutions               | ``runner.cancel`` (the run then reports as cancelled);    | ExecutionFinished |
|                                | an evaluation in retries is cancelled                     |                   |
| Reroute                        | proxy route change (in-flight requests move)              |                   |
| BeginTransition(c, training)   | drain c's engine, wait idle, quiesce, release_memory,      | TransitionDone   |
|                                | enter_training                                             |                  |
| BeginTransition(c, rollout)    | leave_training, resume_memory, load newest weights,       | TransitionDone   |
|                                | undrain                                                    |                  |
| StartBatch(v, final)           | ``step`` sent to the core cell (claims as groups arrive); | StepDone,         |
|                                | streaming: the packer asks for its first group            | GroupWanted       |
| FeedGroups(v, gs)              | admission + packing of exactly these groups into batch v; | GroupWanted       |
|                                | streaming: it asks for the next group until B are packed  |                   |
| Broadcast                      | carried out by the core cell at the end of the step       |                   |
| Publish(v)                     | HF checkpoint + update_weights_from_disk on rollout engines| PublishDone      |

Invariants: engine ``c`` (cell c) is named ``engine_names[c]``, the separate
pool ``engine_names[SEPARATE]``; every plane command is *sent* on the loop
thread in action order (per-cell command order = action order); an engine
leaves training only after the newest published checkpoint is loaded into it;
each group's v_d (DispatchGroups) and v_t (FeedGroups) are kept for the
staleness measurement; every group is fed to the packer exactly once; a
dropped group's executions start no harness and finish "cancelled" when the
core cancels them; ``on_step(version)`` (live metrics: ``runtime.metrics``)
runs once per step, after its report is in ``metrics`` and before ``StepDone``
is reported. Every time the backend reads comes from its ``clock``
(default ``time.monotonic``; the differential tests pass a virtual one).

Engine deaths: with an engine watch (``Parts.watch``, ``runtime.engine_watch``)
a transition's engine calls run through ``watch.engine_ops`` (serialised with
the watch's restart of that engine; a dead engine is revived first, one whose
restart failed is skipped), a publish skips the engines the watch reports
unavailable (they are revived with the newest weights), and when an engine dies
while the core cell loads the new checkpoint into it, the backend loads it into
the engines still alive itself.

Resume hooks (``runtime.restore``): ``on_burst_end(version)`` runs at the start of
``on_publish`` (the resume checkpoint is sent to the core cell before the
publication); ``_execute(x, key, exited=result)`` finishes an execution whose
harness already exited (a resumed run re-admits it from its record); an
execution in ``harness_stopped_before`` never reports ``HarnessStopped`` again.

Harness stop: the evaluator runs after the harness process has exited. When
its first attempt leaves the execution pending (evaluator failure: retries
within the budget follow), the backend reports ``HarnessStopped`` then and
``ExecutionFinished`` when the evaluation ends, so the core hands the
execution's rollout slot to a queued execution meanwhile: the simulator's
rule for a trace row with ``harness_s < duration_s``. An evaluation that
ends on its first attempt reports only ``ExecutionFinished`` (the slot is
held through that one attempt). Cancelling an execution whose evaluation is
retrying cancels the evaluation: it reports ExecutionFinished("cancelled"),
as the simulator does.

Streaming (SPEC 3.6): the stream packing buffer pulls one group at a time
when it runs short, by the simulator's rule (``sim.training``): with no ask
outstanding, while the open batch has fewer than B groups fed and its queued
(emitted, unclaimed) micro-steps are fewer than the cells in the training
role, it reports one ``GroupWanted``. The rule is evaluated when a
batch opens, after each fed group is packed, when a cell enters or leaves
training and whenever the cells claim from the queue (``_queue_changes``, the
one polling point, which test doubles answer at the claim's own time). So
ready groups can wait unclaimed while the cells are busy, as the supply rule
(SPEC 3.3) expects, and satellites join as the simulator predicts. With
streaming off the core feeds a burst's groups itself (SPEC 3.7) and the packer
never asks.
"""

from __future__ import annotations

import asyncio
from collections import Counter
import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gyre import actions as act
from gyre import events as ev
from gyre.driver_rules import asks_for_group, is_satellite
from gyre.ids import execution_id, group_id, query_id
from gyre.loop import ActionHandler
from gyre.real.harness.evaluation import close_and_evaluate
from gyre.real.harness.runner import HarnessRunner
from gyre.real.runtime.trace import ExecutionResult as TraceResult
from gyre.real.runtime.trace import counts_from_calls
from gyre.trajectory.evaluation import EvalState
from gyre.trajectory.groups import ReadyGroup, TrajectoryBuffer
from gyre.trajectory.packing import StreamPacker
from gyre.trajectory.harness_roles import GenericRoles
from gyre.real.store.tito_log import ExecutionStore
from gyre.staleness import staleness_by_group

PROXY_WAIT_S = 120.0  # how long an admin call waits for a proxy that is restarting


class TaskUnavailable(RuntimeError):
    """A task source cannot set up a group's task (raised by ``task(query_id)``): the group is dropped."""


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


class RealBackend(ActionHandler):
    def __init__(self, cfg, parts: Parts, *, seed: int, token_budget: int,
                 progress: Callable[[str], None] | None = None, steps: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.parts, self.clock = cfg, parts, clock
        self.progress, self._of = progress or (lambda line: None), "" if steps is None else f"/{steps}"
        self.buffer = PickingBuffer(cfg.N)
        self.packer = StreamPacker(self.buffer, GenericRoles(), groups_per_batch=cfg.B,
                                   token_budget=token_budget, seed=seed)
        self.store = ExecutionStore(parts.records_dir)
        self.metrics = Metrics()
        self.controller = None
        self.tasks: set[asyncio.Task] = set()
        self.running: dict[int, asyncio.Task] = {}
        self.rollout_ready: set[int] = set(parts.engine_names)   # engines taking work now
        self.latest: tuple[int, str] | None = None               # newest published (version, path)
        self._publishing: asyncio.Task | None = None
        self._ready_reported: set[int] = set()
        self._closed: Counter[int] = Counter()  # ExecutionFinished reported, per group
        self._step_sent: dict[int, float] = {}
        self._packed = 0  # groups packed into the open batch
        # the stream packing buffer's asking rule (SPEC 3.6, the simulator's sim.training rule):
        self._open: int | None = None                                 # version of the open batch
        self._wanted = 0                                              # asked for, not fed yet
        self._members: set[int] = set(range(cfg.static_train_cells))  # cells in the training role
        self._tasks: dict[int, Any] = {}  # group -> its task, set up once at dispatch
        self.dropped: set[int] = set()    # groups whose task could not be set up (GroupDropped)
        self._unstarted_futures: dict[int, asyncio.Future] = {}
        self._evaluating: dict[int, asyncio.Future] = {}  # harness stopped, retrying: set to cancel
        self._stopped_at: dict[int, float] = {}  # when HarnessStopped was reported (clock), for the trace
        self._start_s: dict[int, float] = {}  # when StartExecutions was applied (runner's clock), for the trace
        self._route: dict[int, str] = {}  # running execution -> its engine, to put back in a restarted proxy
        self.errors: list[str] = []
        self.errors_after_stop: list[str] = []  # waits abandoned when the run ended (not failures of the run)
        self._stopped = False
        self.on_step: Callable[[int], None] = lambda version: None  # live metrics (runtime.metrics)
        # a burst's end, before its publication is sent (the resume checkpoint: runtime.resume)
        self.on_burst_end: Callable[[int], None] = lambda version: None
        self.harness_stopped_before: set[int] = set()  # resumed: HarnessStopped already in the replayed log

    def bind(self, controller) -> "RealBackend":
        self.controller = controller
        return self

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            (self.errors_after_stop if self._stopped else self.errors).append(repr(task.exception()))

    def _report(self, kind, **fields) -> None:
        self.controller.report(kind, **fields)

    def admin(self, method: str, path: str, body: dict | None = None) -> Any:
        """One admin API call; while the proxy is down (restarting: ``runtime.proxy_process``) it is
        retried for up to ``PROXY_WAIT_S`` (every admin call is idempotent or, for a key, replaceable)."""
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + PROXY_WAIT_S
        while True:
            request = urllib.request.Request(self.parts.proxy_url + path, data=data, method=method,
                                             headers={"Authorization": f"Bearer {self.parts.admin_token}",
                                                      "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError:
                raise
            except (urllib.error.URLError, ConnectionError, http.client.RemoteDisconnected):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def reapply_proxy_state(self) -> None:
        """A restarted proxy (``runtime.proxy_process``) kept keys and records on disk but nothing in memory:
        put back the policy version, the drains of engines not taking work, the holds of engines not back
        (``gate_engine``), the routes of running executions."""
        if self.latest is not None:
            self.admin("POST", "/admin/policy_version", {"version": self.latest[0]})
        down = self.parts.watch.unavailable() if self.parts.watch is not None else set()
        for cell, name in self.parts.engine_names.items():
            if cell not in self.rollout_ready:
                self.admin("POST", f"/admin/engines/{name}/drain", {"evacuate": False})
            if name in down:
                self.admin("POST", f"/admin/engines/{name}/hold")
        for x in list(self.running):
            if x in self._route:
                self.admin("POST", "/admin/routes", {"execution_id": execution_id(x), "engine": self._route[x]})

    # ---- executions -----------------------------------------------------------------
    def on_dispatch_groups(self, a: act.DispatchGroups) -> None:
        for g in a.groups:
            self.metrics.v_d[g] = a.version
            try:
                self._tasks[g] = self.parts.task.task(query_id(g))
            except TaskUnavailable as exc:  # the group can never complete: the core replaces it
                self.dropped.add(g)
                self.progress(f"group {group_id(g)} dropped: {exc}")
                self._report(ev.GroupDropped, group=g)
                continue
            ids = [execution_id(x) for x in range(g * self.cfg.group_size, (g + 1) * self.cfg.group_size)]
            deadline = self.clock() + self.parts.runner.budgets.overall_timeout_s  # each execution's budget
            self.buffer.open_group(group_id(g), a.version, ids, deadline=deadline)

    def on_start_executions(self, a: act.StartExecutions) -> None:
        # the core's start instant, on the runner's clock (the event loop's: time.monotonic() for asyncio's own):
        # the trace's durations count the backend's start latency (key, route, workspace, spawn) as the simulator does
        # one admin call for the whole action (keys and routes): per-execution calls held the loop ~1.8 s per
        # burst of 16 on 2 cores, and the StartBatch behind it waited, a delay the simulator does not have
        started = asyncio.get_running_loop().time()
        routes = {x: self.parts.engine_names[engine] for x, engine in a.placements}
        if not routes:
            return
        keys = self.admin("POST", "/admin/executions/start", {"executions": [
            {"execution_id": execution_id(x), "engine": name} for x, name in routes.items()]})["api_keys"]
        for x, name in routes.items():
            self._start_s[x] = started
            self._route[x] = name
            self.running[x] = self._spawn(self._execute(x, keys[execution_id(x)]))

    async def _execute(self, x: int, key: str, exited=None) -> None:
        """Run ``x``'s harness (or, resumed, take ``exited``: the result of a harness that already exited),
        then record, evaluate and report it."""
        g = x // self.cfg.group_size
        if g in self.dropped:  # nothing to run: wait for the core's CancelExecutions
            self._start_s.pop(x, None)
            await self._unstarted(x)
            self.running.pop(x, None)
            self.metrics.outcomes[x] = "cancelled"
            self._report(ev.ExecutionFinished, execution=x, outcome="cancelled")
            self._closed[g] += 1
            return
        result = exited if exited is not None else await self.parts.runner.run(x, self._tasks[g], key)
        self.running.pop(x, None)
        self._route.pop(x, None)
        eid, outcome = execution_id(x), result.outcome
        calls = await asyncio.to_thread(self.store.read, eid) if self.store.path_for(eid).exists() else []
        self.metrics.move_stalls_ms += [float(v) for c in calls
                                        for v in c.role_hints.get("move_stalls_ms", "").split(",") if v]
        evaluated_s, stopped_s = 0.0, None  # evaluation time, and when its retries began (both after the exit)
        if group_id(g) in self.buffer._groups and g not in self._ready_reported:
            for call in calls:
                self.buffer.add(call)
            before = self.clock()
            state = await self._evaluate(x, result.workspace)
            evaluated_s = self.clock() - before
            stopped_s = self._stopped_at.pop(x, None)
            stopped_s = None if stopped_s is None else stopped_s - before
            if state is None:  # cancelled by the core while its evaluation was retrying
                outcome = "cancelled"
            elif state is EvalState.INVALID:  # SPEC 4.3: excluded, and its group still becomes ready
                outcome = "overall_timeout"
                self.metrics.excluded.append(x)
                self.progress(f"execution {eid} excluded: {self.buffer.evaluation(eid).exclusion_reason}")
        self.metrics.outcomes[x] = outcome
        self.metrics.trace.append(TraceResult(query_id=g, execution_index=x - g * self.cfg.group_size,
                                              start_s=self._start_s.pop(x, result.started_at),
                                              end_s=result.ended_at + evaluated_s,
                                              harness_end_s=None if stopped_s is None else result.ended_at + stopped_s,
                                              outcome=outcome, **counts_from_calls(calls)))
        self._report(ev.ExecutionFinished, execution=x, outcome=outcome)
        self._closed[g] += 1
        # Ready only once every execution's finish is reported: evaluations run as tasks, so a group's
        # buffer can turn ready while another execution's ExecutionFinished is still to come (the core
        # refuses a GroupReady before N of its executions closed).
        if g not in self._ready_reported and self._closed[g] >= self.cfg.N \
                and group_id(g) in self.buffer.ready_group_ids():
            self._ready_reported.add(g)
            self._report(ev.GroupReady, group=g)

    async def _evaluate(self, x: int, workspace: Path) -> EvalState | None:
        """Close and evaluate ``x``; report HarnessStopped if it goes into retries. None: cancelled then."""
        cancelled = asyncio.get_running_loop().create_future()

        def harness_stopped() -> None:
            self._evaluating[x] = cancelled
            self._stopped_at[x] = self.clock()
            if x not in self.harness_stopped_before:  # a resumed run's core already holds it stopped
                self._report(ev.HarnessStopped, execution=x)

        evaluation = self._spawn(close_and_evaluate(self.buffer, self.parts.task, execution_id(x), workspace,
                                                    self.clock, on_pending=harness_stopped))
        try:
            await asyncio.wait({evaluation, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._evaluating.pop(x, None)
            if not evaluation.done():
                evaluation.cancel()
        return evaluation.result() if evaluation.done() else None

    def on_cancel_executions(self, a: act.CancelExecutions) -> None:
        for x in a.executions:
            if x // self.cfg.group_size in self.dropped:
                self._unstarted(x).set_result(None)
            elif x in self._evaluating:  # harness stopped, evaluation retrying: cancel the evaluation
                self._evaluating.pop(x).set_result(None)
            else:
                self._spawn(self.parts.runner.cancel(x))

    def _unstarted(self, x: int) -> asyncio.Future:
        """The cancellation of an execution of a dropped group, which never started a harness."""
        return self._unstarted_futures.setdefault(x, asyncio.get_running_loop().create_future())

    def on_reroute(self, a: act.Reroute) -> None:
        t0 = self.clock()
        self._route[a.execution] = self.parts.engine_names[a.dest]
        self.admin("POST", "/admin/routes", {"execution_id": execution_id(a.execution),
                                             "engine": self.parts.engine_names[a.dest]})
        self.metrics.reroutes.append({"execution": a.execution, "source": a.source, "dest": a.dest,
                                      "admin_s": self.clock() - t0})

    # ---- role transitions -----------------------------------------------------------
    def on_begin_transition(self, a: act.BeginTransition) -> None:
        self._members.discard(a.cell)
        if a.role == "training":
            self.rollout_ready.discard(a.cell)
            self.metrics.in_flight_at_transition.append(len(self.running))
            self._spawn(self._to_training(a.cell))
        else:
            ticket = self.parts.plane.send(a.cell, "leave_training")
            self._spawn(self._to_rollout(a.cell, ticket))

    async def _to_training(self, cell: int) -> None:
        t0, name = self.clock(), self.parts.engine_names[cell]
        self.admin("POST", f"/admin/engines/{name}/drain", {"evacuate": False})
        while any(e["id"] == name and e["in_flight"] for e in self.admin("GET", "/admin/engines")["engines"]):
            await asyncio.sleep(0.05)
        t_idle = self.clock()
        # idle by construction: release cannot race
        await self._engine_ops(name, "training", self.parts.engines.quiesce, self.parts.engines.release_memory)
        satellite = is_satellite(self.cfg, cell)
        # a satellite holds until the core has acted on its TransitionDone: if its burst ended
        # meanwhile the core sends it straight back, and it must not join the next burst's step
        ticket = self.parts.plane.send(cell, "enter_training", **({"hold": True} if satellite else {}))
        await asyncio.to_thread(ticket.result)
        self.metrics.transitions.append({"cell": cell, "role": "training", "wait_idle_s": t_idle - t0,
                                         "total_s": self.clock() - t0})
        self._members.add(cell)
        self._report(ev.TransitionDone, cell=cell, role="training",
                     then=(lambda: self._release_hold(cell)) if satellite else None)
        self._ask_for_groups()

    def _release_hold(self, cell: int) -> None:
        """The core kept ``cell`` in training (no BeginTransition back): it may join steps now."""
        if cell in self._members:
            self.parts.plane.send(cell, "join")

    async def _to_rollout(self, cell: int, ticket) -> None:
        t0, name = self.clock(), self.parts.engine_names[cell]
        await asyncio.to_thread(ticket.result)
        await self._engine_ops(name, "rollout", self.parts.engines.resume_memory)
        t_wait = self.clock()
        if self._publishing is not None:
            await asyncio.shield(self._publishing)
        publish_wait_s = self.clock() - t_wait  # the simulator models this wait itself, not as transition cost
        if self.latest is not None:
            version, path = self.latest
            await self._engine_ops(name, "rollout", lambda engine: self.parts.engines.update_weights_from_disk(
                engine, path, weight_version=str(version)))
        self.admin("POST", f"/admin/engines/{name}/undrain")  # (still held while the watch revives it)
        self.rollout_ready.add(cell)
        self.metrics.transitions.append({"cell": cell, "role": "rollout", "total_s": self.clock() - t0,
                                         "publish_wait_s": publish_wait_s})
        self._report(ev.TransitionDone, cell=cell, role="rollout")

    def gate_engine(self, name: str, serving: bool) -> None:
        """The engine watch's gate (``runtime.engine_watch``): a dead engine is held in the proxy (its calls
        go elsewhere or wait; the core's routes to it are still taken) until it is back with the newest
        weights. Apart from the role's drain, so each is undone by its own owner."""
        self.admin("POST", f"/admin/engines/{name}/{'release' if serving else 'hold'}")

    async def _engine_ops(self, name: str, role: str, *ops: Callable[[str], Any]) -> None:
        """Blocking engine calls ``op(name)``, in order, off the loop; with an engine watch, serialised with
        its restarts of ``name`` (a dead engine is revived first; a lost one is skipped)."""
        if self.parts.watch is not None:
            await self.parts.watch.engine_ops(name, role, *ops)
            return
        for op in ops:
            await asyncio.to_thread(op, name)

    # ---- training ---------------------------------------------------------------------
    def on_start_batch(self, a: act.StartBatch) -> None:
        ticket = self.parts.plane.send(0, "step", version=a.version, final=a.final)
        self._step_sent[a.version] = self.clock()
        self._spawn(self._await_step(a.version, ticket))
        self._packed, self._wanted, self._open = 0, 0, a.version
        if self.cfg.streaming:
            self._ask_for_groups()
            self._spawn(self._watch_queue(a.version))

    # ---- streaming: ask for the next group when the micro-step queue runs short -------
    def _queued(self, version: int) -> int:
        """Micro-steps of batch ``version`` emitted and not claimed yet."""
        return self.parts.plane.queues.queue(version).ready_count()

    def _ask_for_groups(self) -> None:
        """SPEC 3.6, exactly the simulator's rule: one group at a time, when the queue runs short.

        Ask when no ask is outstanding, the batch still needs groups, and fewer micro-steps
        are queued than cells are training."""
        version = self._open
        if not self.cfg.streaming or version is None:
            return
        if asks_for_group(asked=self._wanted, fed=self._packed, batch_size=self.cfg.B,
                          queued=self._queued(version), training_cells=len(self._members)):
            self._wanted = 1
            self._report(ev.GroupWanted)

    async def _queue_changes(self, version: int, depth: int) -> int:
        """Wait until batch ``version``'s queue depth differs from ``depth`` (cells claim); the new depth.

        The real cells claim from a shared directory, so this polls it; a test double at the
        outer edge answers at the claim's own time instead."""
        while self._open == version:
            now = self._queued(version)
            if now != depth:
                return now
            await asyncio.sleep(self.QUEUE_POLL_S)
        return depth

    QUEUE_POLL_S = 0.02

    async def _watch_queue(self, version: int) -> None:
        depth = self._queued(version)
        while self._open == version and self._packed < self.cfg.B:
            depth = await self._queue_changes(version, depth)
            self._ask_for_groups()

    async def _await_step(self, version: int, ticket) -> None:
        report = await asyncio.to_thread(ticket.result, 3600.0)
        self.metrics.steps[version] = {"loss": report["loss"], "participants": report["participants"],
                                       "microsteps": report["microsteps"],
                                       "microsteps_by_cell": report.get("by_cell", {}),
                                       "compute_s_by_cell": report.get("compute_s", {}),
                                       "update_s": report.get("update_s"), "joins": report.get("joins", {}),
                                       "wall_s": self.clock() - self._step_sent[version]}
        rewards = self.metrics.rewards.get(version, [])
        reward = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        self.progress(f"step {version + 1}{self._of}: loss {report['loss']:.4f}, mean reward {reward}, "
                      f"cells {report['participants']}, {self.metrics.steps[version]['wall_s']:.2f} s")
        if self._open == version:
            self._open = None
        self.on_step(version)  # the step's metrics are on disk before the core hears of it
        self._report(ev.StepDone, version=version)

    def on_feed_groups(self, a: act.FeedGroups) -> None:
        for g in a.groups:
            self.metrics.v_t[g] = a.version
            self.buffer.want = group_id(g)
            state = self.packer.step(self.parts.plane.queues)
            self.buffer.want = None
            if state == "waiting":
                raise RuntimeError(f"group {g} fed but not ready in the trajectory buffer")
            popped = self.buffer.popped[-1]
            self.metrics.rewards.setdefault(a.version, []).extend(e.reward for e in popped.executions
                                                                  if e.reward is not None)
        self._packed += len(a.groups)
        self._wanted = max(0, self._wanted - len(a.groups))
        self._ask_for_groups()

    def on_broadcast(self, a: act.Broadcast) -> None:
        """The core cell broadcasts to its seated satellites at the end of every non-final step."""

    def on_publish(self, a: act.Publish) -> None:
        self.on_burst_end(a.version)  # sent to the core cell first: it still holds exactly this version
        skip = self.parts.watch.unavailable() if self.parts.watch is not None else set()  # dead: revived later
        names = [n for n in (self.parts.engine_names[c] for c in sorted(self.rollout_ready)) if n not in skip]
        ticket = self.parts.plane.send(0, "publish", version=a.version,
                                       endpoints=[self.parts.engines.engines[n].url for n in names],
                                       directory=str(self.parts.checkpoint_dir))
        self._publishing = self._spawn(self._await_publish(a.version, ticket, names))

    async def _await_publish(self, version: int, ticket, names: list[str]) -> None:
        t0, n = self.clock(), len(names)
        try:
            answer = await asyncio.to_thread(ticket.result, 600.0)
        except Exception as exc:  # an engine died while the cell loaded the checkpoint into it: load the rest here
            answer = await self._publish_past_dead_engine(version, names, exc)
        self.latest = (version, answer["path"])
        self.metrics.publishes.append({"version": version, "engines": n, "wall_s": self.clock() - t0})
        self.admin("POST", "/admin/policy_version", {"version": version})
        self._report(ev.PublishDone, version=version)

    async def _publish_past_dead_engine(self, version: int, names: list[str], error: Exception) -> dict:
        """The checkpoint of ``version`` is written; load it into the engines still alive (the engine watch
        revives the dead one with it). Re-raises the publish's error when no engine of ``names`` died."""
        watch = self.parts.watch
        if watch is None or not set(names) & watch.unavailable():
            raise error
        from gyre.real.train.publish import checkpoint_folder

        path = checkpoint_folder(self.parts.checkpoint_dir, version)
        if not path.is_dir():
            raise error
        self.progress(f"publish {version}: engine(s) {sorted(set(names) & watch.unavailable())} died during the "
                      f"load; loading the rest from {path}")
        for name in names:
            if name not in watch.unavailable():
                await asyncio.to_thread(self.parts.engines.update_weights_from_disk, name, str(path),
                                        weight_version=str(version))
        return {"path": str(path)}

    # ---- shutdown -----------------------------------------------------------------------
    async def stop(self) -> None:
        """Cancel harnesses still running (the run is over) and wait for every task."""
        self._stopped = True
        for x in list(self.running):
            await self.parts.runner.cancel(x)
        # Commands the finished run will never see answered (e.g. a step opened for the next
        # burst's batch) must not hold the process up: their waits end now (errors_after_stop).
        self.parts.plane.abandon()
        self._open = None  # and the queue watcher of that batch stops polling (else it ran to the timeout)
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=120)
        await self.parts.runner.close()
