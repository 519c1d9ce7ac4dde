"""Engines under their nodes' supervisors on a two-node Ray cluster (``cluster.node_engines``, issue 29).

A local Ray cluster of two nodes (``ray.cluster_utils.Cluster``: the head and one more node
process, 1 CPU and one ``gyre_cell`` each) runs inside the suite's loopback-only network
namespace (``tools/isolated.sh``). A real ``Placement`` places two cells, one per node, each
with its engine's bundle, opens the node supervisors (short lease, renewed) and the engine
manager launches two engines through ``NodeEngines``. The SGLang interpreter is stood in
for by a script that answers every GET with 200 on the engine's port (so the manager's
health checks and restart run for real). Checked, in order:
- each engine runs under the supervisor of its group's node: that node's ledger runs its key
  with the manager's pid, the other node's ledger does not hold it;
- ``running_engine`` (what a resumed driver's manager adopts) hands back the same process;
- the loss of one node's supervisor (SIGKILL of its actor's process) takes that node's
  engine with it, and the manager reads it as killed (SIGKILL), not as running; the other
  engine runs on; the manager's restart opens a new supervisor on that node and starts the
  engine there again, healthy (the node's ledger counts a second start, and the placement's
  description, summary.json's ``placement``, names it as started again);
- an engine whose group moved to the other node (a resumed placement) is found where it
  runs, and launched on its new node only after the old node's process is stopped: at most
  one process per engine id;
- ``Placement.close`` stops both supervisors with their engines: no engine process is left.
Skipped, with the reason, without Ray or outside a loopback-only namespace.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

import pytest

from gyre.real.cluster.config import ClusterConfig
from gyre.real.engines.manager import EngineManager, EngineSpec
from gyre.real.runtime.ports import free_port
from gyre.real.supervisor.ledger import ENDED, RUNNING

try:
    from processes import alive, all_gone, wait_until
    from ray_nodes import loopback_only, two_ray_nodes
except ImportError:
    from ..processes import alive, all_gone, wait_until
    from ..ray_nodes import loopback_only, two_ray_nodes

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
pytestmark = [pytest.mark.timeout(240),
              loopback_only]
STAND_IN = f"""#!{sys.executable}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


@pytest.fixture(scope="module")
def cluster():
    with two_ray_nodes({"num_cpus": 1, "resources": {"gyre_cell": 1}}, {"num_cpus": 1, "resources": {"gyre_cell": 1}}) \
            as cluster:
        yield cluster


def test_engines_run_under_their_nodes_supervisors_and_come_back_after_a_loss(tmp_path, cluster):
    from gyre.real.cluster.node_engines import NodeEngines
    from gyre.real.cluster.placement import Placement

    python = tmp_path / "stand-in-python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir()
    config = ClusterConfig(address=cluster.address, interface="lo", cell_resource="gyre_cell", rank_cpus=0.5,
                           engine_cpus=0.5, start_timeout_s=60)
    placement = Placement(config).open(cells=2, tp=1, engines={0: "e0", 1: "e1"})
    pids: list[int] = []
    try:
        supervisors = placement.open_supervisors(run, grace_s=5.0, lease_s=3.0)
        launcher = NodeEngines(placement, supervisors)
        manager = EngineManager(run / "engine-logs", python=python, launcher=launcher)
        specs = {e: EngineSpec(engine_id=e, model_path="/none", port=free_port(), host="127.0.0.1")
                 for e in ("e0", "e1")}
        node = {e: placement.engine_groups[e].node_id for e in specs}
        assert node["e0"] != node["e1"], "one cell (and its engine) per node"
        for spec in specs.values():
            manager.launch(spec)
            manager.wait_healthy(spec.engine_id, timeout=60)
        pids = [manager.engines[e].process.pid for e in specs]
        view = supervisors.view()
        for e in specs:
            entry = view[node[e]][f"engine-{e}"]
            assert (entry.state, entry.pid, entry.starts) == (RUNNING, manager.engines[e].process.pid, 1)
            assert f"engine-{e}" not in view[node["e1" if e == "e0" else "e0"]]
        assert launcher.running_engine("e0").pid == manager.engines["e0"].process.pid  # adoptable as it runs

        lost = manager.engines["e1"].process.pid
        os.kill(supervisors.supervisors[node["e1"]].describe()["actor_pid"], signal.SIGKILL)
        assert wait_until(lambda: not alive(lost), 30), "the engine outlived its node's supervisor"
        assert wait_until(lambda: manager.engines["e1"].process.poll() == -signal.SIGKILL, 30)
        assert manager.engines["e0"].process.poll() is None and alive(pids[0])
        manager.restart("e1", timeout=60)  # a new supervisor on that node starts it again
        again = supervisors.view()[node["e1"]]["engine-e1"]
        assert (again.state, again.starts, again.pid) == (RUNNING, 2, manager.engines["e1"].process.pid)
        assert again.pid != lost
        restarted = placement.describe()["supervisors"][node["e1"]]["restarted"]  # summary.json's placement
        assert list(restarted) == ["engine-e1"] and len(restarted["engine-e1"]) == 1, restarted
        pids.append(again.pid)

        moved = dataclasses.replace(placement.engine_groups["e0"], node_id=node["e1"])  # a resumed placement
        placement.engine_groups["e0"] = moved
        assert launcher.running_engine("e0").pid == pids[0], "found on the node whose supervisor runs it"
        fresh = launcher.start_engine(specs["e0"], python, run / "engine-logs" / "e0-moved.log")
        pids.append(fresh.pid)
        assert not alive(pids[0]) and alive(fresh.pid)
        view = supervisors.view()
        assert view[node["e0"]]["engine-e0"].state == ENDED and view[node["e1"]]["engine-e0"].pid == fresh.pid
    finally:
        placement.close()
    assert all_gone(pids, within_s=30), [pid for pid in pids if alive(pid)]
