"""The job file ``gyre plan`` writes is one ``gyre run`` accepts, with exactly the planned schedule."""

from __future__ import annotations

from gyre.config import SchedulerConfig
from gyre.real.runtime.job import load_job_config
from gyre.sim.plan.evaluate import Workload, serial_map
from gyre.sim.plan.plan import run_plan
from gyre.sim.plan.space import Cluster, SearchSpace
from gyre.sim.plan.study import PlanRequest


def test_the_planned_job_file_loads_to_the_recommended_schedule(tmp_path):
    request = PlanRequest(workload=Workload("nl2repo-122b", steps=3, seeds=(0,)),
                          cluster=Cluster(nodes=8, cell_sizes=(2, 4), per_node=36, N=16, B=32),
                          space=SearchSpace(fixed={"tau": 30.0, "rho_min": 0.5}), target_mean=1.0)
    result = run_plan(request, tmp_path, 4, serial_map)
    assert result.best is not None
    job = load_job_config(tmp_path / "job.toml")
    assert job.scheduler() == SchedulerConfig(**result.best.schedule)
    assert job.steps % result.best.schedule["mu"] == 0
