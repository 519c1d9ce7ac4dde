"""Stream packing buffer: ready groups in, micro-steps out (docs/streaming.md#two-buffers,
docs/trajectories.md#admission).

``StreamPacker.step`` pulls at most one ready group from the trajectory buffer
(oldest policy version first), admits each trainable execution's trajectories
(seeded, per execution), materializes them into token rows, packs the pending
rows into micro-steps under a token budget and enqueues every micro-step that
is full enough. Once the batch's B groups are pulled it flushes the rest and
closes the batch on the queue, so a batch closes only after all its
micro-steps are enqueued.

Packing unit: all rows of one execution form a *bundle* that never spans two
micro-steps, so the per-execution sequence ratio and clip decision (docs/trajectories.md#execution-level-loss) are
computed exactly inside one micro-step. Bundles are packed first-fit
decreasing by token count; a bundle larger than the budget gets a micro-step of
its own (the only case where a micro-step exceeds the budget). The rule is
``gyre.driver_rules.pack_micro_steps``: the simulator's training plane packs
the trace's trained tokens by the same function.

Invariants: every materialized row is emitted exactly once, in exactly one
micro-step of its batch; each micro-step's ``batch_executions`` is B * N, the
loss's denominator; admission of an execution depends only on (seed,
execution id, tree), not on pull order.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from gyre.driver_rules import EMIT_FILL, first_fit_decreasing, pack_micro_steps
from gyre.trajectory.admission import DEFAULT_J_MAX, admit_trajectories, check_j_max
from gyre.trajectory.groups import ReadyGroup, TrajectoryBuffer
from gyre.trajectory.harness_roles import HarnessRoles
from gyre.trajectory.rows import TokenRow, materialize


@dataclass(frozen=True, eq=False)
class MicroStep:
    batch_id: int
    index: int
    rows: tuple[TokenRow, ...]
    batch_executions: int

    @property
    def name(self) -> str:
        return f"{self.batch_id:08d}-{self.index:06d}"

    @property
    def num_tokens(self) -> int:
        return sum(row.num_tokens for row in self.rows)


@dataclass(frozen=True, eq=False)
class ExecutionBundle:
    execution_id: str
    rows: tuple[TokenRow, ...]

    @property
    def num_tokens(self) -> int:
        return sum(row.num_tokens for row in self.rows)


class MicroStepSink(Protocol):
    def put(self, step: MicroStep) -> None: ...

    def close_batch(self, batch_id: int, num_steps: int) -> None: ...


def pack_bundles(bundles: Sequence[ExecutionBundle], token_budget: int) -> list[list[ExecutionBundle]]:
    """First-fit decreasing; ties keep input order. Every bundle lands in exactly one bin."""
    sizes = [b.num_tokens for b in bundles]
    return [[bundles[i] for i in bin_] for bin_ in first_fit_decreasing(sizes, token_budget)]


def execution_rng(seed: int, execution_id: str) -> np.random.Generator:
    """A generator determined by (seed, execution id) only."""
    digest = hashlib.blake2b(execution_id.encode(), digest_size=16).digest()
    return np.random.default_rng([int(seed), *struct.unpack("<4I", digest)])


class StreamPacker:
    """Turns ready groups into micro-steps, one group per ``step``."""

    def __init__(self, buffer: TrajectoryBuffer, roles: HarnessRoles, *, groups_per_batch: int,
                 token_budget: int, seed: int, j_max: int = DEFAULT_J_MAX, emit_fill: float = EMIT_FILL,
                 first_batch: int = 0) -> None:
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be positive, got {groups_per_batch!r}")
        if token_budget < 1 or not 0 < emit_fill <= 1:
            raise ValueError("token_budget must be positive and 0 < emit_fill <= 1")
        self.buffer = buffer
        self.roles = roles
        self.groups_per_batch = groups_per_batch
        self.token_budget = token_budget
        self.seed = seed
        self.j_max = check_j_max(j_max)
        self.emit_fill = emit_fill
        self.batch_id = first_batch
        self._groups_in_batch: list[str] = []
        self._pending: list[ExecutionBundle] = []
        self._steps_in_batch = 0

    @property
    def batch_executions(self) -> int:
        return self.groups_per_batch * self.buffer.group_size

    def step(self, sink: MicroStepSink) -> str:
        """Pull one ready group and emit what is full: 'pulled', 'closed' (batch done) or 'waiting'."""
        group = self.buffer.pop_ready_group()
        if group is None:
            return "waiting"
        self._groups_in_batch.append(group.group_id)
        self._pending.extend(self.bundles(group))
        if len(self._groups_in_batch) < self.groups_per_batch:
            self._emit(sink, flush=False)
            return "pulled"
        self._emit(sink, flush=True)
        sink.close_batch(self.batch_id, self._steps_in_batch)
        self.batch_id += 1
        self._groups_in_batch, self._steps_in_batch = [], 0
        return "closed"

    def bundles(self, group: ReadyGroup) -> list[ExecutionBundle]:
        """Admit and materialize every trainable execution of a ready group."""
        bundles = []
        for execution in group.executions:
            if not execution.trainable:  # placeholders and excluded executions train nothing
                continue
            rng = execution_rng(self.seed, execution.execution_id)
            admitted = admit_trajectories(execution.tree, self.roles, rng, self.j_max)
            rows = materialize(execution.tree, admitted, execution.advantage, group.group_id)
            if rows:
                bundles.append(ExecutionBundle(execution.execution_id, tuple(rows)))
        return bundles

    def _emit(self, sink: MicroStepSink, *, flush: bool) -> None:
        pending = self._pending
        emitted, kept = pack_micro_steps([b.num_tokens for b in pending], self.token_budget, flush=flush,
                                         emit_fill=self.emit_fill)
        for bin_ in emitted:
            rows = tuple(row for i in bin_ for row in pending[i].rows)
            sink.put(MicroStep(self.batch_id, self._steps_in_batch, rows, self.batch_executions))
            self._steps_in_batch += 1
        self._pending = [pending[i] for i in kept]
