"""Two real-side fixes the differential test needed, pinned on their own.

- ``close_and_evaluate`` of an execution whose harness ended at or after its
  overall deadline returns INVALID (excluded, docs/trajectories.md#evaluation-and-outcomes) whatever the evaluator
  answers; it used to raise ``EvaluationError`` ("not pending (invalid)"), so the
  backend never reported the execution and the run hung.
- ``RealBackend`` drops a group whose task cannot be set up: it reports
  ``GroupDropped`` at dispatch, starts no harness for it, and reports its
  executions "cancelled" when the core cancels them.
- ``RealBackend`` reports ``HarnessStopped`` when an execution's evaluation
  goes into retries after its harness exited, and cancelling it then cancels
  the evaluation (ExecutionFinished "cancelled", no further evaluator call).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gyre import actions as act
from gyre import events as ev
from gyre.real.harness.evaluation import close_and_evaluate
from gyre.real.harness.tasks import EvaluatorFailure, preserved_binding
from gyre.real.runtime.backend import TaskUnavailable
from gyre.trajectory.evaluation import EvalState, EvaluationResult
from gyre.trajectory.groups import TrajectoryBuffer


class Reports(list):
    """What a backend reported to its controller: (event type, fields), in order."""

    def report(self, kind, **fields):
        self.append((kind, fields))


class Evaluator:
    def __init__(self, answer: str) -> None:
        self.answer, self.calls = answer, 0

    def evaluate(self, execution_id: str, workspace: Path) -> EvaluationResult | None:
        self.calls += 1
        if self.answer == "fails":
            raise EvaluatorFailure("cannot score")
        return EvaluationResult(preserved_binding(execution_id, workspace), 1.0, True)


@pytest.mark.parametrize("answer", ["fails", "scores"])
@pytest.mark.parametrize("ended_at", [100.0, 250.0])
def test_an_execution_closed_past_its_deadline_is_excluded(tmp_path, answer, ended_at):
    buffer = TrajectoryBuffer(2)
    buffer.open_group("g0", 0, ["x0", "x1"], deadline=100.0)
    evaluator = Evaluator(answer)
    state = asyncio.run(close_and_evaluate(buffer, evaluator, "x0", tmp_path, lambda: ended_at))
    assert state is EvalState.INVALID
    assert buffer.evaluation("x0").state is EvalState.INVALID


def test_an_execution_closed_before_its_deadline_still_scores(tmp_path):
    buffer = TrajectoryBuffer(2)
    buffer.open_group("g0", 0, ["x0", "x1"], deadline=100.0)
    state = asyncio.run(close_and_evaluate(buffer, Evaluator("scores"), "x0", tmp_path, lambda: 99.0))
    assert state is EvalState.VALID


def test_a_group_whose_task_cannot_be_set_up_is_dropped_and_its_executions_cancelled():
    from .doubles import TaskDouble
    from .worlds import EdgeBackend

    reports = Reports()

    class Runner:
        class budgets:
            overall_timeout_s = 100.0

        async def run(self, *args):
            raise AssertionError("a dropped group must start no harness")

    class Parts:
        engine_names = {0: "cell0"}
        runner = Runner()
        records_dir = Path("/nonexistent-records")
        task = TaskDouble(None, frozenset({5}), seed=0)

    class Proxy:
        def handle(self, method, path, body):
            if path == "/admin/executions/start":
                return {"api_keys": {item["execution_id"]: "k" for item in body["executions"]}}
            return {"ok": True}

    async def body():
        from gyre.config import SchedulerConfig
        cfg = SchedulerConfig(K=1, C_e=8, C_s=0, N=2, B=1, phi=0.0, mu=1, granularity="global")
        backend = EdgeBackend(cfg, Parts(), seed=0, token_budget=10, clock=lambda: 0.0,
                              proxy_double=Proxy()).bind(reports)
        backend.on_dispatch_groups(act.DispatchGroups((5,), 0))
        backend.on_start_executions(act.StartExecutions(((10, 0), (11, 0))))
        await asyncio.sleep(0)
        assert reports == [(ev.GroupDropped, {"group": 5})]
        backend.on_cancel_executions(act.CancelExecutions((10, 11)))
        await asyncio.wait(list(backend.tasks))
        assert backend.errors == []
        assert reports[1:] == [(ev.ExecutionFinished, {"execution": x, "outcome": "cancelled"}) for x in (10, 11)]

    with pytest.raises(TaskUnavailable):
        TaskDouble(None, frozenset({5}), seed=0).task("q5")
    asyncio.run(body())


def test_an_evaluation_in_retries_reports_harness_stopped_and_is_cancelled(tmp_path):
    from gyre.config import SchedulerConfig
    from gyre.real.harness.runner import ExecutionResult, Task

    from .virtual_loop import VirtualLoop
    from .worlds import EdgeBackend

    loop, reports = VirtualLoop(), Reports()

    class Runner:
        class budgets:
            overall_timeout_s = 1000.0

        async def run(self, x, task, key):
            return ExecutionResult(x, "harness_timeout", 0, tmp_path, 0.0, loop.time())

        async def cancel(self, x):
            raise AssertionError("the harness has exited: nothing to cancel there")

    class Tasks:
        calls = 0

        def task(self, task_id):
            return Task(task_id=task_id, prompt="-")

        def evaluate(self, execution_id, workspace):
            Tasks.calls += 1
            raise EvaluatorFailure("evaluator down")

    class Parts:
        engine_names = {0: "cell0"}
        runner = Runner()
        records_dir = tmp_path / "records"
        task = Tasks()

    class Proxy:
        def handle(self, method, path, body):
            if path == "/admin/executions/start":
                return {"api_keys": {item["execution_id"]: "k" for item in body["executions"]}}
            return {"ok": True}

    cfg = SchedulerConfig(K=1, C_e=8, C_s=0, N=2, B=1, phi=0.0, mu=1, granularity="global")
    backend = EdgeBackend(cfg, Parts(), seed=0, token_budget=10, clock=loop.time,
                          proxy_double=Proxy()).bind(reports)

    async def body():
        backend.on_dispatch_groups(act.DispatchGroups((0,), 0))
        backend.on_start_executions(act.StartExecutions(((0, 0),)))
        await asyncio.sleep(10.0)  # virtual seconds: the first attempt failed, retries follow
        assert reports == [(ev.HarnessStopped, {"execution": 0})]
        calls = Tasks.calls
        assert calls >= 3
        backend.on_cancel_executions(act.CancelExecutions((0,)))
        await asyncio.wait(list(backend.tasks))
        assert reports[1:] == [(ev.ExecutionFinished, {"execution": 0, "outcome": "cancelled"})]
        assert backend.errors == [] and Tasks.calls == calls

    try:
        loop.run_until_complete(body())
    finally:
        loop.close()


def test_a_group_whose_executions_end_together_is_ready_after_all_their_finishes():
    """Evaluations run as tasks, so when a group's executions end at the same instant the buffer can turn
    ready before the last ExecutionFinished is reported; the backend must still report GroupReady only
    after every finish (the core refuses it otherwise, as it did in a real run: "group 2 ready with
    only 3 of 4 executions closed"). Same-instant ends are what a real run gets when its harnesses
    finish within one event-loop turn."""
    import numpy as np
    import pandas as pd

    from gyre.formats.trace import Trace

    from .test_sim_vs_real import SHAPE, both

    rng = np.random.default_rng(0)
    rows = [{"query_id": q, "execution_index": i, "duration_s": d, "outcome": "completed"}
            for q, d in enumerate(rng.uniform(60, 900, size=30)) for i in range(SHAPE.N)]
    cfg, sim, real, backend = both("gyre-1.5", Trace(pd.DataFrame(rows), N=SHAPE.N, source="same-end"))
    assert backend.errors == []
    closed: dict[int, int] = {}
    for row in real.log.rows:
        if row["kind"] == "execution_finished":
            g = row["execution"] // cfg.group_size
            closed[g] = closed.get(g, 0) + 1
        elif row["kind"] == "group_ready":
            assert closed.get(row["group"], 0) >= cfg.N, row
    assert sum(1 for row in real.log.rows if row["kind"] == "group_ready") >= cfg.mu * cfg.B


def test_the_backends_start_latency_is_inside_the_durations_it_writes():
    """A real backend starts an execution some time after the core's StartExecutions (key, route, workspace,
    process spawn: 0.1-5 s per execution in the CPU demo). The simulator starts it at the action, so the
    trace the real run writes must count that latency, or the simulator sees every group ready early.
    Here each start takes 7 s more (virtual): every written duration is the script's plus 7 s, and the
    script with 7 s added, simulated, gives the real run's transcript, actions and staleness exactly."""
    from collections import Counter

    from gyre.formats.trace import Trace
    from gyre.presets import build_preset

    from .doubles import RunnerDouble
    from .test_sim_vs_real import SHAPE, STEPS, assert_identical, scripted_trace
    from .worlds import costs_for_differential, run_real, run_sim

    latency = 7.0

    class SlowStart(RunnerDouble):
        async def run(self, execution, task, key):
            await asyncio.sleep(latency)
            return await super().run(execution, task, key)

    cfg = build_preset("gyre-1.5", SHAPE)
    costs = costs_for_differential()
    script = scripted_trace(40, seed=1)
    real, backend = run_real(cfg, script, costs, STEPS, runner_class=SlowStart)
    done = Counter(r.query_id for r in backend.metrics.trace if r.outcome != "cancelled")
    want = script.frame.set_index(["query_id", "execution_index"])["duration_s"]
    written = [r for r in backend.metrics.trace if done[r.query_id] == cfg.N]
    assert len(written) >= STEPS * cfg.B * cfg.N
    sandbox = costs.bind(cfg, script).trace.durations_s[0, 0] - float(want.loc[(0, 0)])  # the doubles' start-up
    for r in written:
        assert r.end_s - r.start_s == pytest.approx(want.loc[(r.query_id % 40, r.execution_index)] + sandbox
                                                    + latency, abs=1e-6), r
    later = script.frame.assign(duration_s=script.frame["duration_s"] + latency)
    assert_identical(cfg, run_sim(cfg, Trace(later, N=cfg.N, source="later"), costs, STEPS), real)
