"""A job placed on a Ray cluster: one placement group per cell, its engine beside it, the driver on the head.

``Placement.open`` connects to the cluster of a ``ClusterConfig`` and checks
that this process (the driver: the controller, the proxy, the harnesses and the
training plane's control store) runs on the head node. For each cell it
creates one ``STRICT_PACK`` placement group, so the cell's ranks and its
SGLang engine share a node:

    bundle 0        {CPU: rank_cpus, cell_resource: 1,    rank 0 (the cell's leader) and the node agent
                     GPU: gpus (a CUDA job's cells)}
    bundle 1..tp-1  {CPU: rank_cpus}                      the cell's other ranks
    last bundle     {CPU: engine_cpus}                    its SGLang engine (cells that serve rollouts)

A CUDA job's cell asks for its ``gpus`` GPUs in bundle 0, and its node agent
holds them (``num_gpus``): Ray gives the agent those GPUs' ids, the agent makes
exactly them visible to the cell's ranks and its engine (``CUDA_VISIBLE_DEVICES``,
``LOCAL_RANK``: ``cluster.agent``), which share them in turn (training, then
rollout), so the engine's bundle asks for none. ``ray start --num-gpus=N`` declares
N logical GPUs on a node with or without real ones, which is how the tests place
GPU cells on a machine without a GPU.

plus a group of one engine bundle for a separate rollout pool's engine. In
each group a ``cluster.agent.NodeAgent`` actor starts the processes on its
node. The training plane (``train.plane``) and the engine manager
(``engines.manager``) then drive them exactly as they drive local ones: they
get ``RemoteProcess`` handles (the ``multiprocessing.Process`` and
``subprocess.Popen`` calls they use), the cells rendezvous at the control
store on the head's address, each cell's Mooncake endpoint is its node's
address (``CellConfig.cell_hosts``), and each engine binds its node's address
on a port its agent chose there. Files (the work folder: micro-step queues,
checkpoints, logs) are shared: on a real cluster the work folder must be on a
filesystem every node mounts at the same path.

Invariants: nothing here runs unless a job has a ``[cluster]`` table (Ray is
imported lazily, only on this path); every address is a node's address on the
configured interface (or Ray's), never 0.0.0.0; ``close`` kills every process
the agents started, then the agents and the placement groups, and is
idempotent; a job killed outright leaves nothing of the agents either: they
are non-detached actors Ray ends with the driver, and their processes carry a
parent-death signal (``cluster.agent``). What ``gyre run`` keeps past its
driver (the engines) runs under the node supervisors ``open_supervisors``
opens (``cluster.node_supervisor``, ``cluster.node_engines``), not under the
agents: ``close`` stops them too, unless told to keep them for a resume.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable

from gyre.real.cluster.agent import NORMAL_PRIORITY, NodeAgent
from gyre.real.cluster.config import ClusterConfig, check_interface

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives its head node only


class PlacementError(RuntimeError):
    """The job cannot be placed on the cluster; the message says what is missing."""


class RemoteProcess:
    """A process a node agent started, seen through the calls the plane and the engine manager make.

    A watcher thread waits on the agent's ``wait`` (no polling); when the agent
    itself is gone its processes are too (parent-death signal), reported as SIGKILL."""

    def __init__(self, agent: Any, key: str, pid: int) -> None:
        self.agent, self.key, self.pid = agent, key, pid
        self._code: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._watch, name=f"gyre-watch-{key}", daemon=True).start()

    def _watch(self) -> None:
        import ray

        try:
            code = ray.get(self.agent.wait.remote(self.key))
        except Exception:  # the agent (or its node) died: its processes died with it
            code = -signal.SIGKILL
        self._code = code
        self._done.set()

    # subprocess.Popen's calls (engines.manager)
    def poll(self) -> int | None:
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.key, timeout)
        return self._code

    def signal_group(self, sig: int) -> None:
        """Signal the process (an engine: its group) on its node; ProcessLookupError when it is gone."""
        import ray

        try:
            sent = ray.get(self.agent.signal.remote(self.key, int(sig)), timeout=30)
        except Exception:
            sent = False
        if not sent:
            raise ProcessLookupError(f"{self.key} (pid {self.pid}) is gone")

    # multiprocessing.Process's calls (train.plane)
    @property
    def exitcode(self) -> int | None:
        return self._code

    def is_alive(self) -> bool:
        return self._code is None

    def kill(self) -> None:
        try:
            self.signal_group(signal.SIGKILL)
        except ProcessLookupError:
            pass

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)


@dataclass(frozen=True)
class Group:
    """One placement group: what it holds and where Ray put it."""

    name: str
    pg: Any
    agent: Any
    node_id: str
    address: str
    hostname: str
    gpus: tuple[str, ...] = ()  # the node's GPU ids Ray gave this group (CUDA_VISIBLE_DEVICES of its processes)


class Placement:
    def __init__(self, config: ClusterConfig, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.say = progress or (lambda line: None)
        self.cells: dict[int, Group] = {}
        self.engine_groups: dict[str, Group] = {}  # engine id -> the group its engine runs in
        self.started: dict[str, dict[str, int]] = {}  # group name -> {process name: pid} its agent started
        self.store_host = ""
        self.head: dict[str, str] = {}
        self.supervisors: Any = None  # node_supervisor.NodeSupervisors, once open_supervisors ran
        self._agents: list[Any] = []  # node agents and placement groups made so far (``close`` ends them)
        self._pgs: list[Any] = []
        self._connected = False

    # ---- opening -------------------------------------------------------------------------------
    def open(self, *, cells: int, tp: int, engines: dict[Hashable, str], gpus: int = 0) -> Placement:
        """Connect, place ``cells`` cells of ``tp`` ranks (and ``gpus`` GPUs each, for a CUDA job); ``engines``
        maps a cell (int) to its engine id, any other key (a separate pool) to an engine in a group of its own."""
        import ray

        try:
            ray.init(address=self.config.address, namespace="gyre", log_to_driver=False, logging_level="WARNING")
        except Exception as exc:
            raise PlacementError(f"cannot connect to the Ray cluster at cluster.address = "
                                 f"{self.config.address!r}: {type(exc).__name__}: {exc}") from None
        self._connected = True
        try:
            self._check_head()
            homes = engine_homes(cells, engines)
            groups = {f"cell{c}": self._bundles(tp, engine=c in engines, gpus=gpus) for c in range(cells)}
            groups.update({home: [{"CPU": self.config.engine_cpus}]
                           for home in homes.values() if home not in groups})
            placed = self._place(groups, gpus={f"cell{c}": gpus for c in range(cells)})
            self.cells = {c: placed[f"cell{c}"] for c in range(cells)}
            self.engine_groups = {name: placed[home] for name, home in homes.items()}
        except BaseException:
            self.close()
            raise
        for line in self.describe_lines():
            self.say(line)
        return self

    def _check_head(self) -> None:
        import ray

        here = ray.get_runtime_context().get_node_id()
        heads = [n for n in ray.nodes() if n["Alive"] and HEAD_RESOURCE in n["Resources"]]
        if not any(n["NodeID"] == here for n in heads):
            raise PlacementError("gyre run must run on the Ray cluster's head node (the controller, the proxy "
                                 "and the harnesses run beside the driver): start it there, or submit it as a "
                                 f"Ray job; this process is on node {here}")
        self.store_host = check_interface(self.config.interface) if self.config.interface \
            else ray.util.get_node_ip_address()
        self.head = {"node_id": here, "address": self.store_host}

    def _bundles(self, tp: int, *, engine: bool, gpus: int = 0) -> list[dict[str, float]]:
        c = self.config
        first = {"CPU": c.rank_cpus, **({c.cell_resource: 1} if c.cell_resource else {}),
                 **({"GPU": gpus} if gpus else {})}
        return [first] + [{"CPU": c.rank_cpus} for _ in range(tp - 1)] + ([{"CPU": c.engine_cpus}] if engine else [])

    def _place(self, groups: dict[str, list[dict[str, float]]], gpus: dict[str, int]) -> dict[str, Group]:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pgs = {name: placement_group(bundles, strategy="STRICT_PACK", name=f"gyre-{name}-{os.getpid()}")
               for name, bundles in groups.items()}
        self._pgs = list(pgs.values())
        ready, _ = ray.wait([pg.ready() for pg in pgs.values()], num_returns=len(pgs),
                            timeout=self.config.start_timeout_s)
        if len(ready) < len(pgs):
            waiting = [name for name, pg in pgs.items() if not _ready(pg)]
            raise PlacementError(f"the cluster could not place {waiting} within {self.config.start_timeout_s:.0f} s "
                                 f"(each asks for {[groups[n] for n in waiting]}, STRICT_PACK: one node each); "
                                 f"the cluster has {ray.available_resources()} available")
        actor = ray.remote(NodeAgent)
        agents = {name: actor.options(num_cpus=0, num_gpus=gpus.get(name, 0), max_concurrency=64,
                                      runtime_env=NORMAL_PRIORITY,
                                      scheduling_strategy=PlacementGroupSchedulingStrategy(
                                          placement_group=pg, placement_group_bundle_index=0))
                  .remote(self.config.interface, os.getcwd(), gpus=gpus.get(name, 0)) for name, pg in pgs.items()}
        self._agents = list(agents.values())
        nodes = dict(zip(agents, ray.get([a.node.remote() for a in agents.values()],
                                         timeout=self.config.start_timeout_s)))
        return {name: Group(name, pgs[name], agents[name], nodes[name]["node_id"], nodes[name]["address"],
                            nodes[name]["hostname"], tuple(nodes[name]["gpus"])) for name in pgs}

    def nodes(self) -> list[str]:
        """The node ids the job's groups sit on, in order of first use."""
        return list(dict.fromkeys(g.node_id for g in [*self.cells.values(), *self.engine_groups.values()]))

    def open_supervisors(self, run_dir: str | os.PathLike, grace_s: float, lease_s: float | None = None,
                         known: list[str] = (), nodes: list[str] | None = None) -> Any:
        """One supervisor per node the job uses (``nodes``, default ``nodes()``; ``node_supervisor``: detached
        actors, found again by a resumed driver), and the live ones of the ``known`` nodes a killed attempt
        used, their leases renewed until ``close``; what a node runs past the driver goes through them."""
        from gyre.real.cluster.node_supervisor import NodeSupervisors
        from gyre.real.supervisor.daemon import LEASE_S

        lease_s = LEASE_S if lease_s is None else lease_s
        nodes = self.nodes() if nodes is None else nodes
        self.supervisors = NodeSupervisors.open(run_dir, nodes, grace_s, lease_s, known) \
            .renew_leases(lease_s / 4)
        return self.supervisors

    # ---- what the plane and the engine manager call ------------------------------------------------
    def cell_config(self, cfg: Any) -> Any:
        """The plane's ``CellConfig`` with the head's store address and each cell's node address."""
        return dataclasses.replace(cfg, store_host=self.store_host, placed=True,
                                   cell_hosts=tuple(self.cells[c].address for c in range(len(self.cells))),
                                   workdir=str(Path(cfg.workdir).resolve()),
                                   queue_root=str(Path(cfg.queue_root).resolve()))

    def start_rank(self, cfg: Any, cell: int, rank: int, name: str) -> RemoteProcess:
        import ray

        group = self.cells[cell]
        log = str(Path(cfg.workdir).resolve() / f"{name}.out")
        pid = ray.get(group.agent.start_rank.remote(name, cfg, cell, rank, log), timeout=self.config.start_timeout_s)
        self.started.setdefault(group.name, {})[name] = pid
        return RemoteProcess(group.agent, name, pid)

    def engine_endpoint(self, engine_id: str) -> tuple[str, int]:
        """(the node's address, a port free there) for engine ``engine_id``."""
        import ray

        group = self.engine_groups[engine_id]
        return group.address, ray.get(group.agent.free_port.remote(), timeout=self.config.start_timeout_s)

    def engine_env(self, engine_id: str) -> dict[str, str]:
        """What the node agent of engine ``engine_id``'s group adds to an engine's environment (its node's
        interface, the cell's GPUs: ``agent.NodeAgent.placed``); a launcher other than the agent gives it too."""
        import ray

        group = self.engine_groups[engine_id]
        return ray.get(group.agent.placed.remote(), timeout=self.config.start_timeout_s)

    def start_engine(self, spec: Any, python: Path, log_path: Path) -> RemoteProcess:
        import ray

        group = self.engine_groups[spec.engine_id]
        key = f"engine-{spec.engine_id}-{time.monotonic_ns()}"  # a restart is a new process
        pid = ray.get(group.agent.start_engine.remote(key, spec, str(python), str(Path(log_path).resolve())),
                      timeout=self.config.start_timeout_s)
        self.started.setdefault(group.name, {})[key] = pid
        return RemoteProcess(group.agent, key, pid)

    # ---- describing and closing -----------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Where everything runs (summary.json's ``placement``): each group's node, address and the
        processes its agent started (name -> pid), each engine's group, and what each node supervisor
        runs and started again (``_supervision``)."""
        return {"head": dict(self.head), "driver": "head",
                "cells": {c: {"node_id": g.node_id, "address": g.address, "hostname": g.hostname,
                              **({"gpus": list(g.gpus)} if g.gpus else {}),
                              "processes": dict(self.started.get(g.name, {}))} for c, g in self.cells.items()},
                "engines": {e: {"node_id": g.node_id, "address": g.address} for e, g in self.engine_groups.items()},
                "supervisors": self._supervision()}

    def _supervision(self) -> dict[str, dict[str, Any]]:
        """Per node supervisor: the processes it runs now (key -> pid) and, per key started more than once, why
        each earlier run did not count (``supervisor.ledger.restarts``: e.g. its supervisor was lost)."""
        from gyre.real.supervisor.daemon import LEDGER_NAME
        from gyre.real.supervisor.ledger import RUNNING, read_records, restarts

        if self.supervisors is None:
            return {}
        view = self.supervisors.view()
        return {node: {"running": {k: e.pid for k, e in view[node].items() if e.state == RUNNING},
                       "restarted": restarts(read_records(Path(s.folder) / LEDGER_NAME))}
                for node, s in self.supervisors.live().items()}

    def describe_lines(self) -> list[str]:
        nodes = sorted({g.node_id for g in self.cells.values()})
        lines = [f"Ray cluster {self.config.address}: driver, controller and proxy on the head "
                 f"({self.head.get('address')}); {len(self.cells)} cells on {len(nodes)} node(s)"]
        for c, g in self.cells.items():
            engine = [e for e, eg in self.engine_groups.items() if eg is g]
            gpus = f", GPUs {','.join(g.gpus)} of its node" if g.gpus else ""
            lines.append(f"cell {c}: node {g.node_id[:8]} ({g.address}){gpus}"
                         f"{', engine ' + engine[0] if engine else ''}")
        return lines

    def environments(self, tp: int) -> dict[int, dict[str, Any]]:
        """What each cell's agent gives its processes (``cluster.agent.NodeAgent.placed_env``): per cell,
        ``ranks`` (one environment per rank) and ``engine``, and whether the node has CUDA."""
        import ray

        answers = ray.get([g.agent.placed_env.remote(tp) for g in self.cells.values()],
                          timeout=self.config.start_timeout_s)
        return dict(zip(self.cells, answers))

    def close(self, keep_supervisors: bool = False) -> None:
        """Kill every process the agents started, then the agents and groups; stop the node supervisors and
        what they own (``keep_supervisors``: stop renewing their leases only, a resume re-attaches); disconnect.
        Idempotent."""
        if not self._connected:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.supervisors is not None:
            if keep_supervisors:
                self.supervisors.release()
            else:
                self.supervisors.stop()
            self.supervisors = None
        agents, pgs = self._agents, self._pgs
        try:
            ray.get([a.shutdown.remote() for a in agents], timeout=60)
        except Exception:
            pass  # an agent already gone took its processes with it (parent-death signal)
        for agent in agents:
            try:
                ray.kill(agent)
            except Exception:
                pass  # already dead
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass  # the cluster already dropped it
        self._agents, self._pgs = [], []
        ray.shutdown()
        self._connected = False


def engine_homes(cells: int, engines: dict[Hashable, str]) -> dict[str, str]:
    """The placement group each engine lives in: a cell's (key 0..cells-1) its cell's, ``cell<c>``;
    any other key (the separate pool, ``gyre.actions.SEPARATE`` = -1 among them) a group of its own,
    ``engine-<name>``."""
    return {name: f"cell{key}" if isinstance(key, int) and 0 <= key < cells else f"engine-{name}"
            for key, name in engines.items()}


def _ready(pg: Any) -> bool:
    import ray

    done, _ = ray.wait([pg.ready()], timeout=0)
    return bool(done)
