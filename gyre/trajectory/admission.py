"""Bounded admission by role priority (docs/trajectories.md#admission), one seeded draw at a time.

Loop, until ``j_max`` trajectories are admitted or no admissible leaf has an
unmasked trainable token left:
1. take the highest-priority role class that still has a leaf with unmasked
   trainable tokens (roles outside the harness's priority are never admitted);
2. draw one of that class's leaves with probability proportional to its count
   of unmasked trainable tokens (exact integer weights, leaves in id order,
   one ``rng.integers`` call per draw);
3. freeze the trajectory's targets: exactly the trainable positions on its
   root-to-leaf path that are still unmasked at that moment;
4. mask the whole root-to-leaf path.

Invariants (tested with a state machine in tests/trajectory/test_admission.py):
- targets of different trajectories are disjoint (no token is trained twice);
- every target is a SAMPLED position on its own trajectory's path (external and
  evaluator tokens are never targets);
- frozen targets never change (read-only arrays, the tree is closed);
- every draw takes the highest class that still has unmasked trainable tokens;
- the same tree, roles, ``j_max`` and generator state give the same admission.

The tree must be closed: admission runs on committed records only. Masking
works on whole nodes, which is exact because a closed tree no longer splits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre.trajectory.harness_roles import HarnessRoles, leaf_roles
from gyre.trajectory.tree import TrajectoryTree

DEFAULT_J_MAX = 5


class AdmissionError(ValueError):
    """Admission cannot run on these inputs; the message says why."""


@dataclass(frozen=True, eq=False)
class AdmittedTrajectory:
    execution_id: str
    leaf: int
    role: str
    draw: int
    targets: np.ndarray  # read-only, increasing store positions

    @property
    def num_targets(self) -> int:
        return len(self.targets)


def check_j_max(j_max: object) -> int:
    if isinstance(j_max, bool) or not isinstance(j_max, (int, np.integer)) or j_max < 1:
        raise AdmissionError(f"j_max must be a positive integer, got {j_max!r}")
    return int(j_max)


class Admission:
    """Step-by-step admission over one closed tree; ``draw`` admits one trajectory."""

    def __init__(self, tree: TrajectoryTree, roles: HarnessRoles, rng: np.random.Generator,
                 j_max: int = DEFAULT_J_MAX) -> None:
        if not tree.closed:
            raise AdmissionError(f"tree of execution {tree.execution_id!r} is still open; close it before admission")
        if not isinstance(rng, np.random.Generator):
            raise AdmissionError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self.tree = tree
        self.rng = rng
        self.j_max = check_j_max(j_max)
        self.priority = tuple(roles.priority)
        self.roles = leaf_roles(tree, roles)
        self._paths = {leaf: tree.path(leaf) for leaf in self.roles}
        trainable = np.concatenate([[0], np.cumsum(tree.trainable, dtype=np.int64)])
        self._node_trainable = {n: int(trainable[e] - trainable[s])
                                for n in range(1, tree.num_nodes + 1) for s, e in [tree.node_range(n)]}
        self._masked_nodes: set[int] = set()
        self.admitted: list[AdmittedTrajectory] = []

    def unmasked_counts(self) -> dict[int, int]:
        """Unmasked trainable tokens of every leaf, now."""
        return {leaf: sum(self._node_trainable[n] for n in path if n not in self._masked_nodes)
                for leaf, path in self._paths.items()}

    def next_class(self, counts: dict[int, int] | None = None) -> str | None:
        """The class the next draw takes from, or None when nothing is left."""
        counts = self.unmasked_counts() if counts is None else counts
        for role in self.priority:
            if any(counts[leaf] > 0 for leaf, r in self.roles.items() if r == role):
                return role
        return None

    @property
    def done(self) -> bool:
        return len(self.admitted) >= self.j_max or self.next_class() is None

    def draw(self) -> AdmittedTrajectory | None:
        """Admit one trajectory, or return None when admission is over."""
        if len(self.admitted) >= self.j_max:
            return None
        counts = self.unmasked_counts()
        role = self.next_class(counts)
        if role is None:
            return None
        leaves = [leaf for leaf in sorted(self.roles) if self.roles[leaf] == role and counts[leaf] > 0]
        weights = np.cumsum([counts[leaf] for leaf in leaves])
        pick = int(np.searchsorted(weights, self.rng.integers(0, weights[-1]), side="right"))
        trajectory = self._freeze(leaves[pick], role)
        self._masked_nodes.update(self._paths[trajectory.leaf])
        self.admitted.append(trajectory)
        return trajectory

    def _freeze(self, leaf: int, role: str) -> AdmittedTrajectory:
        trainable = self.tree.trainable
        parts = []
        for node in self._paths[leaf]:
            if node in self._masked_nodes or not self._node_trainable[node]:
                continue
            start, end = self.tree.node_range(node)
            parts.append(start + np.flatnonzero(trainable[start:end]))
        targets = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        targets.setflags(write=False)
        return AdmittedTrajectory(self.tree.execution_id, leaf, role, len(self.admitted), targets)

    def masked_positions(self) -> np.ndarray:
        """Boolean mask over store positions: True where a path was masked."""
        mask = np.zeros(self.tree.num_tokens, dtype=bool)
        for node in self._masked_nodes:
            start, end = self.tree.node_range(node)
            mask[start:end] = True
        return mask

    def run(self) -> list[AdmittedTrajectory]:
        while self.draw() is not None:
            pass
        return list(self.admitted)


def admit_trajectories(tree: TrajectoryTree, roles: HarnessRoles, rng: np.random.Generator,
                       j_max: int = DEFAULT_J_MAX) -> list[AdmittedTrajectory]:
    """Run the admission loop of docs/trajectories.md#admission to the end; see the module docstring."""
    return Admission(tree, roles, rng, j_max).run()
