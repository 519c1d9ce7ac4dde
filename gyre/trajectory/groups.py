"""Trajectory buffer by rollout group, and group-relative advantages (docs/trajectories.md#evaluation-and-outcomes).

A group is opened with its dispatched executions (``N`` plus any oversampled
surplus) and the policy version it was admitted under. Each execution owns a
trajectory tree and an evaluation state machine.

Readiness follows ``outcomes.GroupOutcomes`` (docs/trajectories.md#evaluation-and-outcomes, the same rule the
simulator uses): a group is ready once ``N`` of its executions have a
designated outcome, valid (a placeholder counts, as reward 0) or excluded
(budget exhausted without a valid reward); the *first* ``N`` to resolve are
the designated ones (without oversampling that is all N). An excluded
execution never blocks its group: it appears in the ready group with
``excluded=True``, no reward and advantage 0, and still counts in the batch
denominator. A group the driver gives up on (``drop_group``: an operator
cancelled the query, its task could not be set up) is forgotten.

Pull order: ``pop_ready_group`` returns the ready group with the oldest policy
version, ties broken by the order in which groups became ready.

Advantage normalisation (exact), over the designated participants' rewards
r_1..r_m (m = N minus the excluded; no advantages when m = 0):
- ``"std"`` (default): A_i = (r_i - mean(r)) / (std(r) + eps), where std is the
  population standard deviation (ddof = 0) and eps = 1e-6; equal rewards give
  A_i = 0 for every i;
- ``"mean"``: A_i = r_i - mean(r).
Placeholders enter mean and std with reward 0; they carry no trainable tokens.

Invariants: an execution id belongs to one group; records of an unknown or
closed execution raise; advantages are computed only for ready groups.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from gyre.trajectory.evaluation import EvalState, EvaluationBinding, EvaluationResult, ExecutionEvaluation
from gyre.trajectory.outcomes import Designated, GroupOutcomes
from gyre.trajectory.records import ModelCall
from gyre.trajectory.tree import Placement, TrajectoryTree

NORMALISATIONS = ("std", "mean")


class TrajectoryBufferError(ValueError):
    """An event the buffer cannot accept; the message names the problem."""


def group_advantages(rewards, normalisation: str = "std", eps: float = 1e-6) -> np.ndarray:
    """Group-relative advantages; see the module docstring for the exact formula."""
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or r.size == 0 or not np.isfinite(r).all():
        raise ValueError("rewards must be a non-empty 1-D array of finite numbers")
    centred = r - r.mean()
    return centred if normalisation == "mean" else centred / (r.std() + eps)


@dataclass(frozen=True)
class ReadyExecution:
    execution_id: str
    tree: TrajectoryTree
    reward: float | None      # None when excluded
    advantage: float          # 0.0 when excluded
    placeholder: bool
    excluded: bool = False

    @property
    def trainable(self) -> bool:
        return not (self.placeholder or self.excluded)


@dataclass(frozen=True)
class ReadyGroup:
    group_id: str
    policy_version: int
    executions: tuple[ReadyExecution, ...]


@dataclass
class _Group:
    group_id: str
    policy_version: int
    execution_ids: tuple[str, ...]
    outcomes: GroupOutcomes[str]
    ready_seq: int | None = None


class TrajectoryBuffer:
    """Execution records and rewards per group; see the module docstring."""

    def __init__(self, group_size: int, *, normalisation: str = "std", eps: float = 1e-6) -> None:
        if not isinstance(group_size, int) or group_size < 1:
            raise TrajectoryBufferError(f"group_size must be a positive integer, got {group_size!r}")
        if normalisation not in NORMALISATIONS:
            raise TrajectoryBufferError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
        self.group_size = group_size
        self.normalisation = normalisation
        self.eps = eps
        self._groups: dict[str, _Group] = {}
        self._trees: dict[str, TrajectoryTree] = {}
        self._evals: dict[str, ExecutionEvaluation] = {}
        self._group_of: dict[str, str] = {}
        self._ready_counter = itertools.count()

    def open_group(self, group_id: str, policy_version: int, execution_ids, deadline: float) -> None:
        execution_ids = tuple(execution_ids)
        if group_id in self._groups:
            raise TrajectoryBufferError(f"group {group_id!r} is already open")
        if len(execution_ids) < self.group_size or len(set(execution_ids)) != len(execution_ids):
            raise TrajectoryBufferError(f"group {group_id!r} needs at least {self.group_size} distinct executions, "
                                        f"got {len(execution_ids)}")
        taken = [e for e in execution_ids if e in self._group_of]
        if taken:
            raise TrajectoryBufferError(f"executions {taken} already belong to a group")
        self._groups[group_id] = _Group(group_id, int(policy_version), execution_ids, GroupOutcomes(self.group_size))
        for execution_id in execution_ids:
            self._group_of[execution_id] = group_id
            self._trees[execution_id] = TrajectoryTree(execution_id)
            self._evals[execution_id] = ExecutionEvaluation(execution_id, deadline)

    def _execution(self, execution_id: str) -> tuple[TrajectoryTree, ExecutionEvaluation]:
        if execution_id not in self._trees:
            raise TrajectoryBufferError(f"unknown execution {execution_id!r} (not in any open group)")
        return self._trees[execution_id], self._evals[execution_id]

    def add(self, call: ModelCall) -> Placement:
        tree, _ = self._execution(call.execution_id)
        return tree.add(call)

    def tree(self, execution_id: str) -> TrajectoryTree:
        return self._execution(execution_id)[0]

    def evaluation(self, execution_id: str) -> ExecutionEvaluation:
        return self._execution(execution_id)[1]

    def close_execution(self, execution_id: str, now: float, preserved: EvaluationBinding | None) -> None:
        tree, evaluation = self._execution(execution_id)
        evaluation.close(now, preserved)
        tree.close()
        self._after_change(execution_id)

    def record_evaluation(self, result: EvaluationResult, now: float) -> EvalState:
        _, evaluation = self._execution(result.binding.execution_id)
        state = evaluation.record(result, now)
        self._after_change(result.binding.execution_id)
        return state

    def evaluator_failed(self, execution_id: str, now: float, reason: str = "evaluator failure") -> EvalState:
        _, evaluation = self._execution(execution_id)
        state = evaluation.evaluator_failed(now, reason)
        self._after_change(execution_id)
        return state

    def tick(self, now: float) -> None:
        for execution_id, evaluation in list(self._evals.items()):
            evaluation.tick(now)
            self._after_change(execution_id)

    def _after_change(self, execution_id: str) -> None:
        group = self._groups[self._group_of[execution_id]]
        evaluation = self._evals[execution_id]
        if evaluation.state not in (EvalState.VALID, EvalState.INVALID) or group.outcomes.has(execution_id):
            return
        outcome = (Designated.EXCLUDED if evaluation.state is EvalState.INVALID
                   else Designated.PLACEHOLDER if evaluation.placeholder else Designated.VALID)
        if group.outcomes.resolve(execution_id, outcome):
            group.ready_seq = next(self._ready_counter)

    def ready_group_ids(self) -> list[str]:
        ready = [g for g in self._groups.values() if g.ready_seq is not None]
        return [g.group_id for g in sorted(ready, key=lambda g: (g.policy_version, g.ready_seq))]

    def pop_ready_group(self) -> ReadyGroup | None:
        """Remove and return the next ready group (oldest policy version first)."""
        ready = self.ready_group_ids()
        if not ready:
            return None
        group = self._groups[ready[0]]
        participants = group.outcomes.participants
        rewards = {e: self._evals[e].reward for e in participants}
        advantages = dict(zip(participants, group_advantages(list(rewards.values()), self.normalisation, self.eps)
                              if participants else ()))
        executions = tuple(
            ReadyExecution(e, self._trees[e], rewards.get(e), float(advantages.get(e, 0.0)),
                           self._evals[e].placeholder, excluded=o is Designated.EXCLUDED)
            for e, o in group.outcomes.designated
        )
        self._forget(group)
        return ReadyGroup(group.group_id, group.policy_version, executions)

    def drop_group(self, group_id: str) -> None:
        if group_id not in self._groups:
            raise TrajectoryBufferError(f"unknown group {group_id!r}")
        self._forget(self._groups[group_id])

    def _forget(self, group: _Group) -> None:
        del self._groups[group.group_id]
        for execution_id in group.execution_ids:
            del self._group_of[execution_id], self._trees[execution_id], self._evals[execution_id]
