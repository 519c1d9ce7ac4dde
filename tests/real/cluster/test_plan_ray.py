"""``gyre plan --ray`` and ``gyre sweep --ray``: evaluations as Ray tasks on a two-node cluster, same results.

A local Ray cluster of two nodes (``ray.cluster_utils.Cluster``: the head and
one more node process, one logical CPU each) runs on this machine inside the
suite's loopback-only network namespace (``tools/isolated.sh``; Ray
advertises the machine's own address otherwise). The mapper is the real one
(``gyre.real.cluster.task_map``): each (schedule, seed) simulation is a Ray
task. Checked: a plan's study and a sweep's rows equal the local ones for the
same seeds, and the tasks ran on both nodes. Skipped, with the reason, without
Ray or outside a loopback-only namespace.
"""

from __future__ import annotations

import pytest

from gyre.cli import main
from gyre.sim.plan.evaluate import Workload, serial_map
from gyre.sim.plan.space import Cluster, SearchSpace
from gyre.sim.plan.study import PlanRequest, run_study
from gyre.sim.sweep import parse_sweep, run_sweep

try:
    from ray_nodes import loopback_only, two_ray_nodes
except ImportError:
    from ..ray_nodes import loopback_only, two_ray_nodes

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
pytestmark = [pytest.mark.timeout(300),
              loopback_only]

REQUEST = PlanRequest(workload=Workload("nl2repo-122b", steps=3, seeds=(0, 1)),
                      cluster=Cluster(nodes=16, cell_sizes=(2, 4), per_node=36, N=16, B=32),
                      space=SearchSpace(phi=(0.0, 0.5, 1.0), mu=(1, 2, 3), fixed={"tau": 30.0}),
                      target_mean=1.0, seed=5, batch=3, startup=3)


@pytest.fixture(scope="module")
def address():
    with two_ray_nodes({"num_cpus": 1}, {"num_cpus": 1}) as cluster:
        yield cluster.address


def test_a_plan_on_ray_equals_the_local_plan_and_uses_both_nodes(address, tmp_path):
    from gyre.real.cluster.task_map import ray_mapper

    local = run_study(REQUEST, tmp_path / "local.db", 6, serial_map)
    with ray_mapper(address) as mapper:
        remote = run_study(REQUEST, tmp_path / "ray.db", 6, mapper)
        nodes = dict(mapper.nodes)
    assert [(t.point, t.values, t.refused) for t in remote] == [(t.point, t.values, t.refused) for t in local]
    assert len(nodes) == 2 and sum(nodes.values()) > 0


def test_a_sweep_on_ray_gives_the_local_rows(address):
    from gyre.real.cluster.task_map import ray_mapper

    axes = parse_sweep(["phi=0,0.5,0.3", "mu=1..2"])  # phi = 0.3 is refused (9.6 groups): a row, not a crash
    local = run_sweep(axes, steps=3, seeds=2, jobs=1)
    with ray_mapper(address) as mapper:
        remote = run_sweep(axes, steps=3, seeds=2, mapper=mapper)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]  # noqa: E731
    assert strip(remote) == strip(local)
    assert any(r["error"] for r in remote)


def test_the_cli_plans_on_ray(address, tmp_path, capsys):
    args = ["plan", "--nodes", "8", "--cell-sizes", "2,4", "--budget", "4", "--steps", "3", "--trace-seeds", "2",
            "--target", "1", "--fix", "tau=30", "--ray", address, "--out", str(tmp_path / "p")]
    assert main(args) == 0
    assert "Ray node(s)" in capsys.readouterr().out
