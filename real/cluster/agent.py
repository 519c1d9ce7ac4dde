"""One node agent per placement group: starts a cell's rank processes and its SGLang engine *on its node*.

``NodeAgent`` is a plain class; ``placement`` runs it as a Ray actor inside a
cell's placement group (``ray.remote(NodeAgent)``), so its processes start on
the node Ray placed the group on. It launches, with the same command lines a
single-machine run uses:

- a rank: ``python -m gyre.real.cluster.rank_main`` (the cell's
  ``train.cell.cell_main``; its ``CellConfig``, cell and rank arrive pickled on
  stdin), stdout and stderr in ``LOG``;
- an engine: ``engines.manager.launch_command`` under ``engines.reaper``, with
  ``engines.manager.launch_env`` read on this node, in its own process group,
  behind a ``cluster.holder`` (Ray SIGKILLs an exiting worker's direct children;
  the holder takes that, and the reaper, signalled as the holder dies, ends the group).

Each process gets the node's environment without the ``OMP_NUM_THREADS=1`` Ray
puts in actors (a process started by ``gyre run`` on one machine does not get
it either), plus ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` when the cluster
names an interface (so torch.distributed binds that interface, never a guess).
It also runs at the node's normal priority: Ray starts every worker process at
nice 15, which children inherit, so agents (and node supervisors) are created
with ``NORMAL_PRIORITY`` and a rank or an engine under Ray is not put behind
every other process of its node (CI once saw a nice-15 agent starved on a
loaded node: the rank it was asked to start came up after the driver's 120 s wait).
An agent of a CUDA job's cell holds the cell's GPUs (``gpus``; Ray gives it their
ids, logical GPUs included: ``ray start --num-gpus=N``) and shows its processes
exactly those: ``CUDA_VISIBLE_DEVICES`` = the ids in Ray's order for every rank
and the engine, and ``LOCAL_RANK`` = r for rank r, which selects ``cuda:r``
(``train.context.CellConfig.local_gpu``; never the global rank). ``placed_env``
answers those environments (and whether the node has CUDA: NCCL there, gloo
otherwise), for ``gyre run --dry-run`` and the tests.

``wait(key)`` blocks until the process ends and answers its exit status
(negative: the signal), so the driver learns of a death without polling;
``signal(key, sig)`` signals a rank, or an engine's whole process group.

Invariants: every process is launched from ONE long-lived thread with a
parent-death signal (``runtime.lifetime.die_with_parent``; the cell entry arms
its own), so when the agent dies (the job ended, ``ray.kill``, the driver
died and Ray reaped its actors) every process it started gets SIGTERM, or
SIGKILL from Ray itself, which kills an exiting worker's direct children: the
ranks and the engines' holders; an engine's reaper, behind its holder, still
gets its SIGTERM and ends the engine's whole group (``cluster.holder``); ``shutdown`` kills whatever still runs
and is idempotent; addresses are the node's address on the configured
interface (``config.interface_address``) or the one Ray advertises, never 0.0.0.0;
every process it starts has the niceness of the node's Ray processes (0), not Ray's 15.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from gyre.real.cluster.config import interface_address
from gyre.real.runtime.engine_watch import RestartThread
from gyre.real.runtime.lifetime import die_with_parent

RAY_SET = ("OMP_NUM_THREADS",)  # Ray sets these in every actor; processes started here should not inherit them
# the runtime environment of an actor that starts the job's processes: Ray's own switch for a worker's niceness
# (15 by default; Ray's job supervisor asks for 0 the same way)
NORMAL_PRIORITY = {"env_vars": {"RAY_worker_niceness": "0"}}


class NodeAgent:
    """Launches and owns processes on one node; see the module docstring."""

    def __init__(self, interface: str = "", cwd: str = "", gpus: int = 0) -> None:
        self.interface = interface
        self.gpus = _granted_gpus() if gpus else []  # this cell's GPU ids on this node, in Ray's order
        self.cwd = cwd if cwd and Path(cwd).is_dir() else None
        self.procs: dict[str, subprocess.Popen] = {}
        self.groups: set[str] = set()  # keys of processes that lead their own process group (engines)
        self.launcher = RestartThread("gyre-node-launcher").start()

    # ---- where this node is ---------------------------------------------------------------
    def address(self) -> str:
        """This node's address: on ``interface`` when one is configured, else the one Ray advertises."""
        if self.interface:
            try:
                return interface_address(self.interface)
            except OSError as exc:
                raise OSError(f"cluster.interface {self.interface!r} has no IPv4 address on node "
                              f"{socket.gethostname()} ({exc})") from None
        import ray

        return ray.util.get_node_ip_address()

    def node(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "address": self.address(),
                "hostname": socket.gethostname(), "agent_pid": os.getpid(), "gpus": list(self.gpus)}

    def free_port(self) -> int:
        """A TCP port free right now on this node's address (an engine binds it next)."""
        from gyre.real.runtime.ports import free_port

        return free_port(self.address())

    # ---- launching ----------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in RAY_SET}
        return {**env, **(extra or {}), **self.placed()}  # the cell's GPUs win over any inherited ones

    def placed(self, rank: int | None = None) -> dict[str, str]:
        """What this agent adds to a process's environment: the interface to bind, the cell's GPUs, and a
        rank's ``LOCAL_RANK`` (``rank`` None: the engine)."""
        env = {"GLOO_SOCKET_IFNAME": self.interface, "NCCL_SOCKET_IFNAME": self.interface} if self.interface else {}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
            if rank is not None:
                env["LOCAL_RANK"] = str(rank)
        return env

    def placed_env(self, tp: int) -> dict[str, Any]:
        """The environments of this cell's ``tp`` ranks and its engine, the GPUs, and whether CUDA is here."""
        return {"gpus": list(self.gpus), "cuda": cuda_present(), "engine": self.placed(),
                "ranks": [self.placed(rank) for rank in range(tp)]}

    def start_rank(self, key: str, cfg: Any, cell: int, rank: int, log_path: str) -> int:
        """Start rank ``rank`` of ``cell`` (``train.cell.cell_main``); returns its pid."""
        argv = [sys.executable, "-m", "gyre.real.cluster.rank_main"]
        payload = pickle.dumps((cfg, cell, rank))
        env = self.env({"PYTHONUNBUFFERED": "1", **self.placed(rank)})
        return self.launcher.submit(self._popen, key, argv, env, log_path, payload, False).result()

    def start_engine(self, key: str, spec: Any, python: str, log_path: str) -> int:
        """Start SGLang engine ``spec`` exactly as ``EngineManager.launch`` does; returns the reaper's pid."""
        from gyre.real.engines.manager import launch_command, launch_env

        argv = [sys.executable, "-m", "gyre.real.cluster.holder", "--", sys.executable, "-m",
                "gyre.real.engines.reaper", "--"] + launch_command(spec, Path(python))
        env = {k: v for k, v in launch_env(spec).items() if k not in RAY_SET}
        return self.launcher.submit(self._popen, key, argv, self.env(env), log_path, None, True).result()

    def _popen(self, key: str, argv: list[str], env: dict[str, str], log_path: str, stdin: bytes | None,
               group: bool) -> int:
        """On the launcher thread (the parent-death signal follows the forking thread)."""
        if key in self.procs and self.procs[key].poll() is None:
            raise RuntimeError(f"node agent: process {key!r} is already running (pid {self.procs[key].pid})")
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=die_with_parent)
        if stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        self.procs[key] = proc
        (self.groups.add if group else self.groups.discard)(key)
        return proc.pid

    # ---- watching and stopping -----------------------------------------------------------------
    def wait(self, key: str) -> int:
        """Block until process ``key`` ends; its exit status (negative: killed by that signal)."""
        return self._get(key).wait()

    def poll(self, key: str) -> int | None:
        return self._get(key).poll()

    def signal(self, key: str, sig: int) -> bool:
        """Send ``sig`` to process ``key`` (an engine: its whole group); False when it is already gone."""
        proc = self._get(key)
        try:
            if key in self.groups:
                os.killpg(proc.pid, sig)
            elif proc.poll() is None:
                os.kill(proc.pid, sig)
            else:
                return False
        except ProcessLookupError:
            return False
        return True

    def shutdown(self) -> list[str]:
        """Kill every process still running (engines: their groups); the keys it killed. Idempotent."""
        killed = []
        for key, proc in self.procs.items():
            if key in self.groups:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the reaper's group, whatever the launcher left
                except ProcessLookupError:
                    pass
            if proc.poll() is None:
                proc.kill()
                killed.append(key)
            proc.wait()
        return killed

    def _get(self, key: str) -> subprocess.Popen:
        try:
            return self.procs[key]
        except KeyError:
            raise KeyError(f"node agent: no process {key!r} (known: {sorted(self.procs)})") from None


def _granted_gpus() -> list[str]:
    """The GPU ids Ray gave this actor (its ``num_gpus``), as ``CUDA_VISIBLE_DEVICES`` spells them."""
    import ray

    return [str(gpu) for gpu in ray.get_gpu_ids()]


def cuda_present() -> bool:
    """Whether this node has an NVIDIA driver (NCCL can run); no torch import, no CUDA call."""
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/version").exists()
