"""Sweep throughput: schedules simulated per second at paper scale, as ``gyre sweep`` runs them.

Workload: 100 schedules (phi in {0, 0.5, 1, 1.5, 2} x mu in {1..5} x K in
{4, 8, 16, 32}, on E0 at the paper's 144 executions per cell) x 12 steps, one
seed, on the built-in nl2repo-122b trace, in 2 worker processes. Reports wall
time, schedules per second, and the extrapolated time of the issue's goal
(500 schedules x 12 steps; goal under 60 s on a 2-core machine).
"""

from __future__ import annotations

import time

from gyre.sim.sweep import parse_sweep, run_sweep


def main() -> dict:
    axes = parse_sweep(["phi=0,0.5,1,1.5,2", "mu=1..5", "K=4,8,16,32"])
    t0 = time.perf_counter()
    rows = run_sweep(axes, steps=12, seeds=1, jobs=2)
    wall = time.perf_counter() - t0
    done = [r for r in rows if not r["error"]]
    figures = {
        "schedules": len(rows), "refused": len(rows) - len(done), "wall_s": round(wall, 2),
        "schedules_per_s": round(len(rows) / wall, 2),
        "extrapolated_500_schedules_s": round(500 * wall / len(rows), 1),
        "goal_met": 500 * wall / len(rows) < 60,
    }
    for key, value in figures.items():
        print(f"   {key:32s} {value}")
    return figures
