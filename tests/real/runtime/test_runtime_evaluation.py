"""``close_and_evaluate``: closing a finished execution and scoring it with retries (invariants of
real/runtime_evaluation.py; docs/trajectories.md#evaluation-and-outcomes failure classes)."""

from __future__ import annotations

import asyncio

import pytest

from gyre.real.harness.evaluation import close_and_evaluate
from gyre.real.harness.tasks import EvaluatorFailure, preserved_binding
from gyre.real.toy.tasks import EmitTokenTask
from gyre.trajectory.evaluation import EvalState, EvaluationResult
from gyre.trajectory.groups import TrajectoryBuffer


class Flaky:
    """Fails (or answers invalid) ``failures`` times, then scores like the toy task."""

    def __init__(self, failures: int, how: str = "raise") -> None:
        self.left, self.how, self.calls = failures, how, 0

    def evaluate(self, execution_id, workspace):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            if self.how == "raise":
                raise EvaluatorFailure("scorer container not ready")
            return EvaluationResult(preserved_binding(execution_id, workspace), 0.0, False)
        return EmitTokenTask().evaluate(execution_id, workspace)


class Clock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _setup(tmp_path, deadline: float, answer: str | None = "gyre gyre other"):
    buffer = TrajectoryBuffer(1)
    buffer.open_group("g0", 0, ["x0"], deadline=deadline)
    if answer is not None:
        (tmp_path / "answer.txt").write_text(answer)
    return buffer


def _run(buffer, evaluator, tmp_path, clock):
    return asyncio.run(close_and_evaluate(buffer, evaluator, "x0", tmp_path, clock, backoff_s=0.001))


@pytest.mark.parametrize("how", ["raise", "invalid"])
def test_failed_evaluations_are_retried_on_the_same_state_until_valid(tmp_path, how):
    buffer = _setup(tmp_path, deadline=100.0)
    evaluator = Flaky(2, how)
    assert _run(buffer, evaluator, tmp_path, Clock(1.0)) is EvalState.VALID
    evaluation = buffer.evaluation("x0")
    assert evaluator.calls == 3 and len(evaluation.history) == 3
    assert evaluation.reward == pytest.approx(2 / 3)
    assert evaluation.designated.binding == preserved_binding("x0", tmp_path)
    assert buffer.ready_group_ids() == ["g0"]


def test_a_budget_spent_on_failures_excludes_the_execution_but_not_its_group(tmp_path):
    buffer = _setup(tmp_path, deadline=10.0)
    evaluator = Flaky(10**6)
    assert _run(buffer, evaluator, tmp_path, Clock(1.0)) is EvalState.INVALID
    evaluation = buffer.evaluation("x0")
    assert "budget" in evaluation.exclusion_reason and not evaluation.trainable
    assert all(a.result is None and "scorer container" in a.reason for a in evaluation.history)
    assert 3 <= evaluator.calls <= 10
    # docs/trajectories.md#evaluation-and-outcomes: an excluded execution never blocks its group
    assert buffer.ready_group_ids() == ["g0"]
    assert [e.excluded for e in buffer.pop_ready_group().executions] == [True]


def test_no_evaluable_work_is_a_zero_placeholder(tmp_path):
    buffer = _setup(tmp_path, deadline=100.0, answer=None)
    assert _run(buffer, EmitTokenTask(), tmp_path, Clock(1.0)) is EvalState.VALID
    evaluation = buffer.evaluation("x0")
    assert evaluation.placeholder and evaluation.reward == 0.0 and not evaluation.trainable
    assert buffer.ready_group_ids() == ["g0"]


def test_a_valid_zero_is_trainable(tmp_path):
    buffer = _setup(tmp_path, deadline=100.0, answer="nothing useful")
    assert _run(buffer, EmitTokenTask(), tmp_path, Clock(1.0)) is EvalState.VALID
    evaluation = buffer.evaluation("x0")
    assert evaluation.reward == 0.0 and evaluation.trainable
