"""Placing a job on a Ray cluster, without a cluster: the ``[cluster]`` table, the addresses, the node agent.

- a job file's ``[cluster]`` table (beside ``[job]``) loads into a checked ``ClusterConfig``;
  ``gyre run --cluster ADDRESS`` sets its address and keeps the file's other keys; a bad
  address, an unknown key, a missing address or an interface this machine lacks fails
  before anything starts, with an error naming the field (``cluster.address``, ...);
- checking the table imports no Ray (a job without ``[cluster]`` never needs it);
- the addresses a placed job hands out are concrete: an interface's IPv4 address
  (never 0.0.0.0), an engine's ``--host`` and URL, each cell's Mooncake host;
- the node agent (plain class; a Ray actor on the cluster) signals, waits for and kills
  what it started, and when the agent's process dies its processes die with it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gyre.real.cluster.agent import NodeAgent
from gyre.real.cluster.config import ClusterConfig, check_interface, interface_address
from gyre.real.engines.manager import EngineSpec, launch_command
from gyre.real.runtime.job import load_job_config
from gyre.real.train.context import CellConfig

try:
    from processes import alive, all_gone, group_members, wait_until
except ImportError:
    from ..processes import alive, all_gone, group_members, wait_until

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "configs" / "cpu_demo.toml"


def job_file(tmp_path: Path, cluster: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(DEMO.read_text() + "\n[cluster]\n" + cluster)
    return path


def test_a_cluster_table_loads_beside_the_job(tmp_path):
    job = load_job_config(job_file(tmp_path, 'address = "10.1.2.3:6379"\ninterface = "lo"\n'
                                             'cell_resource = "gyre_cell"\n'))
    assert job.cluster == ClusterConfig(address="10.1.2.3:6379", interface="lo", cell_resource="gyre_cell")
    assert load_job_config(DEMO).cluster is None  # a single-machine run


def test_the_command_line_address_overrides_the_tables_and_keeps_its_other_keys(tmp_path):
    path = job_file(tmp_path, 'address = "10.1.2.3:6379"\ninterface = "lo"\n')
    job = load_job_config(path, cluster={"address": "head.example:6380"})
    assert (job.cluster.address, job.cluster.interface) == ("head.example:6380", "lo")
    assert load_job_config(DEMO, cluster={"address": "auto"}).cluster.address == "auto"


@pytest.mark.parametrize("table, message", [
    ('address = "head-without-port"\n', "cluster.address must be \"HOST:PORT\""),
    ('address = "10.0.0.1:99999"\n', "port in 1..65535"),
    ('address = "10.0.0.1:"\n', "cluster.address must be"),
    ('address = "0.0.0.0:6379"\n', "names no machine"),
    ('address = 6379\n', "cluster.address must be"),
    ('address = "http://10.0.0.1:6379"\n', "is not a host name or IP address"),
    ('interface = "lo"\n', "cluster.address is missing"),
    ('address = "10.0.0.1:6379"\nadress = "x"\nnodes = 2\n', "cluster: unknown key(s) ['adress', 'nodes']"),
    ('address = "10.0.0.1:6379"\ninterface = "gyre-no-such0"\n',
     "cluster.interface 'gyre-no-such0' does not exist on this machine"),
    ('address = "10.0.0.1:6379"\nrank_cpus = -1\n', "cluster.rank_cpus must be a non-negative number"),
    ('address = "10.0.0.1:6379"\nstart_timeout_s = 0\n', "cluster.start_timeout_s must be positive"),
])
def test_a_bad_cluster_table_names_the_field(tmp_path, table, message):
    path = job_file(tmp_path, table)
    with pytest.raises(ValueError) as info:
        load_job_config(path)
    assert message in str(info.value) and str(path) in str(info.value), str(info.value)


def test_gyre_run_refuses_a_bad_cluster_address_before_anything_starts(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gyre.cli", "run", "--config", str(DEMO), "--cluster", "nowhere",
                           "--set", f'workdir="{tmp_path / "run"}"'], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cluster.address" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_checking_a_cluster_table_imports_no_ray(tmp_path):
    path = job_file(tmp_path, 'address = "10.1.2.3:6379"\ninterface = "lo"\n')
    code = textwrap.dedent(f"""
        import sys
        from gyre.real.runtime.job import load_job_config
        load_job_config({str(path)!r}).cluster
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)


def test_addresses_are_concrete():
    assert check_interface("lo") == interface_address("lo") == "127.0.0.1"
    spec = EngineSpec(engine_id="e1", model_path="/m", port=4321, host="10.0.0.7")
    argv = launch_command(spec, Path("/py"))
    assert argv[argv.index("--host") + 1] == "10.0.0.7" and spec.url == "http://10.0.0.7:4321"
    assert EngineSpec(engine_id="e0", model_path="/m", port=1).url == "http://127.0.0.1:1"  # unplaced: loopback
    cfg = CellConfig(cells=2, store_port=1, queue_root="q", workdir="w", store_host="10.0.0.1",
                     cell_hosts=("10.0.0.1", "10.0.0.2"))
    assert (cfg.host_of(0), cfg.host_of(1)) == ("10.0.0.1", "10.0.0.2")
    assert CellConfig(cells=2, store_port=1, queue_root="q", workdir="w").host_of(1) == "127.0.0.1"
    with pytest.raises(ValueError, match="cell_hosts names 1 hosts for 2 cells"):
        CellConfig(cells=2, store_port=1, queue_root="q", workdir="w", cell_hosts=("10.0.0.1",))
    with pytest.raises(ValueError, match="concrete addresses"):
        CellConfig(cells=1, store_port=1, queue_root="q", workdir="w", cell_hosts=("0.0.0.0",))


def test_the_node_agent_signals_waits_for_and_kills_what_it_started(tmp_path):
    agent = NodeAgent(interface="lo", cwd=str(tmp_path))
    assert agent.address() == "127.0.0.1" and 0 < agent.free_port() < 65536
    assert agent.env().get("GLOO_SOCKET_IFNAME") == "lo" and "OMP_NUM_THREADS" not in agent.env()
    start = agent.launcher.submit
    group = start(agent._popen, "engine", ["sh", "-c", "sleep 60 & wait"], agent.env(), str(tmp_path / "e.log"),
                  None, True).result()
    single = start(agent._popen, "rank", [sys.executable, "-c", "import sys; sys.stdin.read(); import time; "
                   "time.sleep(60)"], agent.env(), str(tmp_path / "r.log"), b"payload", False).result()
    assert agent.poll("engine") is None and agent.poll("rank") is None
    assert agent.signal("engine", signal.SIGTERM) and agent.wait("engine") == -signal.SIGTERM
    assert agent.shutdown() == ["rank"] and agent.poll("rank") == -signal.SIGKILL
    assert not agent.signal("rank", signal.SIGTERM)  # already gone
    assert not alive(single) and not alive(group)
    with pytest.raises(KeyError, match="no process 'nothing'"):
        agent.wait("nothing")


def test_an_agents_processes_die_with_it(tmp_path):
    code = textwrap.dedent(f"""
        import json, sys
        from gyre.real.cluster.agent import NodeAgent
        agent = NodeAgent()
        pid = agent.launcher.submit(agent._popen, "k", ["sleep", "120"], agent.env(), {str(tmp_path / 'k.log')!r},
                                    None, False).result()
        print(json.dumps(pid), flush=True)
        sys.stdin.read()
    """)
    agent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = json.loads(agent.stdout.readline())
    assert alive(child)
    agent.kill()  # as Ray kills an actor: SIGKILL, no clean-up
    agent.wait(10)
    assert wait_until(lambda: not alive(child), 10), f"process {child} outlived its agent"


def test_an_engine_group_behind_its_holder_dies_with_a_killed_agent(tmp_path):
    """Ray need not SIGKILL a dead agent's children: the holder (which ignores SIGTERM) must die anyway, and
    its reaper then ends the engine's whole group."""
    code = textwrap.dedent(f"""
        import json, sys
        from gyre.real.cluster.agent import NodeAgent
        agent = NodeAgent()
        argv = [sys.executable, "-m", "gyre.real.cluster.holder", "--", sys.executable, "-m",
                "gyre.real.engines.reaper", "--", "sh", "-c", "sleep 120 & wait"]
        pid = agent.launcher.submit(agent._popen, "e", argv, agent.env(), {str(tmp_path / 'e.log')!r},
                                    None, True).result()
        print(json.dumps(pid), flush=True)
        sys.stdin.read()
    """)
    agent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    holder = json.loads(agent.stdout.readline())
    wait_until(lambda: len(group_members(holder)) >= 4, 30)  # holder, reaper, sh, sleep
    members = group_members(holder)
    assert len(members) == 4, members
    agent.kill()  # SIGKILL, and nobody kills the agent's children for it
    agent.wait(10)
    assert all_gone(members, within_s=30), [pid for pid in members if alive(pid)]


def test_the_holder_ends_like_its_command_and_its_command_dies_with_it(tmp_path):
    holder = [sys.executable, "-m", "gyre.real.cluster.holder", "--"]
    assert subprocess.run(holder + ["sh", "-c", "exit 3"], timeout=60).returncode == 3
    assert subprocess.run(holder + ["sh", "-c", "kill -TERM $$"], timeout=60).returncode == -signal.SIGTERM
    marker = tmp_path / "terminated"
    child = ("import signal, sys, time\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').write('x'), sys.exit(0)))\n"
             "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen(holder + [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)  # a stop signal is the command's (the reaper's) to handle: ignored here
    time.sleep(0.5)
    assert proc.poll() is None and not marker.exists()
    proc.kill()  # as Ray's raylet kills an exiting worker's direct children
    proc.wait(10)
    assert wait_until(marker.exists, 10), "the holder's command got no SIGTERM when the holder was killed"


def test_a_separate_pool_engine_gets_a_group_of_its_own_and_cells_keep_theirs():
    from gyre.actions import SEPARATE
    from gyre.real.cluster.placement import engine_homes

    homes = engine_homes(2, {0: "e0", 1: "e1", SEPARATE: "pool"})
    # SEPARATE is an int (-1): it must not be taken for a cell ("cell-1" is no group)
    assert homes == {"e0": "cell0", "e1": "cell1", "pool": "engine-pool"}
    assert engine_homes(1, {0: "e0", 1: "stray"})["stray"] == "engine-stray"  # past the last cell
