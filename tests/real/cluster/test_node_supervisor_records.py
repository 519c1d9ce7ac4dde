"""What ``gyre stop`` reads of a Ray run's node supervisors, and their names (no Ray cluster needed).

``cluster.node_supervisor.stop_on_cluster`` reads ``RUN_DIR/supervisor/nodes/cluster.json``: a
run without it gets no line; a damaged one (any bytes, any JSON) or an address that does not
answer gets one line naming the problem, never an exception and never a ``ray.init`` that
retries a dead address. ``actor_name`` is a pure function of the resolved run folder and the
node, so a resumed driver finds the same names from another working directory.
"""

from __future__ import annotations

import json
import os
import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.cluster.node_supervisor import CLUSTER_FILE, NODES_DIR, actor_name, stop_on_cluster
from gyre.real.supervisor.client import SUPERVISOR_DIR

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=10)
# no ':' in a generated address: nothing here may try the network
ADDRESSES = st.text(alphabet=st.characters(blacklist_characters=":", blacklist_categories=("Cs",)), max_size=30)


def record_path(run):
    folder = run / SUPERVISOR_DIR / NODES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder / CLUSTER_FILE


def test_a_run_that_never_used_a_cluster_gets_no_line(tmp_path):
    assert stop_on_cluster(tmp_path) == []


@settings(max_examples=60, deadline=None)
@given(content=st.binary(max_size=200) | JSON.map(lambda value: json.dumps(value).encode())
       | st.builds(lambda address, nodes: json.dumps({"address": address, "nodes": nodes}).encode(),
                   ADDRESSES, st.lists(st.text(max_size=10), max_size=3)))
def test_a_damaged_or_unreachable_record_gets_one_line_naming_it(tmp_path_factory, content):
    run = tmp_path_factory.mktemp("run")
    record_path(run).write_bytes(content)
    lines = stop_on_cluster(run)
    assert len(lines) == 1 and lines[0].startswith("node supervisors: ")
    assert "damaged" in lines[0] or "cannot reach" in lines[0]


def test_an_address_nobody_listens_on_is_refused_at_once(tmp_path):
    with socket.socket() as sock:  # a port bound but not listening: a connect there is refused
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        record_path(tmp_path).write_text(json.dumps({"address": address, "nodes": ["n1"]}))
        [line] = stop_on_cluster(tmp_path)
    assert line.startswith(f"node supervisors: cannot reach the Ray cluster at {address} (ConnectionRefusedError")


def test_actor_names_follow_the_resolved_run_folder_and_the_node(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    name = actor_name(tmp_path / "run", "node-a")
    monkeypatch.chdir(tmp_path)
    assert actor_name("run", "node-a") == name == actor_name(f"{os.sep}{tmp_path}/./run", "node-a")
    assert actor_name("run", "node-b") != name and actor_name(tmp_path, "node-a") != name
