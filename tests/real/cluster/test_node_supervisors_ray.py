"""Node supervisors as detached Ray actors outlive a killed driver, re-attach, expire and fall back (issue 29).

A local Ray cluster of two nodes (``ray.cluster_utils.Cluster``: the head and one more node
process, 1 CPU and one ``gyre_cell`` each) runs inside the suite's loopback-only network
namespace (``tools/isolated.sh``). A stand-in driver (a subprocess that joins the cluster)
places two cells with ``cluster.placement.Placement`` (one per node: each takes the node's
only ``gyre_cell``), opens the node supervisors through it (``open_supervisors``: a detached
``cluster.node_supervisor.NodeSupervisorHost`` per node, renewing their leases) and spawns a
long-running process on each node through them, then is SIGKILLed. Checked, in order:
- a new driver (this test) finds both supervisors by name; once Ray has ended the killed
  driver's job, both actors and both processes are still alive, and each node's ledger,
  read through its actor, shows its process running under the same pid;
- killing one node's supervisor (SIGKILL to its actor's process: Ray's clean-up of an exiting
  worker's children does not run) ends its daemon and its process;
  its name is free, and that node's process reads as ``lost`` (the re-run path), while the
  other node's still runs;
- once nobody renews, the other node's lease expires past its short grace (3 s + 2 s): its
  process is gone, its ledger says its supervisor ended it, and its actor has ended itself;
- supervisors opened again on both nodes start the key again (its second start: re-run), and
  ``gyre stop RUN_DIR`` (the CLI, a subprocess) stops both with their processes and ends both actors.
Nothing outlives the test: the actors are killed by name and the processes by pid in ``finally``.
Skipped, with the reason, without Ray or outside a loopback-only namespace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

try:
    from processes import alive, wait_until
    from ray_nodes import loopback_only, two_ray_nodes
except ImportError:
    from ..processes import alive, wait_until
    from ..ray_nodes import loopback_only, two_ray_nodes

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
pytestmark = [pytest.mark.timeout(240),
              loopback_only]
LEASE_S, GRACE_S = 3.0, 2.0
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
DRIVER = """
import json, sys, time
import ray
from gyre.real.cluster.config import ClusterConfig
from gyre.real.cluster.placement import Placement
address, run = sys.argv[1], sys.argv[2]
config = ClusterConfig(address=address, interface="lo", cell_resource="gyre_cell", start_timeout_s=60)
placement = Placement(config).open(cells=2, tp=1, engines={})
supervisors = placement.open_supervisors(run, grace_s=float(sys.argv[3]), lease_s=float(sys.argv[4]))
pids = {}
for node, supervisor in supervisors.live().items():
    entry, started = supervisor.spawn("x0", [sys.executable, "-c", "import time; time.sleep(600)"], cwd=run,
                                      log=f"{run}/x0-{node[:8]}.log")
    assert started
    pids[node] = entry.pid
daemons = {node: s.describe()["daemon_pid"] for node, s in supervisors.live().items()}
print(json.dumps({"pids": pids, "daemons": daemons, "job": ray.get_runtime_context().get_job_id()}), flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def cluster():
    with two_ray_nodes({"num_cpus": 1, "resources": {"gyre_cell": 1}}, {"num_cpus": 1, "resources": {"gyre_cell": 1}}) \
            as cluster:
        yield cluster


def job_ended(job_id: str) -> bool:
    from ray._private.state import jobs

    return any(job["JobID"] == job_id and job["IsDead"] for job in jobs())


def test_node_supervisors_outlive_a_killed_driver_reattach_expire_and_fall_back(tmp_path, cluster):
    from gyre.real.cluster.node_supervisor import NAMESPACE, NodeSupervisors
    from gyre.real.supervisor.ledger import ENDED, LOST, RUNNING

    run = tmp_path / "run"
    run.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address, str(run), str(GRACE_S), str(LEASE_S)],
                              stdout=subprocess.PIPE, text=True)
    pids: dict[str, int] = {}
    daemons: dict[str, int] = {}
    try:
        started = json.loads(driver.stdout.readline() or "null")
        assert started, "the stand-in driver did not start its processes"
        pids, daemons = started["pids"], started["daemons"]
        head, other = cluster.head_node.node_id, cluster.list_all_nodes()[1].node_id
        assert set(pids) == {head, other}, "one supervised process on each node"
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
        driver.kill()  # SIGKILL: no finally, no Placement.close in the driver
        driver.wait(10)

        found = NodeSupervisors.find(run, [head, other]).renew_leases(LEASE_S / 4)
        assert set(found.live()) == {head, other}, "a new driver finds both supervisors by name"
        assert wait_until(lambda: job_ended(started["job"]), 30), "Ray did not end the killed driver's job"
        assert all(alive(pid) for pid in [*pids.values(), *daemons.values()])
        # the daemons, and what they run, at this node's normal priority, not the nice 15 of Ray's workers
        assert {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in [*pids.values(), *daemons.values()]} == \
            {pid: os.getpriority(os.PRIO_PROCESS, 0) for pid in [*pids.values(), *daemons.values()]}
        view = found.view()
        assert {node: (view[node]["x0"].state, view[node]["x0"].pid) for node in view} == \
            {node: (RUNNING, pid) for node, pid in pids.items()}, "re-attached: same pids, still running"
        assert all(s.describe()["daemon_pid"] == daemons[node] for node, s in found.live().items())

        os.kill(found.supervisors[other].describe()["actor_pid"], signal.SIGKILL)  # as with its node: no clean exit
        assert wait_until(lambda: not alive(pids[other]) and not alive(daemons[other]), 30)
        assert wait_until(lambda: NodeSupervisors.find(run, [other]).supervisors[other] is None, 30)
        lost = found.view()
        assert lost[other]["x0"].state == LOST and "supervisor is gone" in lost[other]["x0"].reason
        assert lost[head]["x0"].state == RUNNING and alive(pids[head])

        found.release()  # nobody renews: the head's lease expires past its grace
        assert wait_until(lambda: not alive(pids[head]) and not alive(daemons[head]), LEASE_S + GRACE_S + 30)
        assert wait_until(lambda: NodeSupervisors.find(run, [head]).supervisors[head] is None, 30), \
            "the actor did not end itself with its daemon"
        ended = NodeSupervisors.find(run, [head]).view()[head]["x0"]
        assert ended.state == ENDED and ended.killed and ended.pid == pids[head]

        again = NodeSupervisors.open(run, [head, other], GRACE_S, lease_s=60.0)  # a resumed driver re-runs x0
        reruns = {node: s.spawn("x0", SLEEPER, cwd=str(run), log=str(run / "x0-again.log"))
                  for node, s in again.live().items()}
        assert all(started and entry.starts == 2 for entry, started in reruns.values())
        pids.update({f"{node}-again": entry.pid for node, (entry, _) in reruns.items()})
        daemons.update({f"{node}-again": s.describe()["daemon_pid"] for node, s in again.live().items()})
        stop = subprocess.run([sys.executable, "-m", "gyre.cli", "stop", str(run)], capture_output=True, text=True,
                              timeout=120)
        assert stop.returncode == 0 and stop.stdout.count("stopped with everything it owned") == 2, stop
        assert not any(alive(entry.pid) for entry, _ in reruns.values())
        assert NodeSupervisors.find(run, [head, other]).live() == {}, "gyre stop left a node supervisor"
    finally:
        _clean_up(driver, cluster.address, run, [*pids.values(), *daemons.values()])


def _clean_up(driver: subprocess.Popen, address: str, run, pids: list[int]) -> None:
    """Kill the stand-in driver, every node supervisor actor of the run, and every process still alive."""
    from gyre.real.cluster.node_supervisor import NAMESPACE, actor_name

    if driver.poll() is None:
        driver.kill()
        driver.wait(10)
    try:
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
        for node in ray.nodes():
            try:
                ray.kill(ray.get_actor(actor_name(run, node["NodeID"]), namespace=NAMESPACE))
            except ValueError:
                pass  # no such actor: it ended
    finally:
        ray.shutdown()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
