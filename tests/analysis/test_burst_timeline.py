"""Publications, burst spans, satellite joins and rollout load on a hand-made run."""

from __future__ import annotations

import pytest

from gyre.analysis.runs import make_run
from gyre.analysis.timeline import burst_span, publications, running_executions, satellite_joins

STEPS = [
    {"step": 0, "start_s": 10.0, "end_s": 20.0, "duration_s": 10.0, "training_cells_max": 2, "published": False},
    {"step": 1, "start_s": 20.0, "end_s": 30.0, "duration_s": 10.0, "training_cells_max": 2, "published": True},
    {"step": 2, "start_s": 50.0, "end_s": 60.0, "duration_s": 10.0, "training_cells_max": 1, "published": False},
]
EVENTS = [{"seq": 0, "kind": "begin", "now": 0.0}, {"seq": 1, "kind": "publish_done", "now": 33.0, "version": 2}]
ROLES = [
    {"cell": 0, "role": "training", "start_s": 9.0, "end_s": 30.0},
    {"cell": 1, "role": "training", "start_s": 15.0, "end_s": 30.0},  # joins step 0 in flight
    {"cell": 2, "role": "training", "start_s": 40.0, "end_s": 45.0},  # between steps: not a join
    {"cell": 1, "role": "training", "start_s": 55.0, "end_s": 60.0},  # joins step 2
]
EXECS = [
    {"execution": 0, "group_id": 0, "engine": 1, "start_s": 0.0, "end_s": 5.0},
    {"execution": 1, "group_id": 0, "engine": 1, "start_s": 5.0, "end_s": 8.0},
    {"execution": 2, "group_id": 1, "engine": 1, "start_s": 2.0, "end_s": None},
]


@pytest.fixture
def run():
    return make_run(steps=STEPS, events=EVENTS, roles=ROLES, executions=EXECS, summary={"config": {"mu": 2}})


def test_publications(run):
    assert publications(run).values.tolist() == [[2, 30.0, 33.0]]


def test_burst_span(run):
    assert burst_span(run, 0) == (0.0, 33.0)
    with pytest.raises(ValueError, match="did not complete"):
        burst_span(run, 1)


def test_satellite_joins(run):
    assert satellite_joins(run).values.tolist() == [[1, 15.0, 0], [1, 55.0, 2]]


def test_running_executions(run):
    load = running_executions(run)
    # +1 at 0, +1 at 2, -1 at 5 then +1 at 5 (end before start), -1 at 8
    assert load.values.tolist() == [[0.0, 1], [2.0, 2], [5.0, 2], [8.0, 1]]
