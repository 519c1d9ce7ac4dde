"""Time limits are deadlines on an execution's wall clock (gyre.sim.deadlines, docs/simulator.md section 1).

A stuck execution (a trace row that timed out) stops its harness at exactly
its start plus its ceiling, alone on an engine or on a full one, and across a
reroute; an overall timeout ends at exactly its start plus its budget (its
evaluation retries stay inside it). A slow execution that reaches the ceiling
is cut there as a harness timeout. Only the model-call share of an execution
slows with load. The driver is exercised on its own clock (its events are
collected instead of being fed to a policy core), and in whole runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from gyre import actions as act
from gyre.formats.trace import HARNESS_COLUMN, MODEL_SHARE_COLUMN, Trace
from gyre.presets import build_preset
from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation
from gyre.sim.runner import run_simulation
from gyre.sim.traces.presets import generate_trace

CEILING, BUDGET, N = 5 * 3600.0, 5.5 * 3600.0, 16


def _trace(rows_per_query: list[list[tuple[str, float, float]]], share: float = 0.35) -> Trace:
    """Queries of N rows (outcome, harness_s, duration_s)."""
    rows = [{"query_id": q, "execution_index": i, "outcome": o, HARNESS_COLUMN: h, "duration_s": d,
             MODEL_SHARE_COLUMN: share}
            for q, query in enumerate(rows_per_query) for i, (o, h, d) in enumerate(query)]
    return Trace(pd.DataFrame(rows), N=N)


class Bare:
    """A Simulation whose actions are applied by hand and whose events are only collected."""

    def __init__(self, trace: Trace, costs: CostModel) -> None:
        costs = dataclasses.replace(costs, sandbox_start_s=0.0)  # limits count from the harness's start
        cfg = build_preset("E0")
        self.sim = Simulation(cfg, trace, costs, steps=1)
        self.events: list = []
        # every event the driver sends: through send, or _send (a finish's, directly)
        self.sim.send = self.sim._send = lambda event: (self.events.append(event), self.sim.engines.flush())
        self.C = cfg.C_e

    def start(self, placements: list[tuple[int, int]]) -> None:
        self.sim.on_start_executions(act.StartExecutions(tuple(placements)))
        self.sim.engines.flush()

    def at(self, t: float, fn) -> None:
        self.sim.env.timeout(t).callbacks.append(lambda _e: (fn(), self.sim.engines.flush()))

    def run(self) -> dict[int, float]:
        self.sim.env.run()
        return {e.execution: e.now for e in self.events if e.kind == "execution_finished"}


def _stuck_query() -> list[tuple[str, float, float]]:
    return [("harness_timeout", CEILING, CEILING)] * (N - 1) + [("overall_timeout", CEILING, BUDGET)]


def _completed_query(hours: float) -> list[tuple[str, float, float]]:
    return [("completed", hours * 3600, hours * 3600)] * N


@pytest.mark.parametrize("alpha, reference", [(1.42, 1.0), (8.0, 0.3), (8.0, 1.0)])
def test_a_stuck_execution_lasts_its_ceiling_alone_and_on_a_full_engine(alpha, reference):
    costs = CostModel(engine_load_alpha=alpha, engine_reference_load=reference)
    lone = Bare(_trace([_stuck_query()]), costs)
    lone.start([(0, 0), (15, 1)])  # one stuck execution per engine: each runs alone
    assert lone.run() == {0: pytest.approx(CEILING, abs=1e-6), 15: pytest.approx(BUDGET, abs=1e-6)}
    full = Bare(_trace([_stuck_query()] + [_completed_query(1.0)] * 9), costs)
    placements = [(0, 0)] + [(x, 0) for x in range(N, full.C - 1 + N)]  # one stuck among a full engine
    full.start(placements)
    assert full.run()[0] == pytest.approx(CEILING, abs=1e-6)


def test_a_stuck_execution_never_runs_out_so_its_engine_arms_no_finish_timer_for_it():
    # its work is infinite: only its deadline ends it, and no engine timer waits unfired in the heap until then
    bare = Bare(_trace([_stuck_query()] + [_completed_query(1.0)] * 9), CostModel())
    bare.start([(0, 0)])
    engines, fire = bare.sim.engines, bare.sim.engines._fire_call
    assert engines.remaining(0) == float("inf")
    assert not [c.heap for c in engines._engines[0].clocks.values() if c.heap]  # nor a place in its finish order
    assert not [call for call in bare.sim.env.queue if call[2] == fire]
    bare.start([(N, 0)])  # a completing execution beside it: the engine's timer is for that one
    timers = [call[0] for call in bare.sim.env.queue if call[2] == fire]
    ends = bare.run()
    assert timers == [ends[N]] and ends[N] < 3600.0 and ends[0] == pytest.approx(CEILING, abs=1e-6)


def test_a_reroute_neither_resets_nor_stretches_the_clock():
    costs = CostModel(engine_load_alpha=8.0, engine_reference_load=0.3, reroute_recompute_s=3600.0)
    bare = Bare(_trace([_stuck_query()] + [_completed_query(1.0)] * 9), costs)
    bare.start([(0, 0)] + [(x, 1) for x in range(N, bare.C - 1 + N)])  # alone, then onto a full engine
    bare.at(3600.0, lambda: bare.sim.on_reroute(act.Reroute(0, 0, 1)))
    bare.at(7200.0, lambda: bare.sim.on_reroute(act.Reroute(0, 1, 2)))
    assert bare.run()[0] == pytest.approx(CEILING, abs=1e-6)


def test_a_slow_execution_is_cut_at_the_ceiling_as_a_harness_timeout():
    # 4.9 h of work, all model calls, on a full engine over three times slower than the reference: they reach
    # 5 h and are cut there; a lone 1 h execution on another engine completes
    trace = _trace([_stuck_query()] + [_completed_query(4.9)] * 9 + [_completed_query(1.0)], share=1.0)
    bare = Bare(trace, CostModel(engine_load_alpha=8.0, engine_reference_load=0.3))
    bare.start([(x, 0) for x in range(N, N + bare.C)] + [(10 * N, 1)])
    ends = bare.run()
    outcomes = {e.execution: e.outcome for e in bare.events if e.kind == "execution_finished"}
    assert ends[N] == pytest.approx(CEILING, abs=1e-6) and outcomes[N] == "harness_timeout"
    assert outcomes[10 * N] == "completed" and ends[10 * N] < 3600.0


def test_only_the_model_call_share_slows_with_load():
    # one 1 h execution on an engine at the speed of its load; the share decides how much of the hour slows
    for share in (0.0, 0.35, 1.0):
        trace = _trace([_completed_query(1.0)] * 10, share=share)
        bare = Bare(trace, CostModel(engine_load_alpha=8.0, engine_reference_load=0.3))
        bare.start([(x, 0) for x in range(bare.C)])  # a full engine: constant load until they all end
        speed = bare.sim.engines.curve.speed(bare.C, bare.C)
        assert bare.run()[0] == pytest.approx(3600.0 * ((1 - share) + share / speed), rel=1e-9)


@pytest.fixture(scope="module")
def loaded_run():
    trace = generate_trace("nl2repo-122b", 150, np.random.default_rng(3))
    return trace, run_simulation("E0", trace, steps=6, seed=0,
                                 costs=CostModel(engine_load_alpha=8.0, engine_reference_load=0.5))


def test_in_a_whole_run_every_timed_out_execution_ends_at_its_limits(loaded_run):
    trace, result = loaded_run
    group_size = result.cfg.group_size
    checked = rerouted = 0
    for row in result.record.executions.values():
        g, i = divmod(row["execution"], group_size)
        if row["end_s"] is None or row["outcome"] not in ("harness_timeout", "overall_timeout") or i >= N:
            continue
        q = g % trace.queries
        planned = float(trace.durations_s[q][i]) if trace.outcomes[q][i] == row["outcome"] else CEILING
        planned += CostModel().sandbox_start_s  # the sandbox starts before the harness and its clock
        assert row["end_s"] - row["start_s"] == pytest.approx(planned, abs=1e-6)
        checked += 1
        rerouted += row["reroutes"] > 0
    assert checked > 50 and rerouted > 0
