"""The core cell's step: expose, train with whoever joins, close the window, reduce, update once.

One ``CoreCell.step(version, batch, final)``:
1. expose the current weights (``Snapshot``) and open the join window of
   ``version``; satellites that received the previous broadcast are seated as
   members, cells behind a crashed cell are barred;
2. claim and accumulate micro-steps of ``batch`` until the batch is closed and
   fully handed out (torch transport: serve joiners' pulls between micro-steps);
3. close the window, then wait for a done mark from every seated satellite; a
   crashed or failed one is reported and every micro-step it claimed is
   requeued; a healthy satellite behind a gap is discarded and its micro-steps
   are requeued too; the core redoes all requeued micro-steps itself;
4. check coverage: each micro-step of the batch counted exactly once, all with
   the same B*N; post the decision; reduce over the participating prefix group;
5. one optimizer update (round to float32, clip, step); then after a non-final
   step broadcast the new weights to the participating satellites (docs/streaming.md#joining-a-step), after a final one
   release them (they go back to rollout).

In a cell of several TP ranks, this runs on the leader and every tensor
operation (expose, accumulate, reduce, update, broadcast) runs on all its ranks
through ``train.ranks``, each on its own shard and shard group.

Nothing recorded is lost: a micro-step's gradient reaches the update only
through a participant's reduced accumulator, and every micro-step not covered
that way is requeued and redone before the update.
"""

from __future__ import annotations

import time

from gyre.real.train.context import CellContext
from gyre.real.train.fence import exit_if_stale
from gyre.real.train.membership import close_window, open_window, participating_prefix
from gyre.real.train.state import MicroStepResult
from gyre.real.train import keys


class StepError(RuntimeError):
    """A step that could not be completed; the message says which cells or micro-steps."""


class CoreCell:
    def __init__(self, ctx: CellContext) -> None:
        self.ctx = ctx
        self.members: set[int] = set()  # satellites holding the current weights (previous broadcast)
        self.last_gradient = None

    @property
    def cells(self) -> int:
        return self.ctx.cfg.cells

    def step(self, version: int, batch: int, final: bool) -> dict:
        ctx, start = self.ctx, time.time()
        if not ctx.state.resident:
            raise StepError(f"step {version}: the core is not in training")
        crashed = self._crashed()
        barred = {c for c in range(1, self.cells) if crashed and c >= min(crashed)}
        snapshot = ctx.ranks.run("expose", version=version)  # every rank writes snapshot/{version}/{rank}
        open_window(ctx.control, version, batch, snapshot, self.cells, self.members - barred, barred)
        served: set[int] = set()
        results = self._claim_all(version, batch, served)
        seated = close_window(ctx.control, version, self.cells)
        reports, failed = self._collect(version, seated, served)
        last, discard = participating_prefix(seated, set(failed))
        redone = self._requeue(batch, failed, discard)
        results += self._claim_all(version, batch, served)
        by_cell = {0: [r.name for r in results], **{c: reports[c]["names"] for c in range(1, last + 1)}}
        executions = self._check_coverage(batch, by_cell, results, reports, last)
        ctx.control.set(keys.decision(version), {"prefix": last, "discard": discard})
        ctx.ranks.run("reduce", prefix=last)
        update_started = time.time()
        update = ctx.ranks.run("update", record=ctx.cfg.record_gradients)
        update_s = time.time() - update_started
        self.last_gradient = ctx.ranks.last_gradient
        self._after(version, final, last)
        participants = {0: _summary(results), **{c: reports[c] for c in range(1, last + 1)}}
        return {
            "version": version, "batch": batch, "final": final, "batch_executions": executions,
            "microsteps": sum(len(n) for n in by_cell.values()),
            "by_cell": {c: len(n) for c, n in by_cell.items()},
            "loss": sum(p["loss"] for p in participants.values()),
            "nll": _weighted_nll(participants.values()),
            "grad_norm": update.grad_norm, "clipped": update.clipped,
            "participants": list(range(last + 1)), "seated": seated, "discarded": discard,
            "barred": sorted(barred), "failed": failed, "redone": redone,
            "joins": {c: reports[c].get("join") for c in reports if reports[c].get("join")},
            "duration_s": time.time() - start, "update_s": update_s,
            "compute_s": {c: p.get("compute_s", 0.0) for c, p in participants.items()},
        }

    # -- phases -----------------------------------------------------------------------------------
    def _claim_all(self, version: int, batch: int, served: set[int]) -> list[MicroStepResult]:
        """Claim and accumulate until the batch is closed and handed out; waits at most timeout_s for data."""
        ctx, results = self.ctx, []
        queue = ctx.queues.queue(batch)
        deadline = time.monotonic() + ctx.cfg.timeout_s
        while not ctx.queues.drained(batch):
            self._serve_pulls(version, served)
            exit_if_stale(ctx.cfg.workdir, ctx.cfg.attempt, who=f"cell {ctx.cell}")  # a claim moves a file
            step = queue.claim(ctx.worker)
            if step is None:
                if time.monotonic() > deadline:
                    raise StepError(f"step {version}: no micro-step of batch {batch} arrived within "
                                    f"{ctx.cfg.timeout_s:.0f} s and the batch is not closed")
                time.sleep(ctx.cfg.poll_s)
                continue
            results.append(ctx.ranks.run("accumulate", step=step))
            deadline = time.monotonic() + ctx.cfg.timeout_s
        return results

    def _serve_pulls(self, version: int, served: set[int]) -> None:
        if not self.ctx.groups.pair:
            return
        for c in range(1, self.cells):
            if c not in served and self.ctx.control.has(keys.pulled(version, c)):
                self.ctx.ranks.run("serve", cell=c)
                served.add(c)

    def _collect(self, version: int, seated: list[int], served: set[int]) -> tuple[dict, dict]:
        """Done marks of seated satellites; crashed or failed ones are reported, not waited for."""
        control, pending = self.ctx.control, set(seated)
        reports, failed = {}, {}
        deadline = time.monotonic() + self.ctx.cfg.timeout_s
        while pending:
            self._serve_pulls(version, served)
            for c in sorted(pending):
                for key, sink in ((keys.done(version, c), reports), (keys.crash(c), failed),
                                  (keys.failed(version, c), failed)):
                    if control.has(key):
                        sink[c] = control.get(key)
                        pending.discard(c)
                        break
            if pending and time.monotonic() > deadline:
                raise StepError(f"step {version}: satellites {sorted(pending)} sent no done mark within "
                                f"{self.ctx.cfg.timeout_s:.0f} s")
            time.sleep(self.ctx.cfg.poll_s if pending else 0)
        for c, info in failed.items():
            self.ctx.log.error("step %d: cell %d failed (%s); the core finishes the step without it",
                               version, c, info)
        return reports, failed

    def _requeue(self, batch: int, failed: dict, discard: list[int]) -> list[str]:
        names = []
        for c in sorted(set(failed) | set(discard)):
            claimed = self.ctx.queues.claimed_by(batch, f"cell{c}")
            self.ctx.queues.requeue(batch, claimed)
            names += claimed
        if names:
            self.ctx.log.warning("batch %d: requeued %d micro-steps of cells %s: %s", batch, len(names),
                                 sorted(set(failed) | set(discard)), names)
        return names

    def _check_coverage(self, batch: int, by_cell: dict, results, reports: dict, last: int) -> int:
        names = [n for cell_names in by_cell.values() for n in cell_names]
        expected = self.ctx.queues.batch_size(batch)
        if len(names) != expected or len(set(names)) != expected:
            raise StepError(f"batch {batch}: {expected} micro-steps expected, {len(set(names))} distinct of "
                            f"{len(names)} accumulated ({ {c: len(n) for c, n in by_cell.items()} })")
        counts = {r.batch_executions for r in results}
        counts |= {e for c in range(1, last + 1) for e in reports[c]["batch_executions"]}
        if len(counts) > 1:
            raise StepError(f"batch {batch}: micro-steps disagree on B*N: {sorted(counts)}")
        return counts.pop() if counts else 0

    def _after(self, version: int, final: bool, last: int) -> None:
        if final:
            self.ctx.control.set(keys.after(version), "release")
            self.members = set()
            return
        self.ctx.control.set(keys.after(version), "broadcast")
        if last:
            self.ctx.ranks.run("broadcast", prefix=last)
        self.members = set(range(1, last + 1))

    def _crashed(self) -> dict[int, dict]:
        control = self.ctx.control
        return {c: control.get(keys.crash(c)) for c in range(1, self.cells) if control.has(keys.crash(c))}


def _summary(results: list[MicroStepResult]) -> dict:
    """The same fields a satellite puts in its done mark."""
    return {"names": [r.name for r in results], "loss": sum(r.loss for r in results),
            "nll_sum": sum(r.nll * r.targets for r in results), "targets": sum(r.targets for r in results),
            "batch_executions": sorted({r.batch_executions for r in results}),
            "compute_s": sum(r.seconds for r in results)}


def _weighted_nll(parts) -> float:
    targets = sum(p["targets"] for p in parts)
    return sum(p["nll_sum"] for p in parts) / targets if targets else 0.0
