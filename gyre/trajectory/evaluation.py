"""Evaluation state of one execution (docs/trajectories.md#evaluation-and-outcomes), a small pure state machine.

States: OPEN (running) -> PENDING (closed, no valid reward yet) -> VALID or
INVALID. Events carry ``now``; the machine never reads a clock. An illegal
event raises ``EvaluationError`` and leaves the state unchanged.

Transitions:
- ``close(now, preserved)``: OPEN -> PENDING; the preserved artifact state is
  the binding every evaluation must refer to. ``close(now, None)`` is a total
  failure with no evaluable work: OPEN -> VALID with reward 0 as a
  *placeholder* (no trajectory of it is trained; it keeps group counts whole);
- ``record(result, now)``: a valid result while PENDING and inside the budget
  makes the execution VALID with that reward; an invalid result or
  ``evaluator_failed`` is a failed attempt that leaves it PENDING (retry on
  the same preserved state); anything at or past the deadline, or ``tick``
  past it, turns PENDING into INVALID (excluded: pending is not a zero);
- results recorded after VALID or INVALID are kept in ``history`` but never
  change the designated outcome: evaluations are bound to (execution, artifact
  version, branch reference) and never overwritten.

Invariants: ``reward`` exists only in VALID (a valid zero is trainable);
``history`` only grows; the designated result never changes once set.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class EvalState(Enum):
    OPEN = "open"
    PENDING = "pending"
    VALID = "valid"
    INVALID = "invalid"


class EvaluationError(ValueError):
    """An event that is illegal in the current state; the state is unchanged."""


@dataclass(frozen=True)
class EvaluationBinding:
    execution_id: str
    artifact_version: str
    branch_ref: str


@dataclass(frozen=True)
class EvaluationResult:
    binding: EvaluationBinding
    score: float
    valid: bool


@dataclass(frozen=True)
class Attempt:
    now: float
    result: EvaluationResult | None  # None: the evaluator itself failed
    reason: str = ""


class ExecutionEvaluation:
    """Evaluation state of one execution; ``deadline`` ends its total time budget."""

    def __init__(self, execution_id: str, deadline: float) -> None:
        self.execution_id = execution_id
        self.deadline = float(deadline)
        self.state = EvalState.OPEN
        self.preserved: EvaluationBinding | None = None
        self.designated: EvaluationResult | None = None
        self.placeholder = False
        self.exclusion_reason = ""
        self._history: list[Attempt] = []

    @property
    def history(self) -> tuple[Attempt, ...]:
        return tuple(self._history)

    @property
    def reward(self) -> float:
        if self.state is not EvalState.VALID:
            raise EvaluationError(f"execution {self.execution_id!r} has no valid reward (state {self.state.value})")
        if self.placeholder:
            return 0.0
        assert self.designated is not None  # VALID and not a placeholder: set by record()
        return float(self.designated.score)

    @property
    def trainable(self) -> bool:
        """True when the execution's trajectories may be trained (valid, not a placeholder)."""
        return self.state is EvalState.VALID and not self.placeholder

    def close(self, now: float, preserved: EvaluationBinding | None) -> None:
        if self.state is not EvalState.OPEN:
            raise EvaluationError(f"execution {self.execution_id!r} is already closed ({self.state.value})")
        if preserved is None:
            self.state, self.placeholder = EvalState.VALID, True
            return
        self._check_binding(preserved)
        self.preserved = preserved
        self.state = EvalState.PENDING
        self.tick(now)

    def record(self, result: EvaluationResult, now: float) -> EvalState:
        if self.state is EvalState.OPEN:
            raise EvaluationError(f"execution {self.execution_id!r} is still open; close it before evaluating")
        self._check_binding(result.binding)
        if self.state is EvalState.PENDING and result.binding != self.preserved:
            raise EvaluationError(f"result bound to {result.binding} but execution {self.execution_id!r} "
                                  f"preserved {self.preserved}")
        self._history.append(Attempt(now, result, "" if result.valid else "invalid result"))
        if self.state is EvalState.PENDING:
            if now < self.deadline and result.valid:
                self.designated, self.state = result, EvalState.VALID
            else:
                self.tick(now)
        return self.state

    def evaluator_failed(self, now: float, reason: str = "evaluator failure") -> EvalState:
        if self.state is not EvalState.PENDING:
            raise EvaluationError(f"execution {self.execution_id!r} is not pending ({self.state.value})")
        self._history.append(Attempt(now, None, reason))
        return self.tick(now)

    def can_retry(self, now: float) -> bool:
        return self.state is EvalState.PENDING and now < self.deadline

    def tick(self, now: float) -> EvalState:
        if self.state is EvalState.PENDING and now >= self.deadline:
            self.state = EvalState.INVALID
            self.exclusion_reason = "time budget exhausted without a valid reward"
        return self.state

    def _check_binding(self, binding: EvaluationBinding) -> None:
        if binding.execution_id != self.execution_id:
            raise EvaluationError(f"binding of execution {binding.execution_id!r} given to {self.execution_id!r}")
