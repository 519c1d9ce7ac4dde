"""A harness that stops before its execution ends frees its rollout slot (HarnessStopped) in the simulator.

The same trace is run with its ``harness_s`` column and without it (then
every execution holds its slot through its evaluation retries, as before):
where executions queue for slots, queued ones start in the freed slots and
the run ends sooner (on the paper-sized cluster slots rarely bind late in a
burst, so there the effect is small). Every HarnessStopped comes
``duration_s - harness_s`` before its execution's ExecutionFinished, no
stopped execution is rerouted, the log replays, and the group-weighted
staleness identity (Theorem A.1) still holds.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from gyre import actions as act
from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.formats.eventlog import EVENT_COLUMNS, EventLog, load_events, replay, replay_run
from gyre.formats.trace import HARNESS_COLUMN, Trace
from gyre.presets import ClusterShape, build_preset
from gyre.scheduler import Scheduler
from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation
from gyre.sim.runner import run_simulation
from gyre.sim.traces.presets import generate_trace

STEPS = 8


@pytest.fixture(scope="module")
def traces() -> tuple[Trace, Trace]:
    """nl2repo-2.4t: about 5 % of executions spend 30 min in evaluation retries after the ceiling."""
    stopped = generate_trace("nl2repo-2.4t", 150, np.random.default_rng(4))
    return stopped, Trace(stopped.frame.drop(columns=[HARNESS_COLUMN]), N=stopped.N)


@pytest.fixture(scope="module")
def runs(traces):
    return tuple(run_simulation("E0", trace, steps=STEPS, seed=0) for trace in traces)


def kinds(result) -> Counter:
    return Counter(row["kind"] for row in result.record.log.rows)


def tight_trace(seed: int) -> Trace:
    """Groups of 4; a quarter of the executions spend 10-30 min in evaluation retries after their harness."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(60):
        for i in range(4):
            harness, retries = float(rng.uniform(300, 900)), rng.random() < 0.25
            rows.append({"query_id": q, "execution_index": i, HARNESS_COLUMN: harness,
                         "duration_s": harness + (float(rng.uniform(600, 1800)) if retries else 0.0),
                         "outcome": "harness_timeout" if retries else "completed"})
    return Trace(pd.DataFrame(rows), N=4)


@pytest.mark.parametrize("preset", ["E0", "async-1.5"])
def test_freed_slots_shorten_a_run_short_of_slots(preset):
    """Four cells of 4 slots, 2.5 B groups of 4 dispatched: executions queue, so freed slots are reused.
    Engines are load-independent, so the only difference between the two runs is the slot rule."""
    cfg = build_preset(preset, ClusterShape(nodes=4, nodes_per_cell=1, per_node_capacity=4, N=4, B=4))
    trace, costs = tight_trace(5), CostModel(engine_load_alpha=0.0)
    with_stop = Simulation(cfg, trace, costs, STEPS).run()
    without = Simulation(cfg, Trace(trace.frame.drop(columns=[HARNESS_COLUMN]), N=4), costs, STEPS).run()
    assert with_stop.end_s < 0.95 * without.end_s
    stops = Counter(row["kind"] for row in with_stop.log.rows)["harness_stopped"]
    assert stops > 20 and Counter(row["kind"] for row in without.log.rows)["harness_stopped"] == 0


def test_the_preset_trace_stops_harnesses_and_replays(runs):
    with_stop, without = runs
    assert kinds(with_stop)["harness_stopped"] > 20 and kinds(without)["harness_stopped"] == 0
    for result in runs:
        assert replay(result.cfg, result.record.log.events()) == result.record.log.actions


def test_each_stop_precedes_its_finish_by_the_evaluation_tail(runs, traces):
    result, trace = runs[0], traces[0]
    stops = {row["execution"]: row["now"] for row in result.record.log.rows if row["kind"] == "harness_stopped"}
    ends = {row["execution"]: (row["now"], row["outcome"]) for row in result.record.log.rows
            if row["kind"] == "execution_finished"}
    tail = trace.durations_s - trace.harness_s
    n = result.cfg.N
    for x, stopped_at in stops.items():
        g, i = divmod(x, result.cfg.group_size)
        if x not in ends:
            continue  # still evaluating when the run stopped
        end, outcome = ends[x]
        if outcome == "cancelled":
            assert end >= stopped_at
        else:
            assert end - stopped_at == pytest.approx(tail[g % trace.queries, i % n], abs=1e-6)


def test_a_stopped_execution_is_never_rerouted(runs):
    """Replay the log: no Reroute names an execution between its HarnessStopped and its end."""
    result, core, evaluating, reroutes = runs[0], Scheduler(runs[0].cfg), set(), 0
    for event in result.record.log.events():
        for action in core.handle(event):
            if isinstance(action, act.Reroute):
                reroutes += 1
                assert action.execution not in evaluating, f"rerouted a stopped execution: {action}"
        if isinstance(event, ev.HarnessStopped):
            evaluating.add(event.execution)
        elif isinstance(event, ev.ExecutionFinished):
            evaluating.discard(event.execution)
    assert reroutes > 0


def test_staleness_identity_holds_with_stopped_harnesses(traces):
    """Theorem A.1: the steady-state group-weighted mean staleness is phi + (mu - 1) / 2."""
    result = run_simulation("E0", traces[0], steps=40, seed=2)
    groups = pd.DataFrame(result.record.consumed_groups())
    steady = groups[groups.v_t >= 2 * result.cfg.mu]
    assert abs(steady.staleness.mean() - result.cfg.predicted_staleness) < 0.1


def test_cancelling_an_evaluation_ends_it_at_once():
    """Oversampling: a surplus execution cancelled while its evaluation runs ends 'cancelled' at once."""
    rows = [{"query_id": q, "execution_index": i, "duration_s": 1000.0 + 100 * i + q,
             "outcome": "harness_timeout", HARNESS_COLUMN: 50.0 + i + q} for q in range(8) for i in range(2)]
    trace = Trace(pd.DataFrame(rows), N=2)
    cfg = SchedulerConfig(K=2, C_e=3, C_s=0, N=2, B=1, phi=0.0, mu=1, oversample=1, granularity="fine")
    record = Simulation(cfg, trace, CostModel(engine_load_alpha=0.0), steps=2).run()
    log = record.log.rows
    cancelled = [r for r in log if r["kind"] == "execution_finished" and r["outcome"] == "cancelled"]
    stopped = {r["execution"]: r["now"] for r in log if r["kind"] == "harness_stopped"}
    assert cancelled and all(r["execution"] in stopped for r in cancelled)
    ready = {r["group"]: r["now"] for r in log if r["kind"] == "group_ready"}
    for r in cancelled:
        assert r["now"] == ready[r["execution"] // cfg.group_size]  # at the GroupReady, not its duration


# ---- the event log: HarnessStopped round-trips through events.csv ----------------------------------------
def test_harness_stopped_round_trips_through_the_event_log(tmp_path):
    log = EventLog()
    events = [ev.Begin(0.0), ev.HarnessStopped(12.345678, 3), ev.ExecutionFinished(20.0, 3, "harness_timeout")]
    for event in events:
        log.record_event(event)
    assert "execution" in EVENT_COLUMNS and ev.EVENT_TYPES["harness_stopped"] is ev.HarnessStopped
    assert load_events(log.write_csv(tmp_path / "events.csv")) == events
    assert log.events() == events


def test_a_written_run_with_stopped_harnesses_replays(runs, tmp_path):
    result = runs[0]
    out = result.write(tmp_path / "run")
    loaded = load_events(out / "events.csv")
    assert sum(isinstance(e, ev.HarnessStopped) for e in loaded) == kinds(result)["harness_stopped"]
    assert replay_run(out) == result.record.log.actions
