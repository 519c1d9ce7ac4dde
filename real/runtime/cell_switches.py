"""The backend's part for role switches: a cell's engine and training cell moved between roles.

| BeginTransition(c, training) | drain c's engine, wait idle, quiesce, release_memory, enter_training |
| BeginTransition(c, rollout)  | leave_training, resume_memory, load newest weights, undrain          |

Each reports ``TransitionDone`` when it is through. A satellite
(``gyre.driver_rules.is_satellite``) enters training holding its seat until
the core has acted on its TransitionDone: if its burst ended meanwhile the
core sends it straight back, and it must not join the next burst's step.
With an engine watch (``runtime.engine_watch``) a switch's engine calls run
through ``watch.engine_ops``: serialised with the watch's restart of that
engine (a dead engine is revived first; one whose restart failed is skipped).

State it owns (``snapshot()`` / ``restore()``): ``members`` (cells in the
training role: the group-ask rule counts them) and ``rollout_ready`` (cells
whose engine takes work now).

Invariants: every plane command is numbered on the loop thread when its action
is applied (per-cell command order = action order) and written to the control
store off the loop (``BackendContext.send_to_cell``); an engine leaves
training only after the newest published checkpoint is loaded into it; no
blocking engine or plane call runs on the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from gyre import actions as act
from gyre import events as ev
from gyre.driver_rules import is_satellite
from gyre.real.runtime.backend_context import BackendContext
from gyre.real.runtime.proxy_admin import ProxyAdmin

IDLE_POLL_S = 0.05  # how often a draining engine's in-flight calls are looked at


class CellSwitches:
    def __init__(self, ctx: BackendContext, proxy: ProxyAdmin, *, latest: Callable[[], Any],
                 publishing: Callable[[], asyncio.Task | None], running: Callable[[], int],
                 joined: Callable[[], None]) -> None:
        self.ctx, self.proxy = ctx, proxy
        self._latest, self._publishing, self._running, self._joined = latest, publishing, running, joined
        self.members: set[int] = set(range(ctx.cfg.static_train_cells))  # cells in the training role
        self.rollout_ready: set[int] = set(ctx.parts.engine_names)      # engines taking work now

    def begin(self, a: act.BeginTransition) -> None:
        self.members.discard(a.cell)
        if a.role == "training":
            self.rollout_ready.discard(a.cell)
            self.ctx.metrics.in_flight_at_transition.append(self._running())
            self.ctx.spawn(self.to_training(a.cell))
        else:
            ticket = self.ctx.send_to_cell(a.cell, "leave_training")
            self.ctx.spawn(self.to_rollout(a.cell, ticket))

    async def to_training(self, cell: int) -> None:
        t0, name = self.ctx.clock(), self.ctx.parts.engine_names[cell]
        await self.proxy.call("POST", f"/admin/engines/{name}/drain", {"evacuate": False})
        while await self.proxy.in_flight(name):
            await asyncio.sleep(IDLE_POLL_S)
        t_idle = self.ctx.clock()
        engines = self.ctx.parts.engines
        await self.engine_ops(name, "training", engines.quiesce, engines.release_memory)  # idle: cannot race
        satellite = is_satellite(self.ctx.cfg, cell)
        ticket = self.ctx.send_to_cell(cell, "enter_training", **({"hold": True} if satellite else {}))
        await asyncio.to_thread(ticket.result)
        self.ctx.metrics.transitions.append({"cell": cell, "role": "training", "wait_idle_s": t_idle - t0,
                                             "total_s": self.ctx.clock() - t0})
        self.members.add(cell)
        self.ctx.report(ev.TransitionDone, cell=cell, role="training",
                        then=(lambda: self._release_hold(cell)) if satellite else None)
        self._joined()

    def _release_hold(self, cell: int) -> None:
        """The core kept ``cell`` in training (no BeginTransition back): it may join steps now."""
        if cell in self.members:
            self.ctx.send_to_cell(cell, "join")

    async def to_rollout(self, cell: int, ticket) -> None:
        t0, name = self.ctx.clock(), self.ctx.parts.engine_names[cell]
        await asyncio.to_thread(ticket.result)
        await self.engine_ops(name, "rollout", self.ctx.parts.engines.resume_memory)
        t_wait = self.ctx.clock()
        publishing = self._publishing()
        if publishing is not None:
            await asyncio.shield(publishing)
        publish_wait_s = self.ctx.clock() - t_wait  # the simulator models this wait itself, not as transition cost
        latest = self._latest()
        if latest is not None:
            version, path = latest
            await self.engine_ops(name, "rollout", lambda engine: self.ctx.parts.engines.update_weights_from_disk(
                engine, path, weight_version=str(version)))
        await self.proxy.call("POST", f"/admin/engines/{name}/undrain")  # (still held while the watch revives it)
        self.rollout_ready.add(cell)
        self.ctx.metrics.transitions.append({"cell": cell, "role": "rollout", "total_s": self.ctx.clock() - t0,
                                             "publish_wait_s": publish_wait_s})
        self.ctx.report(ev.TransitionDone, cell=cell, role="rollout")

    async def engine_ops(self, name: str, role: str, *ops: Callable[[str], Any]) -> None:
        """Blocking engine calls ``op(name)``, in order, off the loop; with an engine watch, serialised with
        its restarts of ``name`` (a dead engine is revived first; a lost one is skipped)."""
        if self.ctx.parts.watch is not None:
            await self.ctx.parts.watch.engine_ops(name, role, *ops)
            return
        for op in ops:
            await asyncio.to_thread(op, name)

    def proxy_view(self, down: set[str]) -> list[tuple[str, bool, bool]]:
        """(engine, drained, held) of every engine, for a restarted proxy."""
        return [(name, cell not in self.rollout_ready, name in down)
                for cell, name in self.ctx.parts.engine_names.items()]

    def snapshot(self) -> dict[str, Any]:
        return {"members": sorted(self.members), "rollout_ready": sorted(self.rollout_ready)}

    def restore(self, state: dict[str, Any]) -> None:
        self.members, self.rollout_ready = set(state["members"]), set(state["rollout_ready"])
