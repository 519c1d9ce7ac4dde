"""A satellite cell in the training role: join steps, pull a snapshot, claim micro-steps, reduce.

``SatelliteCell.train()`` runs from the moment the cell has restored its
training state until it is released, barred or interrupted:

1. wait for the newest open join window (interruptible by a pending driver
   command such as ``leave_training``);
2. take a seat atomically: "closed" means the window of that step closed
   before this request; the satellite logs it and waits for the next step
   (its weights are not touched); "barred" means a cell before it in the
   prefix crashed, so it leaves training;
3. a new joiner pulls version v's snapshot (Mooncake read or torch broadcast);
   a member that received the previous broadcast already holds it;
4. claim micro-steps of the step's batch until it is closed and handed out,
   accumulating gradients with the weights frozen; post a done mark;
5. follow the core's decision: reduce over the prefix group (or discard when
   behind a gap); then receive the broadcast after a non-final step, or return
   "released" after the burst's final step.

A cell of several TP ranks runs this on its leader; each rank pulls its own
shard (``snapshot/{v}/{rank}``), accumulates, reduces over its shard's prefix
group and receives its shard's broadcast (``train.ranks``).

A failure inside a step is posted as ``fail/{v}/{c}`` before it propagates, so
the core finishes the step without this cell instead of waiting for it.
"""

from __future__ import annotations

import os
import time

from gyre.real.train.context import FAULT_EXIT_CODE, CellContext
from gyre.real.train.fence import exit_if_stale
from gyre.real.train.membership import BARRED, CLOSED, JOINED, MEMBER, take_seat
from gyre.real.train import keys


class Interrupted(Exception):
    """A driver command arrived while the satellite was waiting for a step."""


class SatelliteCell:
    """One stay in the training role; ``next_version`` (the oldest step it may still join) carries over."""

    def __init__(self, ctx: CellContext, command_pending, next_version: int = 0) -> None:
        self.ctx = ctx
        self.command_pending = command_pending
        self.next_version = next_version

    def train(self) -> str:
        """Run steps until "released" (final step done) or "barred"; raises Interrupted on a command."""
        ctx, fresh = self.ctx, False
        while True:
            v = self._next_window(self.next_version, fresh)
            self.next_version = v + 1
            seat_at = time.time()
            seat = take_seat(ctx.control, v, ctx.cell)
            if seat == BARRED:
                ctx.log.warning("cell %d barred from step %d: a cell before it in the prefix crashed; "
                                "leaving training", ctx.cell, v)
                return "barred"
            if seat == CLOSED:
                ctx.log.info("cell %d: join window of step %d closed before it asked to join; waiting for "
                             "step %d", ctx.cell, v, v + 1)
                fresh = False
                continue
            info = ctx.control.get(keys.window_info(v))
            try:
                join = self._pull(v, seat_at) if seat == JOINED or not fresh else None
                report = self._accumulate(v, info["batch"], join)
            except Exception as exc:
                ctx.control.set(keys.failed(v, ctx.cell), {"error": f"{type(exc).__name__}: {exc}"})
                raise
            ctx.control.set(keys.done(v, ctx.cell), report)
            outcome, fresh = self._finish(v)
            if outcome == "release":
                return "released"

    def _next_window(self, version: int, fresh: bool) -> int:
        """The newest window >= ``version``. On a pending command, leave unless already seated as member."""
        seated = False
        while True:
            current = self.ctx.control.get_or("window/current")
            if current is not None and current >= version:
                return current
            if not seated and self.command_pending():
                seat = keys.seat(version, self.ctx.cell)
                if not fresh or self.ctx.control.compare_set(seat, "", CLOSED) != MEMBER:
                    raise Interrupted()
                seated = True  # the core seated us first: finish that step, then serve the command
            time.sleep(self.ctx.cfg.poll_s)

    def _pull(self, version: int, seat_at: float) -> dict:
        """Every rank pulls its own shard (``snapshot/{version}/{rank}``); the report holds the leader's."""
        ctx = self.ctx
        if ctx.groups.pair:
            ctx.control.set(keys.pulled(version, ctx.cell), 1)
        pulled = ctx.ranks.run("pull", version=version)
        join = {**pulled, "ranks": ctx.cfg.tp, "join_s": time.time() - seat_at, "ready_at": time.time()}
        ctx.log.info("cell %d joined step %d: pulled %d bytes per shard via %s in %.4f s", ctx.cell, version,
                     pulled["bytes"], pulled["transport"], pulled["pull_s"])
        return join

    def _accumulate(self, version: int, batch: int, join: dict | None) -> dict:
        ctx, results = self.ctx, []
        queue, crash_point = ctx.queues.queue(batch), ctx.cfg.crash_point(ctx.cell)
        deadline = time.monotonic() + ctx.cfg.timeout_s
        while not ctx.queues.drained(batch):
            exit_if_stale(ctx.cfg.workdir, ctx.cfg.attempt, who=f"cell {ctx.cell}")  # a claim moves a file
            step = queue.claim(ctx.worker)
            if step is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cell {ctx.cell}: batch {batch} got no micro-step for "
                                       f"{ctx.cfg.timeout_s:.0f} s and is not closed")
                time.sleep(ctx.cfg.poll_s)
                continue
            if crash_point is not None and len(results) + 1 == crash_point:
                ctx.log.error("cell %d: injected fault after claiming %s; exiting", ctx.cell, step.name)
                os._exit(FAULT_EXIT_CODE)
            results.append(ctx.ranks.run("accumulate", step=step))
            deadline = time.monotonic() + ctx.cfg.timeout_s
        return {"names": [r.name for r in results], "loss": sum(r.loss for r in results),
                "nll_sum": sum(r.nll * r.targets for r in results), "targets": sum(r.targets for r in results),
                "batch_executions": sorted({r.batch_executions for r in results}), "join": join,
                "compute_s": sum(r.seconds for r in results)}

    def _finish(self, version: int) -> tuple[str, bool]:
        """Reduce or discard per the core's decision, then follow ``after``; returns (after, fresh)."""
        ctx, timeout = self.ctx, self.ctx.cfg.timeout_s
        decision = ctx.control.wait(keys.decision(version), timeout, f"the core's decision on step {version}")
        prefix = decision["prefix"]
        took_part = ctx.cell <= prefix and ctx.cell not in decision["discard"]
        if took_part:
            ctx.ranks.run("reduce", prefix=prefix)
        ctx.ranks.run("discard")
        after = ctx.control.wait(keys.after(version), timeout, f"the end of step {version}")
        if after == "broadcast" and took_part:
            ctx.ranks.run("broadcast", prefix=prefix)
            return after, True
        return after, False
