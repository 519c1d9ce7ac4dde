"""What a switch to training waits for (gyre.sim.switch_waits): stuck executions vs progressing ones."""

from __future__ import annotations

from types import SimpleNamespace

from gyre.sim.runner import run_simulation
from gyre.sim.switch_waits import switch_waits


def test_counts_and_the_stuck_tail_on_a_hand_made_record():
    roles = [{"cell": 0, "role": "to_training", "start_s": 100.0, "end_s": 110.0},
             {"cell": 1, "role": "to_training", "start_s": 100.0, "end_s": 110.0},
             {"cell": 2, "role": "rollout", "start_s": 0.0, "end_s": 100.0}]
    rows = [(0, 0.0, 40.0, "completed"), (1, 0.0, 90.0, "harness_timeout"), (2, 0.0, 95.0, "overall_timeout"),
            (3, 50.0, 150.0, "harness_timeout"), (4, 60.0, 120.0, "completed"), (5, 60.0, None, None)]
    executions = {x: {"execution": x, "start_s": s, "end_s": e, "outcome": o} for x, s, e, o in rows}
    [row] = switch_waits(SimpleNamespace(roles=roles, executions=executions))
    assert row["cells"] == 2 and row["outstanding_stuck"] == 1 and row["outstanding_progressing"] == 2
    assert row["last_progress_s"] == 40.0 and row["stuck_tail_s"] == 60.0 and row["stuck_in_tail"] == 2


def test_colocate_waits_hours_for_executions_stuck_at_their_ceiling():
    waits = run_simulation("C0", steps=4, seed=0).summary["switch_waits"]
    first = waits["per_switch"][0]
    assert first["cells"] == 8 and first["outstanding_stuck"] == first["outstanding_progressing"] == 0
    assert first["stuck_tail_s"] > 3600 and first["stuck_in_tail"] > 50
    e0 = run_simulation("E0", steps=4, seed=0).summary["switch_waits"]
    assert e0["all"]["stuck_tail_s_mean"] < 60 and e0["all"]["outstanding_stuck"] > 0  # fine cells don't wait
