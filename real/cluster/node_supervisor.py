"""One supervisor per node of a Ray cluster: a detached actor that hosts that node's supervisor daemon.

On a cluster the driver cannot reach a node's supervisor daemon (it listens on
the node's 127.0.0.1), and a process the driver starts on a node dies with the
driver's Ray job. So each node the run uses gets a ``NodeSupervisorHost``: a Ray
actor with ``lifetime="detached"`` (it outlives the driver's job), pinned to its
node (``NodeAffinitySchedulingStrategy``, hard), named from the run folder and
the node (``actor_name``) in the job's namespace (``NAMESPACE``), so a resumed
driver finds it by name. It starts (or reuses) the node's daemon,
``python -m gyre.real.supervisor RUN_DIR/supervisor/nodes/NODE`` (the one of
``real/supervisor``: same ledger, lease, grace, spawn-by-key), and carries the
driver's calls to it; it is a transport, never a second supervisor.

- **Lease.** The daemon's own: the driver renews it through the actor
  (``NodeSupervisors.renew_leases``, a ``LeaseRenewer`` per node). A lease
  expired past the grace makes the daemon stop what it owns and exit; so does
  ``stop`` (``gyre stop``, a run's normal end). The actor waits on its daemon
  and, once it has exited, kills itself (``ray.kill`` of its own handle): no
  detached actor outlives its daemon.
- **Its own death.** The daemon is started from one long-lived thread of the
  actor with a parent-death SIGKILL: a killed actor (``ray.kill``, a dead node)
  takes its daemon with it, and the daemon's processes go too (their own
  parent-death signal). Their ledger entries stay ``running``; the driver reads
  them as ``lost`` (``NodeSupervisors.view``), the re-run path of a lost supervisor.
- **Environment.** A spawn without ``env`` gets the node's own environment
  (read by the actor, without what Ray sets in actors: ``agent.RAY_SET``), and
  the node's normal priority (``agent.NORMAL_PRIORITY``, not Ray's nice 15).

Invariants: at most one actor per (run folder, node) (``get_if_exists``); a
call to a node whose actor is gone raises ``SupervisorGone`` naming the node; an
actor ends once its daemon has exited; the ledger is the node supervisor's
folder on the shared run folder, readable when the actor is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.real.cluster.agent import NORMAL_PRIORITY, RAY_SET
from gyre.real.runtime.engine_watch import RestartThread
from gyre.real.supervisor.client import SUPERVISOR_DIR, LeaseRenewer, SupervisorGone, start_or_reuse
from gyre.real.supervisor.daemon import LEASE_S, LEDGER_NAME
from gyre.real.supervisor.ledger import LOST, RUNNING, Entry, read_ledger

NAMESPACE = "gyre"      # the job's Ray namespace (placement.Placement.open connects in it)
NODES_DIR = "nodes"     # RUN_DIR/supervisor/nodes/<node id>: one daemon folder per node
CLUSTER_FILE = "cluster.json"  # RUN_DIR/supervisor/nodes/cluster.json: the cluster's address and the nodes
CALL_TIMEOUT_S = 60.0


def actor_name(run_dir: str | os.PathLike, node_id: str) -> str:
    """The node supervisor's actor name: the run folder (resolved, hashed) and the node."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return f"gyre-supervisor-{digest}-{node_id}"


def node_folder(run_dir: str | os.PathLike, node_id: str) -> Path:
    return Path(run_dir).resolve() / SUPERVISOR_DIR / NODES_DIR / node_id[:16]


class NodeSupervisorHost:
    """The detached actor's class (module docstring): starts its node's daemon and forwards calls to it."""

    def __init__(self, folder: str, grace_s: float, lease_s: float) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.launcher = RestartThread("gyre-node-supervisor").start()  # the daemon's parent-death thread
        self.client, self.reused = self.launcher.submit(start_or_reuse, folder, grace_s, 30.0, lease_s,
                                                        signal.SIGKILL).result()
        threading.Thread(target=self._end_with_daemon, name="gyre-daemon-watch", daemon=True).start()

    def _end_with_daemon(self) -> None:
        import ray

        try:
            os.waitpid(self.client.pid, 0)  # our child: reap it
        except ChildProcessError:  # reused: not our child
            while _exists(self.client.pid):
                time.sleep(0.5)
        ray.kill(ray.get_runtime_context().current_actor)

    def describe(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "actor_pid": os.getpid(), "daemon_pid": self.client.pid,
                "folder": str(self.client.folder), "reused": self.reused}

    def engine_env(self, spec: Any, placed: dict[str, str]) -> dict[str, str]:
        """An SGLang engine's environment on this node, as a node agent gives it (``agent.NodeAgent.start_engine``):
        ``engines.manager.launch_env`` read here, without what Ray sets in actors, plus ``placed`` (the
        interface, the cell's GPUs: ``agent.NodeAgent.placed``)."""
        from gyre.real.engines.manager import launch_env

        return {**{k: v for k, v in launch_env(spec).items() if k not in RAY_SET}, **placed}

    def call(self, op: str, timeout: float, fields: dict[str, Any]) -> Any:
        """One request to the daemon; a spawn without ``env`` gets this node's environment."""
        if op == "spawn" and fields.get("env") is None:
            fields = {**fields, "env": {k: v for k, v in os.environ.items() if k not in RAY_SET}}
        return self.client.call(op, timeout=timeout, **fields)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class RemoteSupervisor:
    """The driver's handle on one node's supervisor: ``SupervisorClient``'s calls, through its actor."""

    node_id: str
    folder: Path
    actor: Any

    def call(self, op: str, timeout: float = CALL_TIMEOUT_S, **fields: Any) -> Any:
        """One request; ``SupervisorGone`` when the actor (or its daemon) is gone."""
        return self._ask(op, self.actor.call.remote(op, timeout, fields), timeout + CALL_TIMEOUT_S)

    def _ask(self, what: str, ref: Any, timeout: float) -> Any:
        """``ray.get(ref)`` with the actor's failures told as the daemon's: ``SupervisorGone`` when the actor is
        gone (or the call raised it), ``RuntimeError`` when no answer came in time or the call raised another."""
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as exc:
            raise SupervisorGone(f"the supervisor of node {self.node_id} ({self.folder}) is gone: "
                                 f"{type(exc).__name__}") from None
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the supervisor of node {self.node_id}: {what} got no answer in time") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            raise (cause if isinstance(cause, SupervisorGone) else RuntimeError(str(cause))) from None

    def spawn(self, key: str, argv: list[str], cwd: str, log: str, env: dict[str, str] | None = None,
              again: bool = False) -> tuple[Entry, bool]:
        """Start ``argv`` under ``key`` on the node (True), or the entry of the key's process (False)."""
        answer = self.call("spawn", key=key, argv=argv, env=env, cwd=cwd, log=log, again=again)
        return Entry(**answer["entry"]), bool(answer["started"])

    def entries(self) -> dict[str, Entry]:
        return {key: Entry(**e) for key, e in self.call("list").items()}

    def kill(self, key: str, grace_s: float) -> Entry:
        return Entry(**self.call("kill", timeout=2 * grace_s + CALL_TIMEOUT_S, key=key, grace_s=grace_s))

    def renew(self) -> None:
        self.call("renew", timeout=5.0)

    def describe(self) -> dict[str, Any]:
        return self._ask("describe", self.actor.describe.remote(), CALL_TIMEOUT_S)

    def engine_env(self, spec: Any, placed: dict[str, str]) -> dict[str, str]:
        """An engine's environment built on this node (``NodeSupervisorHost.engine_env``)."""
        return self._ask("engine_env", self.actor.engine_env.remote(spec, placed), CALL_TIMEOUT_S)

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop what the daemon owns and the daemon; True once the actor has ended with it."""
        try:
            self.call("stop")
        except SupervisorGone:
            return True
        return _actor_gone_within(self.actor, timeout)


def _host(run_dir: str | os.PathLike, node: str, grace_s: float, lease_s: float) -> RemoteSupervisor:
    """The node's detached host actor (module docstring), created unless one of its name lives."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder = node_folder(run_dir, node)
    return RemoteSupervisor(node, folder, ray.remote(NodeSupervisorHost).options(
        name=actor_name(run_dir, node), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=0, max_concurrency=32, max_restarts=0, runtime_env=NORMAL_PRIORITY,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(str(folder), grace_s, lease_s))


def _actor_gone_within(actor: Any, timeout: float) -> bool:
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.describe.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return True
        time.sleep(0.2)
    return False


def _view_of(folder: Path, live: RemoteSupervisor | None, node_id: str) -> dict[str, Entry]:
    if live is not None:
        try:
            return live.entries()
        except SupervisorGone:
            pass
    reason = f"its node's supervisor is gone (no actor answers for node {node_id})"
    return {key: Entry(**{**e.as_dict(), "state": LOST, "reason": reason}) if e.state == RUNNING else e
            for key, e in read_ledger(folder / LEDGER_NAME).items()}


class NodeSupervisors:
    """The run's supervisors on the nodes it uses: opened (found or created) or found by name; renews leases.

    ``supervisors[node]`` is None for a node whose supervisor is gone (found, not opened)."""

    def __init__(self, run_dir: str | os.PathLike, supervisors: dict[str, RemoteSupervisor | None],
                 grace_s: float = 0.0, lease_s: float = LEASE_S) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.supervisors = supervisors
        self.grace_s, self.lease_s = grace_s, lease_s  # what ``reopen`` starts a node's supervisor with
        self.renewers: list[LeaseRenewer] = []
        self._every_s: float | None = None

    @classmethod
    def open(cls, run_dir: str | os.PathLike, node_ids: list[str], grace_s: float,
             lease_s: float = LEASE_S, known: list[str] = ()) -> NodeSupervisors:
        """Each node's supervisor, created unless its actor lives (then: the same actor, re-attached); and the
        live supervisors of the ``known`` nodes a killed attempt used (``recorded_nodes``), found, not created:
        what they still run can be adopted. ``cluster.json`` names them all."""
        import ray

        handles = {node: _host(run_dir, node, grace_s, lease_s) for node in node_ids}
        for supervisor in handles.values():
            supervisor.describe()  # up and listening (a daemon that cannot start fails here, naming why)
        handles.update(cls.find(run_dir, [node for node in known if node not in handles]).live())
        record = Path(run_dir).resolve() / SUPERVISOR_DIR / NODES_DIR / CLUSTER_FILE
        record.write_text(json.dumps({"address": ray.get_runtime_context().gcs_address, "nodes": list(handles)}))
        return cls(run_dir, dict(handles), grace_s, lease_s)

    def reopen(self, node: str) -> RemoteSupervisor:
        """A new supervisor for ``node`` whose supervisor is gone (its lease renewed as the others'); its
        ledger goes on in the same folder, so a key started again counts a second start."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:  # the lost actor's name is freed only once Ray has seen it die
            supervisor = _host(self.run_dir, node, self.grace_s, self.lease_s)
            try:
                supervisor.describe()
                break
            except SupervisorGone:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.supervisors[node] = supervisor
        if self._every_s is not None:
            self.renewers.append(LeaseRenewer(supervisor, self._every_s).start())  # type: ignore[arg-type]
        return supervisor

    @classmethod
    def find(cls, run_dir: str | os.PathLike, node_ids: list[str]) -> NodeSupervisors:
        """Each node's live supervisor by name (a resumed driver); None for a node whose actor is gone."""
        import ray

        found: dict[str, RemoteSupervisor | None] = {}
        for node in node_ids:
            try:
                actor = ray.get_actor(actor_name(run_dir, node), namespace=NAMESPACE)
            except ValueError:
                actor = None
            found[node] = None if actor is None else RemoteSupervisor(node, node_folder(run_dir, node), actor)
        return cls(run_dir, found)

    def live(self) -> dict[str, RemoteSupervisor]:
        return {node: s for node, s in self.supervisors.items() if s is not None}

    def view(self) -> dict[str, dict[str, Entry]]:
        """Per node, every key its ledger holds as it stands now; a gone node's running keys read as lost."""
        return {node: _view_of(node_folder(self.run_dir, node), s, node) for node, s in self.supervisors.items()}

    def renew_leases(self, every_s: float) -> NodeSupervisors:
        """Renew every live supervisor's lease from a thread each, every ``every_s`` seconds, until ``release``."""
        self._every_s = every_s
        self.renewers = [LeaseRenewer(s, every_s).start() for s in self.live().values()]  # type: ignore[arg-type]
        return self

    def release(self) -> None:
        """Stop renewing: the supervisors run on until their lease and grace expire (a resume re-attaches)."""
        for renewer in self.renewers:
            renewer.stop()
        self.renewers, self._every_s = [], None

    def stop(self, timeout: float = 30.0) -> dict[str, bool]:
        """Stop every live supervisor with what it owns (its actor ends with it); per node, whether it ended."""
        self.release()
        return {node: s.stop(timeout) for node, s in self.live().items()}



def recorded_nodes(run_dir: str | os.PathLike) -> list[str]:
    """The nodes whose supervisors the run opened (its ``cluster.json``); none when it has no readable one."""
    record = Path(run_dir).resolve() / SUPERVISOR_DIR / NODES_DIR / CLUSTER_FILE
    try:
        return [str(node) for node in json.loads(record.read_text())["nodes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def stop_on_cluster(run_dir: str | os.PathLike, timeout: float = 60.0) -> list[str]:
    """``gyre stop RUN_DIR``'s part on a Ray cluster: stop every node supervisor the run opened (its
    ``cluster.json``), with what each owns; one line per node, none when the run never used a cluster."""
    record = Path(run_dir).resolve() / SUPERVISOR_DIR / NODES_DIR / CLUSTER_FILE
    if not record.is_file():
        return []
    try:
        placed = json.loads(record.read_text())
        address, nodes = str(placed["address"]), [str(node) for node in placed["nodes"]]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"node supervisors: {record} is damaged ({type(exc).__name__}: {exc}); they stop on their own "
                f"once their lease and grace expire"]
    unreachable = _unreachable(address)
    if unreachable:
        return [f"node supervisors: cannot reach the Ray cluster at {address} ({unreachable}); if it is gone, "
                f"its actors went with it"]
    try:
        import ray

        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
    except Exception as exc:  # noqa: BLE001 - no Ray, or the cluster is gone (and its actors with it)
        return [f"node supervisors: cannot reach the Ray cluster at {address} "
                f"({type(exc).__name__}: {exc})"]
    try:
        found = NodeSupervisors.find(run_dir, nodes)
        gone = found.stop(timeout)
        return [f"node supervisor of node {node[:12]}: " + ("gone already" if node not in gone else
                "stopped with everything it owned" if gone[node] else "still stopping") for node in found.supervisors]
    finally:
        ray.shutdown()


def _unreachable(address: str) -> str:
    """Why the GCS at ``HOST:PORT`` cannot be reached now ("" when it answers a TCP connect): ``ray.init``
    would otherwise retry a dead address for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return "not HOST:PORT"
    try:
        socket.create_connection((host, int(port)), timeout=5.0).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""
