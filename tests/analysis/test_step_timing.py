"""Per-step durations and cumulative speedup against hand-computed values."""

from __future__ import annotations

import pytest

from gyre.analysis.runs import make_run
from gyre.analysis.timing import cumulative_speedup, step_durations, step_table, total_hours


def _run(ends, starts, name=""):
    rows = [{"step": i, "start_s": s, "end_s": e, "duration_s": e - s, "training_cells_max": 1, "published": False}
            for i, (s, e) in enumerate(zip(starts, ends))]
    return make_run(name=name, steps=rows)


def test_step_durations_split_wait_and_training():
    run = _run(starts=[100.0, 300.0, 350.0], ends=[200.0, 350.0, 500.0])
    table = step_durations(run)
    assert table["duration_s"].tolist() == [100.0, 50.0, 150.0]
    assert table["wait_s"].tolist() == [100.0, 100.0, 0.0]
    assert table["wall_s"].tolist() == [200.0, 150.0, 150.0]
    assert table["wall_s"].sum() == table["end_s"].iloc[-1]


def test_unfinished_steps_are_left_out():
    run = _run(starts=[0.0, 10.0], ends=[10.0, float("nan")])
    assert step_durations(run)["step"].tolist() == [0]


def test_cumulative_speedup_is_baseline_time_over_run_time():
    fast = _run(starts=[0.0, 100.0, 200.0], ends=[100.0, 200.0, 300.0])
    slow = _run(starts=[0.0, 200.0], ends=[200.0, 300.0])
    table = cumulative_speedup(fast, slow)
    assert table["step"].tolist() == [0, 1]  # common steps only
    assert table["speedup"].tolist() == pytest.approx([2.0, 1.5])


def test_step_table_and_total_hours():
    a = _run(starts=[0.0], ends=[3600.0])
    b = _run(starts=[1800.0, 7200.0], ends=[3600.0, 10800.0])
    table = step_table({"a": a, "b": b})
    assert table.loc[0, "a"] == 1.0 and table.loc[1, "b"] == 2.0
    assert total_hours(b) == 3.0
