"""The ranks of one cell: the leader runs the cell's control logic, every rank runs its tensor operations.

A cell spans ``tp`` processes (rank r of cell c is global rank ``c * tp + r``;
its Megatron TP group is exactly the cell's ranks). Rank 0, the *leader*,
serves the driver's commands and takes every decision of ``train.core`` /
``train.satellite`` (seats, claims, coverage, the reduction plan). Each
operation that touches a rank's shard goes through ``CellRanks.run(op,
**args)``: the leader first hands ``(op, args)`` to the other ranks (one
``broadcast_object_list`` over the cell group), then runs it itself; the
*followers* sit in ``follow()`` and run the same operations in the same order.
That order is what Megatron's TP collectives inside forward and backward need,
and what makes every per-shard collective (prefix-group reduce, broadcast,
pair-group pull) meet its peers. With ``tp == 1`` there are no followers and
``run`` is a plain call.

Per shard: rank r exposes its own buffer (``snapshot/{v}/{r}``), a satellite's
rank r pulls exactly that key's shard, reduces over shard r's prefix group into
the core's rank r and receives shard r's broadcast. The update clips over the
whole model (``train.state``); ``export`` gathers the shards into full Hugging
Face tensors through mbridge (``train.bridge.export_hf_model``: all-gather over
the TP group, then mbridge's merge of QKV groups and gate/up halves) and
returns them on the leader.

A follower's failing operation is logged and the follower keeps following; a
collective it then misses times out on its peers (the process group's timeout).
The operations that only touch files (``SETTLED``: dump, load, save_state,
load_state) have no collective of their own, so every rank reports its outcome
to all others once it is done: the leader returns only after every shard is
written (or read), and raises naming each rank whose part failed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gyre.real.train import keys
from gyre.real.train.transport import Snapshot

OPS = ("restore", "offload", "accumulate", "discard", "reduce", "update", "broadcast", "expose", "serve",
       "pull", "dump", "load", "export", "save_state", "load_state", "stop")
SETTLED = ("dump", "load", "save_state", "load_state")  # file-only: the leader waits for every rank's outcome


class CellRanks:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.tp = ctx.cfg.tp
        self.rank = ctx.rank
        self.leader = ctx.cell * self.tp  # global rank of this cell's rank 0
        self.group = ctx.groups.cell.get(ctx.cell)
        self.last_gradient: torch.Tensor | None = None

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def run(self, op: str, **args):
        """Leader only: hand ``op`` to the followers, then run it here; returns the leader's result."""
        if not self.is_leader:
            raise RuntimeError(f"rank {self.rank} of cell {self.ctx.cell} is a follower: only the leader runs ops")
        if op not in OPS:
            raise ValueError(f"unknown rank operation {op!r}; known: {OPS}")
        if self.group is None:
            return getattr(self, f"_{op}")(**args)
        dist.broadcast_object_list([(op, args)], src=self.leader, group=self.group)
        if op not in SETTLED:
            return getattr(self, f"_{op}")(**args)
        result, error = None, None
        try:
            result = getattr(self, f"_{op}")(**args)
        except Exception as exc:  # reported with the followers' outcomes below
            error = f"rank 0: {exc!r}"
        failed = self._settle(error)
        if failed:
            raise RuntimeError(f"cell {self.ctx.cell}: operation {op!r} failed on " + "; ".join(failed))
        return result

    def follow(self) -> None:
        """Follower loop: run the leader's operations until ``stop``."""
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=self.leader, group=self.group)
            op, args = box[0]
            error = None
            try:
                getattr(self, f"_{op}")(**args)
            except Exception as exc:
                self.ctx.log.exception("cell %d rank %d: operation %s failed", self.ctx.cell, self.rank, op)
                error = f"rank {self.rank}: {exc!r}"
            if op in SETTLED:
                self._settle(error)
            if op == "stop":
                return

    def _settle(self, error: str | None) -> list[str]:
        """Every rank of the cell shares its outcome of a file-only operation; the failures (rank order)."""
        outcomes: list[str | None] = [None] * self.tp
        dist.all_gather_object(outcomes, error, group=self.group)
        return [outcome for outcome in outcomes if outcome]

    # -- operations (every rank) ------------------------------------------------------------------
    def _restore(self) -> int:
        self.ctx.state.restore()
        return self.ctx.state.resident_bytes()

    def _offload(self) -> None:
        self.ctx.state.offload()

    def _accumulate(self, step):
        return self.ctx.state.accumulate(step)

    def _discard(self) -> None:
        self.ctx.state.discard()

    def _reduce(self, prefix: int) -> None:
        self.ctx.state.reduce_to_core(self.ctx.groups.for_prefix(prefix, self.rank), dst=self.rank)

    def _update(self, record: bool = False):
        state = self.ctx.state
        if record:
            self.last_gradient = state.acc.to(state.flat.dtype).clone()
        return state.apply_update()

    def _broadcast(self, prefix: int) -> None:
        group = self.ctx.groups.for_prefix(prefix, self.rank)
        if group is not None:
            dist.broadcast(self.ctx.state.flat.data, src=self.rank, group=group)

    def _expose(self, version: int) -> dict:
        snapshot = self.ctx.transport.expose(self.ctx.state.flat, version).as_dict()
        self.ctx.control.set(keys.snapshot(version, self.rank), snapshot)
        return snapshot

    def _serve(self, cell: int) -> None:
        self.ctx.transport.serve(self.ctx.state.flat, self.ctx.groups.pair[(cell, self.rank)])

    def _pull(self, version: int) -> dict:
        """Pull shard ``rank`` of the core's version ``version``; returns what the join report carries."""
        ctx = self.ctx
        info = ctx.control.wait(keys.snapshot(version, self.rank), ctx.cfg.timeout_s,
                                f"the core's snapshot of shard {self.rank} for step {version}")
        snapshot = Snapshot.from_dict(info)
        group = ctx.groups.pair.get((ctx.cell, self.rank))
        pull_s = ctx.transport.pull(snapshot, ctx.state.flat, group=group)
        ctx.log.info("cell %d rank %d pulled shard of step %d: %d bytes via %s in %.4f s", ctx.cell, self.rank,
                     version, snapshot.nbytes, snapshot.transport, pull_s)
        return {"transport": snapshot.transport, "bytes": snapshot.nbytes, "pull_s": pull_s}

    def _dump(self, path: str, gradient: bool = False) -> str:
        state = self.ctx.state
        data = {"weights": state.flat.data.detach().cpu().clone(), "names": state.flat.names,
                "shapes": state.flat.shapes, "rank": self.rank, "tp": self.tp}
        if gradient and self.last_gradient is not None:
            data["gradient"] = self.last_gradient.cpu()
        target = shard_path(path, self.rank)
        torch.save(data, target)
        return target

    def _load(self, path: str) -> None:
        self.ctx.state.load_weights(torch.load(shard_path(path, self.rank))["weights"])

    def _save_state(self, folder: str) -> str:
        from gyre.real.train.checkpoint import save_rank

        return save_rank(self.ctx.state, folder, self.rank, self.tp)

    def _load_state(self, folder: str) -> None:
        from gyre.real.train.checkpoint import load_rank

        load_rank(self.ctx.state, folder, self.rank, self.tp)

    def _export(self) -> dict | None:
        """Full Hugging Face tensors of the cell's weights (gathered over the TP group; leader only)."""
        from gyre.real.train.bridge import export_hf, export_hf_model

        cfg = self.ctx.cfg.model
        if self.tp == 1:
            return export_hf(self.ctx.state.flat.named_tensors(), cfg)
        tensors = export_hf_model(self.ctx.state.model, cfg)
        return tensors if self.is_leader else None

    def _stop(self) -> None:
        return None


def shard_path(path: str, rank: int) -> str:
    """Where rank ``rank`` of a cell dumps (rank 0: ``path`` itself, so a TP = 1 dump is unchanged)."""
    return path if rank == 0 else f"{path}.rank{rank}"
