"""Materialize admitted trajectories into token rows (the only path expansion).

A row is one admitted trajectory: the token ids of its root-to-leaf path, a
target mask, the recorded behaviour log-probabilities, the execution's
advantage, and its per-token weight. Convention: ``target_mask[t]`` means
token ``input_ids[t]`` is a training target predicted from ``input_ids[:t]``
(the trainer shifts); position 0 is never a target because every request has
a non-empty input.

Invariants:
- ``target_mask.sum()`` equals the trajectory's frozen targets, at the row
  offsets of those store positions; ``behavior_logprobs`` is the recorded
  value at targets and 0.0 elsewhere;
- all rows of one execution carry the same ``advantage``, ``execution_targets``
  (L_i, the union of the execution's frozen targets) and ``weight`` = 1 / L_i,
  so sum over the execution's rows of weight * (token losses) is exactly the
  execution loss of docs/trajectories.md#execution-level-loss, whichever way targets are split over rows or
  rows over micro-steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gyre.trajectory.admission import AdmittedTrajectory
from gyre.trajectory.tree import TrajectoryTree


@dataclass(frozen=True, eq=False)
class TokenRow:
    execution_id: str
    group_id: str
    leaf: int
    input_ids: np.ndarray
    target_mask: np.ndarray
    behavior_logprobs: np.ndarray
    advantage: float
    weight: float
    execution_targets: int

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())


def materialize(tree: TrajectoryTree, admitted: Sequence[AdmittedTrajectory], advantage: float,
                group_id: str) -> list[TokenRow]:
    """Token rows of one execution's admitted trajectories, in admission order."""
    if not np.isfinite(advantage):
        raise ValueError(f"advantage of execution {tree.execution_id!r} must be finite, got {advantage!r}")
    total = sum(t.num_targets for t in admitted)
    weight = 1.0 / total if total else 0.0
    return [_row(tree, trajectory, float(advantage), group_id, weight, total) for trajectory in admitted]


def _row(tree: TrajectoryTree, trajectory: AdmittedTrajectory, advantage: float, group_id: str,
         weight: float, total: int) -> TokenRow:
    if trajectory.execution_id != tree.execution_id:
        raise ValueError(f"trajectory of execution {trajectory.execution_id!r} given with the tree of "
                         f"{tree.execution_id!r}")
    positions = tree.path_positions(trajectory.leaf)
    offsets = np.searchsorted(positions, trajectory.targets)
    if len(offsets) and (offsets.max() >= len(positions) or not np.array_equal(positions[offsets], trajectory.targets)):
        raise ValueError(f"targets of leaf {trajectory.leaf} are not on its path")
    mask = np.zeros(len(positions), dtype=bool)
    mask[offsets] = True
    behavior = np.zeros(len(positions), dtype=np.float64)
    behavior[offsets] = tree.logprobs[trajectory.targets]
    return TokenRow(
        execution_id=tree.execution_id,
        group_id=group_id,
        leaf=trajectory.leaf,
        input_ids=tree.tokens[positions],
        target_mask=mask,
        behavior_logprobs=behavior,
        advantage=advantage,
        weight=weight,
        execution_targets=total,
    )
