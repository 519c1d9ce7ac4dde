"""The run's SGLang engines as processes of its supervisor: they outlive the driver and are adopted on resume.

``SupervisedEngines(client)`` is the engine manager's ``launcher``
(``engines.manager.EngineManager``) when a run is alone on its node: each
engine is spawned by the supervisor under the key ``engine-ID`` with exactly
the command line, environment and log file the manager would use itself
(``engines.manager.reaped_command``, ``launch_env``: the reaper leads the
engine's process group), so a ``kill -9`` of ``gyre run`` leaves it serving,
and ``gyre stop``, a clean end or an expired lease stop it with everything
else the supervisor owns (TERM, then KILL of its group). A killed supervisor
takes it along (the parent-death signal of every process it spawns).

``SupervisedProcess`` is the handle the manager drives, with the calls of
``subprocess.Popen`` it uses (``pid``, ``poll``, ``wait``) and
``signal_group``: the state comes from the supervisor's ledger, the signals go
to the engine's process group through the supervisor (so the ledger records
a manager's stop as a driver's kill), or straight to it once the supervisor
no longer runs it. ``running_engine(ID)``
hands a resumed manager the engine the supervisor still runs (``adopt``).

On a Ray cluster the client is a node's supervisor reached through its actor
(``cluster.node_supervisor.RemoteSupervisor``, the same ``call``), the
environment is built on that node (``environment``), and the engine's
processes are not this machine's (``local=False``): with its supervisor gone,
an engine reads as killed (it died with it: parent-death signals), and a
signal goes only through the supervisor.

Invariants: at most one process per engine id (the supervisor's key); a
launch never attaches to a running engine by accident (it is stopped first:
only ``running_engine`` adopts); a supervisor that does not answer leaves
``poll`` reporting the group as it is (running while any member lives, else
killed), and a launch through it fails with ``EngineError`` naming the engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from gyre.real.engines.manager import EngineError, EngineSpec, launch_env, reaped_command
from gyre.real.supervisor.client import CALL_TIMEOUT_S, SupervisorClient, SupervisorGone

KILL_GRACE_S = 20.0  # as ``EngineManager.shutdown``


def engine_key(engine_id: str) -> str:
    return f"engine-{engine_id}"


def _exit_code(entry: dict[str, Any] | None) -> int | None:
    """None while running; its exit code once ended; SIGKILL when lost with a dead supervisor."""
    if entry is None or entry["state"] == "running":
        return None
    return entry["exit_code"] if entry["exit_code"] is not None else -signal.SIGKILL


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not: it only waits to be reaped)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class SupervisedProcess:
    """An engine process the supervisor owns, seen through the ``subprocess.Popen`` calls of the manager."""

    def __init__(self, client: SupervisorClient, key: str, pid: int, local: bool = True) -> None:
        self.client, self.key, self.pid, self.local = client, key, pid, local

    def poll(self) -> int | None:
        try:
            entry = self.client.call("status", key=self.key)
        except SupervisorGone:  # its processes die with it (parent-death signal): ended once its group is empty
            return None if self.local and _group_alive(self.pid) else -signal.SIGKILL
        if entry is not None and int(entry["pid"]) != self.pid:
            return -signal.SIGKILL  # started again under the key since: this process is gone
        return _exit_code(entry)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 20.0 if deadline is None else max(0.0, min(20.0, deadline - time.monotonic()))
            try:
                self.client.call("wait", timeout=left + CALL_TIMEOUT_S, key=self.key, timeout_s=left)
            except SupervisorGone:
                time.sleep(min(left, 0.1))
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.key, timeout)

    def signal_group(self, sig: int) -> None:
        """Signal the engine's process group (its pid is the group's id): through the supervisor while it runs
        the engine, so its ledger records the end as a driver's kill; else directly (what is left of the group
        once the leader has ended). ProcessLookupError when the group is gone."""
        try:
            if self.client.call("signal", key=self.key, pid=self.pid, sig=int(sig)):
                return
        except SupervisorGone:
            pass
        if not self.local:  # another node's process: gone with its supervisor, or reachable only through it
            raise ProcessLookupError(f"{self.key} (pid {self.pid}): its node's supervisor does not run it")
        os.killpg(self.pid, sig)


class SupervisedEngines:
    """The engine manager's launcher under the run's supervisor (module docstring)."""

    def __init__(self, client: SupervisorClient, environment: Callable[[EngineSpec], dict[str, str]] = launch_env,
                 local: bool = True) -> None:
        self.client, self.environment, self.local = client, environment, local

    def start_engine(self, spec: EngineSpec, python: Path, log_path: Path) -> SupervisedProcess:
        key = engine_key(spec.engine_id)
        try:
            if self._running(key) is not None:  # a launch is never an adoption (module docstring)
                self.client.call("kill", key=key, grace_s=KILL_GRACE_S, timeout=2 * KILL_GRACE_S + CALL_TIMEOUT_S)
            Path(log_path).write_text("")  # a fresh log per process, as the manager's own launch
            answer = self.client.call("spawn", key=key, argv=reaped_command(spec, python), env=self.environment(spec),
                                      cwd=str(Path(log_path).parent), log=str(log_path), again=True)
        except (SupervisorGone, RuntimeError) as exc:
            raise EngineError(f"engine {spec.engine_id!r}: the supervisor could not start it: {exc}") from None
        return SupervisedProcess(self.client, key, int(answer["entry"]["pid"]), self.local)

    def running_engine(self, engine_id: str) -> SupervisedProcess | None:
        """The engine the supervisor runs now under ``engine_id`` (a resumed job adopts it), or None."""
        key = engine_key(engine_id)
        try:
            entry = self._running(key)
        except SupervisorGone:
            return None
        return None if entry is None else SupervisedProcess(self.client, key, int(entry["pid"]), self.local)

    def _running(self, key: str) -> dict[str, Any] | None:
        entry = self.client.call("status", key=key)
        return entry if entry is not None and entry["state"] == "running" else None
