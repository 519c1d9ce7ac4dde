"""Who takes part in a training step: control store, prefix groups, join seats, done marks, queues.

All coordination goes through one ``torch.distributed.TCPStore`` hosted by the
driver (``train.plane``), so it outlives any cell. Keys (JSON unless noted):

  cmd/{c}/{n}, reply/{c}/{n}  driver <-> cell commands
  window/current              newest step version whose join window was opened
  window/{v}/info             {"batch": b, "snapshot": ``Snapshot`` of version v's weights}
  seat/{v}/{c}                raw: "joined" | "member" | "closed" | "barred"
  pull/{v}/{c}                satellite c asks the core to serve its pull (torch transport)
  done/{v}/{c}                the micro-steps cell c accumulated in step v
  decision/{v}                {"prefix": j, "discard": [...]} the core's reduction plan
  after/{v}                   "broadcast" | "release": what follows the update of step v
  crash/{c}                   {"exitcode": n} written by the supervisor when cell c dies

Join window of step v: opened by the core when the step starts (after the
snapshot is exposed), closed once the batch is closed and fully handed out.
A seat is taken atomically with ``compare_set``: a satellite writes "joined"
only if the seat is empty, the core writes "closed" only if it is empty, so
each satellite is either in the step or told to wait for the next one, never
both. Satellites that received the previous step's broadcast are seated
"member" (current weights, no pull), again with ``compare_set``: a member that
wants to leave training closes its next seat first, and whoever writes first
wins (seated: it finishes that step, then leaves). Cells behind a crashed cell
are "barred" (their prefix group cannot be formed any more). A satellite
never asks for a seat in a step older than the last one it saw.

Prefix groups: for K cells, K-1 groups {0..j}, j = 1..K-1, built up front by
every rank in the same order (plus pair groups {0, c} for the torch
transport); collectives of a step use the group of its participating prefix.
A cell of ``tp`` ranks has one such set per shard: rank r of cell c reduces
with rank r of cells 0..j (``CommGroups``).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from gyre.real.store.microstep_queue import DirectoryMicroStepQueue
from gyre.trajectory.packing import MicroStep
from gyre.real.train import keys

JOINED, MEMBER, CLOSED, BARRED = "joined", "member", "closed", "barred"


class ControlStore:
    """JSON values and bounded polling on a TCPStore (every wait has a deadline).

    Waits poll ``check`` (one request, one answer) instead of ``TCPStore.wait``
    with a timeout: a timed-out ``wait`` leaves the server's later answer
    unread on the socket and the next request on that client reads it.
    """

    def __init__(self, store, poll_s: float = 0.002) -> None:
        self.store = store
        self.poll_s = poll_s

    def set(self, key: str, value) -> None:
        self.store.set(key, json.dumps(value))

    def get(self, key: str):
        return json.loads(self.store.get(key))

    def has(self, key: str) -> bool:
        return self.store.check([key])

    def get_or(self, key: str, default=None):
        return self.get(key) if self.has(key) else default

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        return self.store.compare_set(key, expected, desired).decode()

    def wait(self, key: str, timeout: float, what: str, interrupt: Callable[[], None] | None = None,
             raw: bool = False):
        """Value of ``key`` once set (JSON-decoded unless ``raw``); ``interrupt()`` runs between polls."""
        deadline = time.monotonic() + timeout
        while not self.has(key):
            if interrupt is not None:
                interrupt()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} ({key})")
            time.sleep(self.poll_s)
        return self.store.get(key).decode() if raw else self.get(key)


class CommGroups:
    """Per-shard prefix groups, pair groups (torch transport) and cell groups, built once by every rank.

    A cell spans ``tp`` ranks; rank ``r`` of cell ``c`` is global rank ``c * tp + r``. The prefix
    group {0..j} of shard ``r`` holds rank ``r`` of cells 0..j (gradients of shard ``r`` are reduced
    there, into the core's rank ``r`` = global rank ``r``); the pair group of (cell c, shard r) is
    {r, c * tp + r}; the cell group of cell ``c`` holds its ``tp`` ranks (the leader hands its
    operations to the other ranks over it; no timeout that matters: a follower waits there while
    the cell is idle).
    """

    IDLE_TIMEOUT = datetime.timedelta(days=7)

    def __init__(self, world: int, *, pair_groups: bool, tp: int = 1) -> None:
        if world < 1 or tp < 1:
            raise ValueError(f"need at least one cell of at least one rank, got {world} cells, tp {tp}")
        self.world, self.tp = world, tp
        self.prefix = {(r, j): dist.new_group([c * tp + r for c in range(j + 1)])
                       for r in range(tp) for j in range(1, world)}
        self.pair = {(c, r): dist.new_group([r, c * tp + r])
                     for c in range(1, world) for r in range(tp)} if pair_groups else {}
        self.cell = {c: dist.new_group(list(range(c * tp, (c + 1) * tp)), timeout=self.IDLE_TIMEOUT)
                     for c in range(world)} if tp > 1 else {}

    def for_prefix(self, last: int, rank: int = 0):
        """Group of shard ``rank`` of cells {0..last}; None for the core alone (no collective needed)."""
        if not 0 <= last < self.world:
            raise ValueError(f"prefix {{0..{last}}} is outside the {self.world} cells")
        if not 0 <= rank < self.tp:
            raise ValueError(f"shard {rank} is outside the {self.tp} ranks of a cell")
        return self.prefix.get((rank, last))


def open_window(control: ControlStore, version: int, batch: int, snapshot: dict, cells: int,
                members: set[int], barred: set[int]) -> None:
    """Expose version ``version`` to joiners; seats for members and barred cells are pre-filled."""
    for c in range(1, cells):
        if c in barred:
            control.store.set(keys.seat(version, c), BARRED)
        elif c in members:  # unless the member already gave up this seat to leave training
            control.compare_set(keys.seat(version, c), "", MEMBER)
    control.set(keys.window_info(version), {"batch": batch, "snapshot": snapshot})
    control.set("window/current", version)


def take_seat(control: ControlStore, version: int, cell: int) -> str:
    """A satellite's atomic join request: returns "joined", "member", "closed" or "barred"."""
    return control.compare_set(keys.seat(version, cell), "", JOINED)


def close_window(control: ControlStore, version: int, cells: int) -> list[int]:
    """Close every empty seat; returns the satellites in the step (joined or member), in index order."""
    seated = []
    for c in range(1, cells):
        if control.compare_set(keys.seat(version, c), "", CLOSED) in (JOINED, MEMBER):
            seated.append(c)
    return seated


def participating_prefix(seated: list[int], failed: set[int]) -> tuple[int, list[int]]:
    """Largest prefix {0..j} of healthy seated cells, and the healthy cells behind a gap (discarded).

    A cell behind a failed or absent cell cannot reduce over a prefix group, so
    its partial gradient is discarded and its micro-steps are redone.
    """
    last, discard = 0, []
    for c in seated:
        if c in failed:
            continue
        if c == last + 1 and not discard:
            last = c
        else:
            discard.append(c)
    return last, discard


class BatchQueues:
    """One ``DirectoryMicroStepQueue`` per batch under ``root``, so a claim never crosses a batch.

    Also a ``MicroStepSink`` (``put``/``close_batch`` route by batch id), so a
    ``StreamPacker`` can feed it directly.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self._queues: dict[int, DirectoryMicroStepQueue] = {}

    def queue(self, batch_id: int) -> DirectoryMicroStepQueue:
        if batch_id not in self._queues:
            self._queues[batch_id] = DirectoryMicroStepQueue(self.root / f"{batch_id:08d}")
        return self._queues[batch_id]

    def put(self, step: MicroStep) -> None:
        self.queue(step.batch_id).put(step)

    def close_batch(self, batch_id: int, num_steps: int) -> None:
        self.queue(batch_id).close_batch(batch_id, num_steps)

    def batch_size(self, batch_id: int) -> int:
        """Micro-steps in a closed batch (the count written by ``close_batch``)."""
        q = self.queue(batch_id)
        if not q.batch_closed(batch_id):
            raise ValueError(f"batch {batch_id} is not closed")
        return int((q.root / "closed" / f"{batch_id:08d}").read_text())

    def drained(self, batch_id: int) -> bool:
        q = self.queue(batch_id)
        return q.batch_closed(batch_id) and q.ready_count() == 0

    def claimed_by(self, batch_id: int, worker: str) -> list[str]:
        return sorted(name for name, w in self.queue(batch_id).claims().items() if w == worker)

    def requeue(self, batch_id: int, names: list[str]) -> None:
        """Put claimed micro-steps back into ``ready/`` (one atomic rename each), e.g. after a crash."""
        q = self.queue(batch_id)
        for name in names:
            matches = list((q.root / "claimed").glob(f"{name}.npz.*"))
            if len(matches) != 1:
                raise ValueError(f"micro-step {name} of batch {batch_id} is not claimed exactly once")
            os.rename(matches[0], q.root / "ready" / f"{name}.npz")
