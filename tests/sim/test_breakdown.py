"""Where the time goes (sim/breakdown.py): a hand-worked timeline, then whole runs."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.sim.breakdown import CATEGORIES, role_node_seconds, rollout_busy_share, time_breakdown
from gyre.sim.runner import run_simulation
from gyre.sim.traces.presets import generate_trace


def test_a_hand_worked_timeline():
    """One cell of capacity 2, no separate pool, 0..100 s:
    0-10 two executions (full), 10-30 one (tail), 30-35 switching, 35-60 training alone (exposed),
    60-70 publication, 70-75 switching back, 75-90 nothing (waiting), 90-100 one execution (tail)."""
    roles = [(0, "rollout", 0.0, 30.0), (0, "to_training", 30.0, 35.0), (0, "training", 35.0, 70.0),
             (0, "to_rollout", 70.0, 75.0), (0, "rollout", 75.0, 100.0)]
    seconds = time_breakdown(end_s=100.0, executions=[(0.0, 10.0), (0.0, 30.0), (90.0, None)], roles=roles,
                             steps=[(35.0, 60.0)], publications=[(60.0, 70.0)], C_e=2, C_s=0)
    assert seconds == {"rollout_full": 10.0, "rollout_tail": 30.0, "training_exposed": 25.0,
                       "publication": 10.0, "transitions": 10.0, "waiting": 15.0}
    assert role_node_seconds(roles, nodes_per_cell=4) == {"rollout": 220.0, "training": 140.0, "switching": 40.0}
    # slots used: 2*10 + 1*20 + 1*10 = 50 of 2 * 55 offered
    assert rollout_busy_share(end_s=100.0, executions_on_cells=[(0.0, 10.0), (0.0, 30.0), (90.0, None)],
                              roles=roles, C_e=2) == pytest.approx(50 / 110)


def test_training_hidden_behind_rollout_counts_as_rollout():
    roles = [(0, "rollout", 0.0, 10.0), (1, "training", 0.0, 10.0)]
    seconds = time_breakdown(end_s=10.0, executions=[(0.0, 10.0)], roles=roles, steps=[(0.0, 10.0)],
                             publications=[], C_e=4, C_s=0)
    assert seconds["rollout_tail"] == 10.0 and seconds["training_exposed"] == 0.0


@pytest.fixture(scope="module")
def trace():
    return generate_trace("nl2repo-122b", 200, np.random.default_rng(2), N=16)


@pytest.mark.parametrize("preset", ["E0", "A0", "C0", "C2"])
def test_every_run_accounts_for_all_its_time(preset, trace):
    s = run_simulation(preset, trace, steps=6, seed=0).summary
    assert set(s["time_breakdown_hours"]) == set(CATEGORIES)
    assert sum(s["time_breakdown_hours"].values()) == pytest.approx(s["total_hours"], abs=1e-4)
    assert all(0.0 <= v <= 1.0 for v in s["role_busy_share"].values() if v is not None)
    assert 0.0 <= s["slack"] <= 1.0


def test_the_breakdown_tells_the_methods_apart(trace):
    colocate = run_simulation("C0", trace, steps=8, seed=0).summary
    static = run_simulation("A0", trace, steps=8, seed=0).summary
    assert colocate["time_breakdown_hours"]["training_exposed"] > 0  # Colocate trains while nothing rolls out
    assert static["time_breakdown_hours"]["transitions"] == 0 and static["role_node_hours"]["switching"] == 0
    assert static["time_breakdown_hours"]["training_exposed"] < colocate["time_breakdown_hours"]["training_exposed"]
