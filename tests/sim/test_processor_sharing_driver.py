"""Processor sharing inside the SimPy driver: durations follow engine load, reroutes carry remaining work.

With ``engine_load_alpha=0`` every execution that ends by itself takes
exactly its trace duration (load-independent engines). With the default
curve and reference load 1 (a full engine gives the trace duration), no
engine ever runs above its capacity, so no execution takes longer than its
duration and the ones in an emptying engine take strictly less (by at most
their model-call share's gain: tool time does not speed up); with
reference load 0.5 full engines are slower than the trace says.
"""

from __future__ import annotations

import numpy as np
import pytest

from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation
from gyre.sim.runner import run_simulation
from gyre.sim.traces.presets import generate_trace


@pytest.fixture(scope="module")
def setup():
    trace = generate_trace("nl2repo-122b", 120, np.random.default_rng(0))
    cfg = run_simulation("E0", trace, steps=1, seed=0).cfg
    return cfg, trace


def _elapsed(cfg, trace, costs, steps=3):
    sim = Simulation(cfg, trace, costs, steps)
    record = sim.run()
    rows = [r for r in record.executions.values() if r["end_s"] is not None and r["outcome"] != "cancelled"]
    assert rows
    return [(r["end_s"] - r["start_s"], sim._duration(r["execution"]), r["reroutes"]) for r in rows], record


def test_load_independent_engines_give_the_trace_durations(setup):
    cfg, trace = setup
    rows, _ = _elapsed(cfg, trace, CostModel(engine_load_alpha=0.0))
    for elapsed, duration, _ in rows:
        assert elapsed == pytest.approx(duration, rel=1e-9, abs=1e-6)


def test_default_engines_never_exceed_the_trace_durations_and_speed_up_when_emptying(setup):
    cfg, trace = setup
    rows, _ = _elapsed(cfg, trace, CostModel())
    assert all(elapsed <= duration * (1 + 1e-9) + 1e-6 for elapsed, duration, _ in rows)
    faster = [elapsed / duration for elapsed, duration, _ in rows if duration > 0]
    assert min(faster) < 0.97  # the burst's tail runs on half-empty engines (only the model-call share speeds up)


def test_a_lower_reference_load_slows_full_engines(setup):
    cfg, trace = setup
    rows, _ = _elapsed(cfg, trace, CostModel(engine_reference_load=0.5))
    assert max(elapsed / duration for elapsed, duration, _ in rows if duration > 0) > 1.1


def test_reroute_recompute_is_work_added_on_the_destination(setup):
    cfg, trace = setup
    plain = run_simulation("E0", trace, steps=6, seed=0, costs=CostModel(engine_load_alpha=0.0))
    moved = run_simulation("E0", trace, steps=6, seed=0,
                           costs=CostModel(engine_load_alpha=0.0, reroute_recompute_s=3600.0))
    rows = [r for r in moved.record.executions.values() if r["reroutes"] and r["end_s"] is not None
            and r["outcome"] != "cancelled"]
    assert rows, "no rerouted execution finished"
    r, p = rows[0], plain.record.executions[rows[0]["execution"]]
    assert r["end_s"] - r["start_s"] == pytest.approx(p["end_s"] - p["start_s"] + 3600.0 * r["reroutes"])
