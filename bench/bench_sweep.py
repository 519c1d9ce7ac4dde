"""Sweep throughput: schedules simulated per second at paper scale, as ``gyre sweep`` runs them.

Workload: 100 schedules (phi in {0, 0.5, 1, 1.5, 2} x mu in {1..5} x K in
{4, 8, 16, 32}, on E0 at the paper's 144 executions per cell) x 12 steps, one
seed, on the built-in nl2repo-122b trace, in 2 worker processes. Reports wall
time, schedules per second, and the extrapolated time of the issue's goal
(500 schedules x 12 steps; goal under 60 s on a 2-core machine).

Wall time is unreliable on a shared machine, so it also reports the CPU
seconds per schedule (this process and its workers, ``resource.getrusage``)
and the goal extrapolated from them: ``500 * cpu_s_per_schedule / 2`` is the
wall time on 2 otherwise idle cores. ``events_per_cpu_s`` is the driver's
throughput: policy-core events simulated per CPU second. The window includes
start-up: ``run_sweep`` imports the simulator (``gyre.sim.runner``, numpy
most of it since pandas left that path, ~0.15 CPU s) in this process before
the workers fork, as ``gyre sweep`` does. ``parent_cpu_s`` is this process's share (that import and the
pool's bookkeeping) and ``events_per_worker_cpu_s`` the throughput without it
(the workers' CPU alone).
"""

from __future__ import annotations

import resource
import time

from gyre.sim.sweep import parse_sweep, run_sweep


def main() -> dict:
    axes = parse_sweep(["phi=0,0.5,1,1.5,2", "mu=1..5", "K=4,8,16,32"])
    own0, cpu0 = _cpu_s(children=False), _cpu_s()
    t0 = time.perf_counter()
    rows = run_sweep(axes, steps=12, seeds=1, jobs=2)
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0  # the pool has joined its workers, so their time is counted
    own = _cpu_s(children=False) - own0
    done = [r for r in rows if not r["error"]]
    events = sum(r.get("events") or 0 for r in done)
    figures = {
        "schedules": len(rows), "refused": len(rows) - len(done), "wall_s": round(wall, 2),
        "schedules_per_s": round(len(rows) / wall, 2),
        "extrapolated_500_schedules_s": round(500 * wall / len(rows), 1),
        "goal_met": 500 * wall / len(rows) < 60,
        "cpu_s": round(cpu, 2), "cpu_s_per_schedule": round(cpu / len(rows), 4),
        "events_per_schedule": round(events / max(1, len(done))),
        "events_per_cpu_s": round(events / cpu) if cpu > 0 else None,
        "parent_cpu_s": round(own, 2),
        "events_per_worker_cpu_s": round(events / (cpu - own)) if cpu > own else None,
        "extrapolated_500_schedules_2_idle_cores_s": round(500 * cpu / len(rows) / 2, 1),
        "goal_met_on_idle_cores": 500 * cpu / len(rows) / 2 < 60,
    }
    for key, value in figures.items():
        print(f"   {key:32s} {value}")
    return figures


def _cpu_s(*, children: bool = True) -> float:
    """CPU seconds (user + system) of this process and, unless told not to, its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    if not children:
        return own.ru_utime + own.ru_stime
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
