"""The 122B profile as realized in the default run (gyre.sim.realized, docs/simulator.md section 3).

the figures of docs/workload.md#workload-profile were measured under the paper's real load, so the default
run (E0 on the 122B cluster, 12 steps, the nl2repo-122b preset) must realize
them: mean execution 1.93 h, mean query 2.96 h, 9.51 % of queries past 4 h,
6.25 % harness and 0.87 % overall timeouts, each within 3 %, as the mean over
trace seeds 8-11 (the preset was set on seeds 0-7, so these are out of
sample). One seed counts ~304 queries, so its share
past 4 h moves in steps of 0.33 pp (3.5 % of 9.51 %): a single seed is not
held to 3 % on that figure.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gyre.sim.realized import realized_profile
from gyre.sim.runner import run_simulation

PAPER = {"mean_execution_h": 1.93, "mean_query_h": 2.96, "queries_over_4h": 0.0951,
         # docs/workload.md#workload-profile, the 122B runs
         "harness_timeout_rate": 0.0625, "overall_timeout_rate": 0.0087}


@pytest.fixture(scope="module")
def profiles():
    return [run_simulation(seed=seed).summary["realized_profile"] for seed in (8, 9, 10, 11)]


def test_the_default_run_realizes_the_paper_profile_within_3_percent(profiles):
    for key, stated in PAPER.items():
        realized = float(np.mean([p[key] for p in profiles]))
        assert realized == pytest.approx(stated, rel=0.03), (key, realized)
    assert all(p["queries"] >= 250 and p["executions"] >= 16 * 250 for p in profiles)


def _record(end_s: float, rows: list[tuple[int, int, float, float, str]]) -> SimpleNamespace:
    executions = {x: {"execution": x, "group_id": g, "start_s": s, "end_s": e, "outcome": o}
                  for x, g, s, e, o in rows}
    return SimpleNamespace(end_s=end_s, executions=executions)


def test_late_starts_are_censored_and_surplus_and_cancelled_work_is_left_out():
    # N = 2, groups of 3 slots (one oversampled). Group 0 counts; group 1 started after end - longest
    record = _record(10 * 3600.0, [
        (0, 0, 0.0, 3600.0, "completed"), (1, 0, 0.0, 5 * 3600.0, "harness_timeout"),
        (2, 0, 0.0, 100.0, "cancelled"),  # the surplus slot: no duration of its own
        (3, 1, 6 * 3600.0, 7 * 3600.0, "completed"), (4, 1, 6 * 3600.0, 6.5 * 3600.0, "completed"),
    ])
    p = realized_profile(record, group_size=3, N=2, longest_s=5.5 * 3600.0)
    assert (p["executions"], p["queries"]) == (2, 1)
    assert p["mean_execution_h"] == pytest.approx(3.0) and p["mean_query_h"] == pytest.approx(5.0)
    assert p["queries_over_4h"] == 1.0 and p["harness_timeout_rate"] == 0.5 and p["overall_timeout_rate"] == 0.0
