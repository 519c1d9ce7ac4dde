"""A Ray job's SGLang engines under their nodes' supervisors: they outlive the driver and are adopted on resume.

``NodeEngines(placement, supervisors)`` is the engine manager's ``launcher``
(``engines.manager.EngineManager``) when a run is placed on a Ray cluster
(``cluster.placement``): each engine is started on the node of its placement
group by that node's supervisor (``cluster.node_supervisor``: a detached actor
hosting the node's daemon), through ``supervisor.engines.SupervisedEngines``
bound to the node (the same key ``engine-ID``, reaper command line and log as
on one host; the environment is built on the node, with what the group's node
agent gives an engine there: the interface and the cell's GPUs). So a
``kill -9`` of ``gyre run --cluster`` leaves the engines serving, and a
resumed driver's manager adopts them (``running_engine``, then
``EngineManager.adopt``'s record check: same pid, same spec, settled memory).

- **Where an engine is.** A launch puts it on its group's node. A resumed job's
  groups are placed afresh and Ray may put a cell on another node: an engine
  is looked for on its group's node first, then on every other live node
  supervisor the killed attempt used, and adopted where it runs.
- **A node whose supervisor is gone** (its node rebooted, its actor killed):
  its engine died with it (parent-death signals) and reads as killed; the
  next launch on that node opens a new supervisor there (``reopen``) and starts
  the engine under it (its ledger counts a second start).

Invariants: at most one running process per engine id among the run's node
supervisors (a launch stops the id's process on every other live node first);
a launch is never an adoption; every call to a node goes through its actor,
never to a local pid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre.real.engines.manager import EngineError, EngineSpec
from gyre.real.supervisor.client import SupervisorGone
from gyre.real.supervisor.engines import KILL_GRACE_S, SupervisedEngines, SupervisedProcess, engine_key


class NodeEngines:
    """The engine manager's launcher on a Ray cluster (module docstring)."""

    def __init__(self, placement: Any, supervisors: Any) -> None:
        self.placement, self.supervisors = placement, supervisors

    def start_engine(self, spec: EngineSpec, python: Path, log_path: Path) -> SupervisedProcess:
        node = self.placement.engine_groups[spec.engine_id].node_id
        for other, supervisor in self.supervisors.live().items():  # one process per engine id (invariant)
            if other != node:
                _stop_key(supervisor, engine_key(spec.engine_id))
        return self._on(node, spec.engine_id).start_engine(spec, python, log_path)

    def running_engine(self, engine_id: str) -> SupervisedProcess | None:
        """The engine a node's supervisor runs now under ``engine_id``: on its group's node, else on any other
        live node supervisor of the run; None when none runs it."""
        home = self.placement.engine_groups[engine_id].node_id
        nodes = [home] + [node for node in self.supervisors.live() if node != home]
        for node in nodes:
            supervisor = self.supervisors.supervisors.get(node)
            found = None if supervisor is None else self._bound(supervisor, engine_id).running_engine(engine_id)
            if found is not None:
                return found
        return None

    def _on(self, node: str, engine_id: str) -> SupervisedEngines:
        """The launcher on ``node``'s supervisor; a new supervisor there when the node's is gone."""
        supervisor = self.supervisors.supervisors.get(node)
        if supervisor is None or not _answers(supervisor):
            try:
                supervisor = self.supervisors.reopen(node)
            except Exception as exc:  # noqa: BLE001 - Ray's errors: the node is gone or its daemon cannot start
                raise EngineError(f"engine {engine_id!r}: node {node[:12]} has no supervisor and none could be "
                                  f"started there: {type(exc).__name__}: {exc}") from None
        return self._bound(supervisor, engine_id)

    def _bound(self, supervisor: Any, engine_id: str) -> SupervisedEngines:
        placed = self.placement.engine_env(engine_id)
        return SupervisedEngines(supervisor, environment=lambda spec: supervisor.engine_env(spec, placed), local=False)


def _answers(supervisor: Any) -> bool:
    try:
        supervisor.call("list", timeout=10.0)
    except (SupervisorGone, RuntimeError):
        return False
    return True


def _stop_key(supervisor: Any, key: str) -> None:
    """Stop ``key``'s process under ``supervisor`` if it runs one there; a gone supervisor runs nothing."""
    try:
        entry = supervisor.call("status", key=key)
        if entry is not None and entry["state"] == "running":
            supervisor.call("kill", key=key, grace_s=KILL_GRACE_S, timeout=2 * KILL_GRACE_S + 60.0)
    except SupervisorGone:
        pass
