"""Evaluation state machine (evaluation.py)."""

from __future__ import annotations

import pytest

from gyre.trajectory.evaluation import (EvalState, EvaluationBinding, EvaluationError, EvaluationResult,
                                        ExecutionEvaluation)

STATE = EvaluationBinding("e1", "artifact-7", "refs/heads/run-e1")


def closed(deadline=100.0) -> ExecutionEvaluation:
    evaluation = ExecutionEvaluation("e1", deadline)
    evaluation.close(10.0, STATE)
    return evaluation


def test_valid_result_after_evaluator_failures_within_budget():
    evaluation = closed()
    assert evaluation.state is EvalState.PENDING
    assert evaluation.evaluator_failed(20.0) is EvalState.PENDING and evaluation.can_retry(20.0)
    evaluation.record(EvaluationResult(STATE, 0.4, valid=False), 30.0)  # invalid result: another failed attempt
    assert evaluation.state is EvalState.PENDING
    evaluation.record(EvaluationResult(STATE, 0.7, valid=True), 40.0)
    assert evaluation.state is EvalState.VALID and evaluation.reward == 0.7 and evaluation.trainable
    assert len(evaluation.history) == 3


def test_budget_exhaustion_excludes_and_pending_is_not_zero():
    evaluation = closed(deadline=50.0)
    with pytest.raises(EvaluationError, match="no valid reward"):
        _ = evaluation.reward  # pending has no reward, not 0
    evaluation.tick(49.0)
    assert evaluation.state is EvalState.PENDING
    evaluation.tick(50.0)
    assert evaluation.state is EvalState.INVALID and not evaluation.trainable
    assert "budget" in evaluation.exclusion_reason
    # a result arriving too late is kept in the history but changes nothing
    evaluation.record(EvaluationResult(STATE, 1.0, valid=True), 60.0)
    assert evaluation.state is EvalState.INVALID and len(evaluation.history) == 1


def test_result_at_the_deadline_is_too_late():
    evaluation = closed(deadline=50.0)
    assert evaluation.record(EvaluationResult(STATE, 1.0, valid=True), 50.0) is EvalState.INVALID


def test_valid_zero_is_trainable():
    evaluation = closed()
    evaluation.record(EvaluationResult(STATE, 0.0, valid=True), 11.0)
    assert evaluation.reward == 0.0 and evaluation.trainable


def test_total_failure_is_a_zero_placeholder():
    evaluation = ExecutionEvaluation("e1", 100.0)
    evaluation.close(5.0, None)
    assert evaluation.state is EvalState.VALID and evaluation.placeholder
    assert evaluation.reward == 0.0 and not evaluation.trainable


def test_later_evaluations_never_overwrite_the_designated_one():
    evaluation = closed()
    first = EvaluationResult(STATE, 0.5, valid=True)
    evaluation.record(first, 11.0)
    later = EvaluationResult(EvaluationBinding("e1", "artifact-8", "refs/heads/other"), 0.9, valid=True)
    evaluation.record(later, 12.0)
    assert evaluation.designated == first and evaluation.reward == 0.5
    assert [a.result for a in evaluation.history] == [first, later]


def test_illegal_events_raise_and_leave_state_unchanged():
    evaluation = ExecutionEvaluation("e1", 100.0)
    with pytest.raises(EvaluationError, match="still open"):
        evaluation.record(EvaluationResult(STATE, 1.0, True), 1.0)
    with pytest.raises(EvaluationError, match="not pending"):
        evaluation.evaluator_failed(1.0)
    assert evaluation.state is EvalState.OPEN and evaluation.history == ()
    evaluation.close(1.0, STATE)
    with pytest.raises(EvaluationError, match="already closed"):
        evaluation.close(2.0, STATE)
    with pytest.raises(EvaluationError, match="binding of execution 'e2'"):
        evaluation.record(EvaluationResult(EvaluationBinding("e2", "a", "b"), 1.0, True), 3.0)
    with pytest.raises(EvaluationError, match="preserved"):
        evaluation.record(EvaluationResult(EvaluationBinding("e1", "other", "b"), 1.0, True), 3.0)
    assert evaluation.state is EvalState.PENDING and evaluation.history == ()
