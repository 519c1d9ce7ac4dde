"""The outermost edge of a real run, replaced by doubles that finish on a virtual clock.

Everything between the edge and the policy core is the real code:
``gyre.real.runtime.controller.Controller`` and ``gyre.real.runtime.backend.RealBackend``
(trajectory buffer, evaluation with retries, stream packer, record store reads).
The doubles stand in for what would be processes or remote services:

- ``PlaneDouble``: the training cells (``plane.send`` tickets for step,
  enter_training, leave_training, publish; ``plane.queues`` receives the packer's
  micro-steps). Its timing is the simulator's training model (``sim.training``)
  with the same costs bound to the run (``CostModel.bind``): members claim queued
  micro-steps in cell order, one warm-up per cell per batch, drain + gradient
  reduction + optimizer after the last micro-step, a satellite joins
  ``weight_pull_s`` after its transition and is held ``broadcast_s`` after every
  non-final update; enter_training takes ``to_training_s``; publish ``publish_s``.
  The packer makes one micro-step per trainable execution (``TOKEN_BUDGET``), whose
  work is that execution's trained tokens in the simulator's size model.
- ``EngineDouble``: SGLang engines; memory calls answer at once, a weight load takes
  ``to_rollout_s`` (where the simulator charges a return to rollout: after the
  publication it waits for).
- ``RunnerDouble``: harness processes. An execution's harness runs for its trace
  ``harness_s`` (its duration without the column; the simulator's rule,
  oversampling surplus included), then writes one model
  call to the record store (as the proxy would) and ends with the harness outcome
  a real runner gives for the trace's outcome (an overall timeout is a killed
  harness: ``harness_timeout``, excluded later by its evaluation budget).
- ``TaskDouble``: the task source and evaluator. Groups listed as dropped cannot
  be set up (``TaskUnavailable``); an execution whose trace outcome is
  ``overall_timeout`` cannot be scored (``EvaluatorFailure``), ``failed`` leaves no
  evaluable work (``None``), the rest score a seeded reward. An execution whose
  ``harness_s`` is below its duration is evaluated in retries: the first attempt
  fails, the retry answers at start + ``duration_s`` (the simulator's end).
- ``ProxyDouble``: the proxy's admin API (keys, routes, drain, in-flight counts).

Invariant: every double answers only through the virtual clock (``VirtualLoop``),
so a run is a pure function of (config, trace, costs, dropped groups).
"""

from __future__ import annotations

import asyncio
from collections import deque
import concurrent.futures
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from gyre.config import SchedulerConfig
from gyre.formats.trace import Trace
from gyre.ids import execution_id, query_id
from gyre.real.harness.runner import Budgets, ExecutionResult, Task
from gyre.real.harness.tasks import EvaluatorFailure, preserved_binding
from gyre.real.runtime.backend import TaskUnavailable
from gyre.real.store.tito_log import ExecutionStore, RecordLog
from gyre.sim.sizes import trained_tokens
from gyre.trajectory.evaluation import EvaluationResult
from gyre.trajectory.records import ModelCall

from .virtual_loop import Pending, VirtualLoop

#: tokens of the one model call each execution records; with this token budget every
#: trainable execution packs into exactly one micro-step
CALL_INPUT, CALL_OUTPUT = 6, 4
TOKEN_BUDGET = CALL_INPUT + CALL_OUTPUT


class VirtualTicket:
    """A plane command's answer; ``result`` raises ``Pending`` until the virtual clock gets there."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> dict:
        if not self.future.done():
            raise Pending(self.future)
        return self.future.result()


@dataclass
class _Member:
    available_at: float
    busy: bool = False
    warmed: bool = False


class _Queues:
    """``plane.queues``: the packer's micro-step sink, and each batch's queue depth (``queue(v).ready_count()``)."""

    def __init__(self, plane: "PlaneDouble") -> None:
        self.plane = plane

    def queue(self, version: int) -> "_Queues":
        return self

    def ready_count(self) -> int:
        return len(self.plane.work)

    async def changes(self, depth: int, still_open) -> int:
        """The backend's wait for a claim (``BatchFeed.queue_changes``): woken when a cell claims, at the
        claim's own time (the real backend polls the shared directory instead)."""
        if still_open() and self.ready_count() == depth:
            future = asyncio.get_running_loop().create_future()
            self.plane.depth_waiters.append(future)
            await future  # one claim (the depth may be back where it was after a feed: still a change)
        return self.ready_count()

    def put(self, step: Any) -> None:
        self.plane._put(step)

    def close_batch(self, batch_id: int, num_steps: int) -> None:
        self.plane._close_batch(batch_id, num_steps)


class PlaneDouble:
    def __init__(self, loop: VirtualLoop, cfg: SchedulerConfig, costs: Any) -> None:
        self.loop, self.cfg, self.costs = loop, cfg, costs  # costs bound to the run (``CostModel.bind``)
        self.queues = _Queues(self)
        self.work: deque[float] = deque()  # node-seconds of each queued micro-step
        self._tokens = trained_tokens(costs.trace, costs.j_max)
        self.members: dict[int, _Member] = {}
        self.sent: list[tuple[float, int, str]] = []
        self.version: int | None = None
        self.final = False
        self.closed = False
        self.in_flight = self.micro_steps = 0
        self._ticket: VirtualTicket | None = None
        self._participants: set[int] = set()
        #: futures ``_Queues.changes`` waits on: resolved whenever a cell claims
        self.depth_waiters: list[asyncio.Future] = []
        for cell in range(cfg.static_train_cells):
            self._join(cell, 0.0)

    # ---- commands ------------------------------------------------------------------
    def prepare(self, cell: int, op: str, **args: Any) -> tuple[VirtualTicket, Callable[[], None]]:
        """As the real plane's: here the command takes effect at once, and its write does nothing."""
        return self.send(cell, op, **args), lambda: None

    def send(self, cell: int, op: str, **args: Any) -> VirtualTicket:
        self.sent.append((self.loop.time(), cell, op))
        ticket = VirtualTicket(op)
        if op == "step":
            self._start_batch(args["version"], bool(args["final"]), ticket)
        elif op == "enter_training":
            satellite = cell not in self.cfg.core_unit
            self.loop.call_later(self.costs.to_training_s, self._entered, cell, satellite, ticket)
        elif op == "leave_training":
            member = self.members.pop(cell, None)
            if member is not None and member.busy:
                raise RuntimeError(f"cell {cell} left training while running a micro-step")
            ticket.future.set_result({"ok": True})
        elif op == "join":  # a held satellite may join steps: the double's members claim from entering
            ticket.future.set_result({"ok": True})
        elif op == "publish":
            path = f"{args['directory']}/v{args['version']}"
            self.loop.call_later(self.costs.publish_s, ticket.future.set_result, {"path": path})
        else:
            raise ValueError(f"plane double: unknown command {op!r}")
        return ticket

    def _entered(self, cell: int, satellite: bool, ticket: VirtualTicket) -> None:
        self._join(cell, self.costs.weight_pull_s if satellite else 0.0)
        ticket.future.set_result({"ok": True})

    def _join(self, cell: int, delay: float) -> None:
        self.members[cell] = _Member(self.loop.time() + delay)
        self._wake_at(self.loop.time() + delay)

    # ---- batches ---------------------------------------------------------------------
    def _start_batch(self, version: int, final: bool, ticket: VirtualTicket) -> None:
        if self.version is not None:
            raise RuntimeError(f"step {version} sent while step {self.version} is running")
        self.version, self.final, self._ticket = version, final, ticket
        self.closed, self.in_flight, self.micro_steps = False, 0, 0
        self.work.clear()
        self._participants = set()
        for member in self.members.values():
            member.warmed = False
        self._assign()

    def _assign(self) -> None:
        self._claim()

    def _depth_changed(self) -> None:
        """Wake the backend's queue watcher at the claim's own virtual time."""
        waiters, self.depth_waiters = self.depth_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(len(self.work))

    def _put(self, step: Any) -> None:
        if self.version is None:
            raise RuntimeError("micro-step queued while no step is running")
        executions = {row.execution_id for row in step.rows}
        if len(executions) != 1:
            raise RuntimeError(f"micro-step {step.name} packs executions {sorted(executions)}; the double expects one")
        # one micro-step per trainable execution (TOKEN_BUDGET): its work is that execution's trained
        # tokens in the simulator's size model (``gyre.sim.sizes``)
        g, i = divmod(int(executions.pop()[1:]), self.cfg.group_size)
        tokens = self._tokens[g % self._tokens.shape[0], i % self.cfg.N]
        self.work.append(self.costs.train_node_s(float(tokens)))
        self.micro_steps += 1
        self._claim()

    def _close_batch(self, batch_id: int, num_steps: int) -> None:
        if num_steps != self.micro_steps:
            raise RuntimeError(f"batch {batch_id} closed with {num_steps} micro-steps, {self.micro_steps} queued")
        self.closed = True
        self._maybe_finish()

    def _wake_at(self, when: float) -> None:
        if when > self.loop.time():
            self.loop.call_at(when, self._assign)

    def _claim(self) -> None:
        if self.version is None:
            return
        now = self.loop.time()
        for cell in sorted(self.members):
            member = self.members[cell]
            if not self.work:
                return
            if member.busy or member.available_at > now:
                continue
            work = self.work.popleft()
            self.loop.call_soon(self._depth_changed)
            self.in_flight += 1
            member.busy = True
            seconds = work / self.cfg.nodes_per_cell + (0.0 if member.warmed else self.costs.warmup_s)
            member.warmed = True
            self._participants.add(cell)
            self.loop.call_later(seconds, self._micro_step_done, cell)

    def _micro_step_done(self, cell: int) -> None:
        self.in_flight -= 1
        if cell in self.members:
            self.members[cell].busy = False
        if not self._maybe_finish():
            self._assign()

    def _maybe_finish(self) -> bool:
        if not (self.closed and not self.work and self.in_flight == 0):
            return False
        version, ticket, self.version = self.version, self._ticket, None
        report = {"loss": 0.0, "participants": sorted(self._participants), "microsteps": self.micro_steps}
        tail = self.costs.drain_s + self.costs.grad_reduce_s + self.costs.optimizer_s
        self.loop.call_later(tail, self._step_done, ticket, report, self.final)
        return True

    def _step_done(self, ticket: VirtualTicket, report: dict, final: bool) -> None:
        if not final:  # the core cell broadcasts the new parameters to its seated satellites
            until = self.loop.time() + self.costs.broadcast_s
            for cell, member in self.members.items():
                if cell not in self.cfg.core_unit and cell >= self.cfg.static_train_cells:
                    member.available_at = max(member.available_at, until)
            self._wake_at(until)
        ticket.future.set_result(report)


class EngineDouble:
    def __init__(self, loop: VirtualLoop, names: dict[int, str], costs: Any) -> None:
        self.loop, self.costs = loop, costs
        self.engines = {name: SimpleNamespace(url=f"http://engine-{name}.invalid") for name in names.values()}
        self.calls: list[tuple[float, str, str]] = []

    def _call(self, op: str, name: str) -> None:
        if name not in self.engines:
            raise KeyError(f"no engine {name!r}")
        self.calls.append((self.loop.time(), op, name))

    def quiesce(self, name: str) -> None:
        self._call("quiesce", name)

    def release_memory(self, name: str) -> None:
        self._call("release_memory", name)

    def resume_memory(self, name: str) -> None:
        self._call("resume_memory", name)

    def update_weights_from_disk(self, name: str, path: str, weight_version: str = "") -> None:
        self._call("update_weights_from_disk", name)
        raise Pending(self.loop.future_at(self.costs.to_rollout_s))


class RunnerDouble:
    def __init__(self, loop: VirtualLoop, cfg: SchedulerConfig, trace: Trace, records: Path, workspace: Path,
                 budgets: Budgets) -> None:
        self.loop, self.cfg, self.trace, self.records, self.workspace = loop, cfg, trace, records, workspace
        self.budgets = budgets
        self.active: dict[int, tuple[asyncio.Future, asyncio.TimerHandle]] = {}
        self.trace_outcome: dict[str, str] = {}
        self.evaluation_ends: dict[str, float] = {}  # executions evaluated in retries: when the evaluation ends
        self.started: list[tuple[float, int]] = []

    def _duration_outcome(self, x: int) -> tuple[float, float, str]:
        """(harness seconds, duration, trace outcome) of execution ``x``."""
        g, i = divmod(x, self.cfg.group_size)
        q = (g if i < self.cfg.N else g + 1) % self.trace.queries  # surplus: the simulator's rule
        j = i % self.cfg.N
        return float(self.trace.harness_s[q, j]), float(self.trace.durations_s[q, j]), str(self.trace.outcomes[q, j])

    async def run(self, execution: int, task: Task, key: str) -> ExecutionResult:
        harness, duration, outcome = self._duration_outcome(execution)
        started = self.loop.time()
        self.started.append((started, execution))
        if duration > harness:
            self.evaluation_ends[execution_id(execution)] = started + duration
        done = self.loop.create_future()
        timer = self.loop.call_later(harness, done.set_result, outcome)
        self.active[execution] = (done, timer)
        ended_as = await done
        del self.active[execution]
        eid = execution_id(execution)
        if ended_as != "cancelled":
            self.trace_outcome[eid] = ended_as
            self._record(eid, execution)
        harness = {"overall_timeout": "harness_timeout"}.get(ended_as, ended_as)
        return ExecutionResult(execution, harness, 0, self.workspace, started, self.loop.time())

    def _record(self, eid: str, execution: int) -> None:
        call = ModelCall(execution_id=eid, request_id=f"{eid}-r0", input_ids=np.arange(1, CALL_INPUT + 1),
                         output_ids=np.arange(100, 100 + CALL_OUTPUT), output_logprobs=np.full(CALL_OUTPUT, -0.5),
                         policy_version=0, role_hints={"role": "main"})
        with RecordLog(ExecutionStore(self.records).path_for(eid), eid) as log:
            log.append(call)

    def in_flight(self) -> set[int]:
        return set(self.active)

    async def cancel(self, execution: int) -> None:
        entry = self.active.get(execution)
        if entry is not None and not entry[0].done():
            entry[1].cancel()
            entry[0].set_result("cancelled")

    async def close(self) -> None:
        return None


class TaskDouble:
    def __init__(self, runner: RunnerDouble, dropped: frozenset[int], seed: int) -> None:
        self.runner, self.seed = runner, seed
        self.unavailable = {query_id(g) for g in dropped}
        self.evaluations = 0
        self.attempts: dict[str, int] = {}

    def task(self, task_id: str) -> Task:
        if task_id in self.unavailable:
            raise TaskUnavailable(f"task {task_id} cannot be set up (test double)")
        return Task(task_id=task_id, prompt="differential test")

    def evaluate(self, eid: str, workspace: Path) -> EvaluationResult | None:
        self.evaluations += 1
        self.attempts[eid] = self.attempts.get(eid, 0) + 1
        outcome = self.runner.trace_outcome[eid]
        if outcome == "overall_timeout":
            raise EvaluatorFailure("the workspace cannot be scored within the budget (test double)")
        if outcome == "failed":
            return None
        score = float(np.random.default_rng([self.seed, int(eid[1:])]).random())
        result = EvaluationResult(preserved_binding(eid, workspace), score, True)
        ends = self.runner.evaluation_ends.get(eid)
        if ends is None:
            return result
        if self.attempts[eid] == 1:  # evaluated in retries: the first attempt fails at the harness's end
            raise EvaluatorFailure("the evaluator is not available yet (test double)")
        raise Pending(self.runner.loop.future_at(max(0.0, ends - self.runner.loop.time()), result))


@dataclass
class ProxyDouble:
    """The proxy's admin API: keys, routes, drain flags, in-flight counts per engine."""

    runner: RunnerDouble
    engine_of: dict[str, str] = field(default_factory=dict)
    drained: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def handle(self, method: str, path: str, body: dict | None) -> Any:
        self.calls.append((method, path))
        parts = path.strip("/").split("/")
        if (method, path) == ("POST", "/admin/executions"):
            return {"api_key": f"key-{body['execution_id']}"}
        if (method, path) == ("POST", "/admin/executions/start"):
            for item in body["executions"]:
                self.engine_of[item["execution_id"]] = item["engine"]
            return {"api_keys": {item["execution_id"]: f"key-{item['execution_id']}" for item in body["executions"]}}
        if (method, path) == ("POST", "/admin/routes"):
            self.engine_of[body["execution_id"]] = body["engine"]
            return {"ok": True}
        if (method, path) == ("GET", "/admin/engines"):
            running = {execution_id(x) for x in self.runner.in_flight()}
            names = sorted(set(self.engine_of.values()))
            return {"engines": [{"id": n, "in_flight": sum(1 for e in running if self.engine_of.get(e) == n)}
                                for n in names]}
        if method == "POST" and len(parts) == 4 and parts[:2] == ["admin", "engines"]:
            (self.drained.add if parts[3] == "drain" else self.drained.discard)(parts[2])
            return {"ok": True}
        if (method, path) == ("POST", "/admin/policy_version"):
            return {"ok": True}
        raise ValueError(f"proxy double: unknown admin call {method} {path}")
