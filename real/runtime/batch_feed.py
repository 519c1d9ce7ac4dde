"""The backend's part for training batches: steps sent to the core cell, groups packed into them.

``StartBatch(v)`` sends ``step`` to the core cell (the cells claim micro-steps
as groups arrive) and reports ``StepDone`` when the step's report is in;
``FeedGroups(v, gs)`` admits and packs exactly these groups into batch v
(the trajectory buffer pops the group the core chose).

Streaming: the packing buffer pulls one group at a time when it runs short,
by the rule the simulator follows too (``gyre.driver_rules.asks_for_group``):
it reports one ``GroupWanted`` when no ask is outstanding, the open batch has
fewer than B groups fed and fewer micro-steps are queued (emitted, unclaimed)
than cells are training. The rule is evaluated when a batch opens, after
each fed group is packed, when a cell enters training and whenever the cells
claim from the queue (``queue_changes``, the one polling point, which a test
double at the outer edge answers at the claim's own time). With streaming
off the core feeds a burst's groups itself and the packer never asks.

State it owns (``snapshot()`` / ``restore()``): the open batch's version, the
asks outstanding, the groups packed into it, and the packer's next batch id.

Invariants: every group is fed to the packer exactly once; each group's v_t
is recorded when it is fed; ``on_step(version)`` (live metrics) runs once
per step, after its report is in ``metrics`` and before ``StepDone`` is
reported (an awaitable it returns is awaited first: its writing runs off the loop).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from gyre import actions as act
from gyre import events as ev
from gyre.driver_rules import asks_for_group
from gyre.ids import group_id
from gyre.real.runtime.backend_context import BackendContext
from gyre.real.runtime.executions import PickingBuffer
from gyre.trajectory.harness_roles import GenericRoles
from gyre.trajectory.packing import StreamPacker

STEP_WAIT_S = 3600.0  # the longest a step's report is waited for


class BatchFeed:
    QUEUE_POLL_S = 0.02

    def __init__(self, ctx: BackendContext, buffer: PickingBuffer, *, seed: int, token_budget: int,
                 training_cells: Callable[[], int], steps: int | None = None) -> None:
        self.ctx, self.buffer, self._training_cells = ctx, buffer, training_cells
        self.packer = StreamPacker(buffer, GenericRoles(), groups_per_batch=ctx.cfg.B,
                                   token_budget=token_budget, seed=seed)
        self._of = "" if steps is None else f"/{steps}"
        self.on_step: Callable[[int], Awaitable[None] | None] = lambda version: None  # live metrics (runtime.metrics)
        self.open: int | None = None   # version of the open batch
        self.wanted = 0                # asked for, not fed yet
        self.packed = 0                # groups packed into the open batch
        self._step_sent: dict[int, float] = {}

    def start(self, a: act.StartBatch) -> None:
        ticket = self.ctx.send_to_cell(0, "step", version=a.version, final=a.final)
        self._step_sent[a.version] = self.ctx.clock()
        self.ctx.spawn(self._await_step(a.version, ticket))
        self.packed, self.wanted, self.open = 0, 0, a.version
        if self.ctx.cfg.streaming:
            self.ask()
            self.ctx.spawn(self._watch_queue(a.version))

    def feed(self, a: act.FeedGroups) -> None:
        metrics = self.ctx.metrics
        for g in a.groups:
            metrics.v_t[g] = a.version
            self.buffer.want = group_id(g)
            state = self.packer.step(self.ctx.parts.plane.queues)
            self.buffer.want = None
            if state == "waiting":
                raise RuntimeError(f"group {g} fed but not ready in the trajectory buffer")
            popped = self.buffer.popped[-1]
            metrics.rewards.setdefault(a.version, []).extend(e.reward for e in popped.executions
                                                             if e.reward is not None)
        self.packed += len(a.groups)
        self.wanted = max(0, self.wanted - len(a.groups))
        self.ask()

    def stop(self) -> None:
        self.open = None  # the queue watcher of an untrained batch stops polling (else it ran to the timeout)

    # ---- streaming: ask for the next group when the micro-step queue runs short -------
    def queued(self, version: int) -> int:
        """Micro-steps of batch ``version`` emitted and not claimed yet."""
        return self.ctx.parts.plane.queues.queue(version).ready_count()

    def ask(self) -> None:
        """Report one GroupWanted when the shared rule says so (module docstring)."""
        version = self.open
        if not self.ctx.cfg.streaming or version is None:
            return
        if asks_for_group(asked=self.wanted, fed=self.packed, batch_size=self.ctx.cfg.B,
                          queued=self.queued(version), training_cells=self._training_cells()):
            self.wanted = 1
            self.ctx.report(ev.GroupWanted)

    async def queue_changes(self, version: int, depth: int) -> int:
        """Wait until batch ``version``'s queue depth differs from ``depth`` (cells claim); the new depth.

        The real cells claim from a shared directory, so this polls it; a test double at the
        outer edge answers at the claim's own time instead (``plane.queues.queue(v).changes``)."""
        queue = self.ctx.parts.plane.queues.queue(version)
        changes = getattr(queue, "changes", None)
        if changes is not None:
            return await changes(depth, lambda: self.open == version)
        while self.open == version:
            now = self.queued(version)
            if now != depth:
                return now
            await asyncio.sleep(self.QUEUE_POLL_S)
        return depth

    async def _watch_queue(self, version: int) -> None:
        depth = self.queued(version)
        while self.open == version and self.packed < self.ctx.cfg.B:
            depth = await self.queue_changes(version, depth)
            self.ask()

    async def _await_step(self, version: int, ticket) -> None:
        report = await asyncio.to_thread(ticket.result, STEP_WAIT_S)
        metrics = self.ctx.metrics
        metrics.steps[version] = {"loss": report["loss"], "participants": report["participants"],
                                  "microsteps": report["microsteps"],
                                  "microsteps_by_cell": report.get("by_cell", {}),
                                  "compute_s_by_cell": report.get("compute_s", {}),
                                  "update_s": report.get("update_s"), "joins": report.get("joins", {}),
                                  "wall_s": self.ctx.clock() - self._step_sent[version]}
        rewards = metrics.rewards.get(version, [])
        reward = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        self.ctx.progress(f"step {version + 1}{self._of}: loss {report['loss']:.4f}, mean reward {reward}, "
                          f"cells {report['participants']}, {metrics.steps[version]['wall_s']:.2f} s")
        if self.open == version:
            self.open = None
        written = self.on_step(version)  # the step's metrics are on disk before the core hears of it
        if written is not None:
            await written
        self.ctx.report(ev.StepDone, version=version)

    # ---- resume ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"open": self.open, "wanted": self.wanted, "packed": self.packed,
                "next_batch": self.packer.batch_id}

    def restore(self, state: dict[str, Any]) -> None:
        self.open, self.wanted, self.packed = state["open"], state["wanted"], state["packed"]
        self.packer.batch_id = state["next_batch"]
