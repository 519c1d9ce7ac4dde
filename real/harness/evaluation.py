"""Close a finished execution in the trajectory buffer and score its preserved workspace
(docs/trajectories.md#evaluation-and-outcomes).

``close_and_evaluate(buffer, evaluator, execution_id, workspace, clock)`` is
what the real backend does when a harness process ends, whatever its outcome
(a harness timeout is scored like a completion: partial scoring):

- the evaluator returns a result: the execution closes bound to that result's
  artifact state and the result is recorded (VALID; a valid zero is trainable);
- it returns None (no evaluable work, e.g. the harness never wrote anything):
  the execution closes as a total failure, a zero-reward placeholder that
  keeps the group's count whole and is never trained;
- it raises ``EvaluatorFailure`` (or returns an invalid result): the execution
  closes PENDING, bound to the workspace's content hash, and the evaluator is
  retried on the same preserved state after ``backoff_s`` (doubling, at most
  ``max_backoff_s``) until a valid result or the execution's deadline (its
  total time budget, set when its group was opened); past the deadline it is
  INVALID: excluded, and its group can no longer become ready.

``on_pending`` (optional) is called once, when the execution first waits
for a retry: its evaluation will outlast the harness, so the backend reports
``HarnessStopped`` then (the execution's rollout slot is free; see
``gyre.scheduler``). An evaluation that ends on its first attempt never calls it.

Invariants: the execution is closed exactly once; every failed attempt is in
its evaluation history; the returned state is VALID or INVALID, never PENDING;
the evaluator only ever sees the preserved workspace (it is not touched here).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

from gyre.real.harness.tasks import Evaluator, EvaluatorFailure, preserved_binding
from gyre.trajectory.evaluation import EvalState
from gyre.trajectory.groups import TrajectoryBuffer


async def close_and_evaluate(buffer: TrajectoryBuffer, evaluator: Evaluator, execution_id: str, workspace: Path,
                             clock: Callable[[], float], *, backoff_s: float = 0.5,
                             max_backoff_s: float = 30.0,
                             on_pending: Callable[[], None] | None = None) -> EvalState:
    """Close ``execution_id`` and evaluate it, retrying within its budget; returns VALID or INVALID."""
    closed, delay, waited = False, backoff_s, False
    while True:
        try:
            result = await asyncio.to_thread(evaluator.evaluate, execution_id, workspace)
            reason = "" if result is None or result.valid else "invalid result"
        except EvaluatorFailure as exc:
            result, reason = None, f"evaluator failure: {exc}"
        if not closed:
            if result is None and not reason:
                buffer.close_execution(execution_id, clock(), None)  # no evaluable work: placeholder
                return buffer.evaluation(execution_id).state
            binding = result.binding if result is not None else preserved_binding(execution_id, workspace)
            buffer.close_execution(execution_id, clock(), binding)
            closed = True
            if buffer.evaluation(execution_id).state is not EvalState.PENDING:
                return buffer.evaluation(execution_id).state  # closed past its deadline: already INVALID
        if result is not None:
            state = buffer.record_evaluation(result, clock())
        else:
            state = buffer.evaluator_failed(execution_id, clock(), reason or "no evaluable work on a retry")
        if state is not EvalState.PENDING:
            return state
        if on_pending is not None and not waited:
            on_pending()
        waited = True
        await asyncio.sleep(delay)
        delay = min(2 * delay, max_backoff_s)
        state = buffer.evaluation(execution_id).tick(clock())  # no evaluator call past the deadline
        if state is not EvalState.PENDING:
            return state
