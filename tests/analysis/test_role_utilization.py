"""Role shares, slack and transitions on a hand-made two-cell run.

Cell 0: rollout [0, 10), to_training [10, 12), training [12, 30), to_rollout [30, 31), rollout [31, 40).
Cell 1: rollout [0, 40).
One step trains over [12, 30); executions run over [0, 15) and [20, 25) and [35, open).
"""

from __future__ import annotations

import math

import pytest

from gyre.analysis.runs import make_run
from gyre.analysis.utilization import (merge_intervals, overlap, overlap_seconds, role_utilization, slack,
                                       transition_summary, transitions)

ROLES = [
    {"cell": 0, "role": "rollout", "start_s": 0.0, "end_s": 10.0},
    {"cell": 0, "role": "to_training", "start_s": 10.0, "end_s": 12.0},
    {"cell": 0, "role": "training", "start_s": 12.0, "end_s": 30.0},
    {"cell": 0, "role": "to_rollout", "start_s": 30.0, "end_s": 31.0},
    {"cell": 0, "role": "rollout", "start_s": 31.0, "end_s": 40.0},
    {"cell": 1, "role": "rollout", "start_s": 0.0, "end_s": 40.0},
]
STEPS = [{"step": 0, "start_s": 12.0, "end_s": 30.0, "duration_s": 18.0, "training_cells_max": 1, "published": True}]
EXECS = [
    {"execution": 0, "group_id": 0, "engine": 1, "start_s": 0.0, "end_s": 15.0, "outcome": "completed"},
    {"execution": 1, "group_id": 0, "engine": 1, "start_s": 20.0, "end_s": 25.0, "outcome": "completed"},
    {"execution": 2, "group_id": 1, "engine": 1, "start_s": 35.0, "end_s": None, "outcome": None},
]


@pytest.fixture
def run():
    return make_run(roles=ROLES, steps=STEPS, executions=EXECS)


def test_role_shares(run):
    table = role_utilization(run).set_index("cell")
    assert table.loc[0, "rollout_s"] == 19.0
    assert table.loc[0, "training_s"] == 18.0
    assert table.loc[0, "switching_s"] == 3.0
    assert table.loc[0, ["rollout", "training", "switching"]].tolist() == pytest.approx([19 / 40, 18 / 40, 3 / 40])
    assert table.loc[1, "rollout"] == 1.0 and table.loc[1, "training"] == 0.0
    assert (table["total_s"] == 40.0).all()


def test_overlap_and_slack(run):
    # training [12, 30); rollout [0, 15) + [20, 25) + [35, 40): overlap 3 + 5 = 8
    result = overlap(run)
    assert result["training_s"] == 18.0
    assert result["rollout_s"] == 25.0
    assert result["both_s"] == 8.0
    assert result["neither_s"] == 40.0 - 18.0 - 25.0 + 8.0
    assert slack(run) == pytest.approx(8 / 18)


def test_slack_without_training_is_nan():
    run = make_run(roles=ROLES[-1:], executions=EXECS[:1])
    assert math.isnan(slack(run))


def test_transitions(run):
    table = transitions(run)
    assert table[["cell", "direction", "count", "cost_s"]].values.tolist() == [
        [0, "to_rollout", 1, 1.0], [0, "to_training", 1, 2.0]]
    summary = transition_summary(run)
    assert summary == {"count": 2, "cost_s": 3.0, "to_training_count": 1, "to_training_cost_s": 2.0,
                       "to_rollout_count": 1, "to_rollout_cost_s": 1.0}


def test_interval_helpers():
    merged = merge_intervals([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)])
    assert merged == [(0.0, 3.0), (5.0, 8.0)]
    assert overlap_seconds(merged, [(2.0, 6.0)]) == 2.0


def test_unknown_role_is_rejected():
    run = make_run(roles=[{"cell": 0, "role": "dancing", "start_s": 0.0, "end_s": 1.0}])
    with pytest.raises(ValueError, match="dancing"):
        role_utilization(run)
