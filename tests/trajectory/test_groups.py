"""Trajectory buffer by group and group-relative advantages (groups.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.trajectory.evaluation import EvalState, EvaluationBinding, EvaluationResult
from gyre.trajectory.groups import TrajectoryBuffer, TrajectoryBufferError, group_advantages
from gyre.trajectory.records import ModelCall


def binding(e):
    return EvaluationBinding(e, "v1", f"refs/{e}")


def finish(buffer, e, score, now=1.0):
    buffer.close_execution(e, now, binding(e))
    buffer.record_evaluation(EvaluationResult(binding(e), score, True), now)


def test_exact_std_normalisation():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5]
    r = np.array(rewards)
    expected = (r - r.mean()) / (np.sqrt(((r - r.mean()) ** 2).mean()) + 1e-6)
    assert np.allclose(group_advantages(rewards), expected, rtol=0, atol=1e-12)
    assert np.allclose(group_advantages(rewards, "mean"), r - r.mean())
    assert np.array_equal(group_advantages([0.3, 0.3, 0.3]), [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="normalisation"):
        group_advantages(rewards, "rank")


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=32))
def test_advantages_sum_to_zero(rewards):
    assert abs(group_advantages(rewards).sum()) < 1e-6 * max(1.0, len(rewards))


def test_group_ready_only_when_all_n_have_an_outcome():
    buffer = TrajectoryBuffer(3)
    buffer.open_group("g1", 0, ["a", "b", "c"], deadline=100.0)
    finish(buffer, "a", 1.0)
    finish(buffer, "b", 0.0)
    buffer.close_execution("c", 2.0, binding("c"))
    assert buffer.pop_ready_group() is None  # c is pending: pending is not zero
    buffer.record_evaluation(EvaluationResult(binding("c"), 0.0, True), 3.0)
    group = buffer.pop_ready_group()
    assert [e.execution_id for e in group.executions] == ["a", "b", "c"]
    assert np.allclose([e.advantage for e in group.executions], group_advantages([1.0, 0.0, 0.0]))
    with pytest.raises(TrajectoryBufferError, match="unknown execution 'a'"):
        buffer.tree("a")  # popped groups leave the buffer


def test_placeholder_keeps_group_counts_complete():
    buffer = TrajectoryBuffer(2)
    buffer.open_group("g1", 0, ["a", "b"], deadline=100.0)
    finish(buffer, "a", 1.0)
    buffer.close_execution("b", 1.0, None)  # total failure
    group = buffer.pop_ready_group()
    assert [(e.reward, e.placeholder) for e in group.executions] == [(1.0, False), (0.0, True)]


def test_an_excluded_execution_never_blocks_its_group():
    """docs/trajectories.md#evaluation-and-outcomes: the group is ready, the excluded execution has no reward,
    advantages use the rest."""
    buffer = TrajectoryBuffer(3)
    buffer.open_group("g1", 0, ["a", "b", "c"], deadline=10.0)
    finish(buffer, "a", 1.0)
    finish(buffer, "b", 0.0)
    buffer.close_execution("c", 1.0, binding("c"))
    buffer.evaluator_failed("c", 5.0)
    assert buffer.ready_group_ids() == []  # pending is not an outcome yet
    buffer.tick(10.0)
    assert buffer.evaluation("c").state is EvalState.INVALID
    group = buffer.pop_ready_group()
    by_id = {e.execution_id: e for e in group.executions}
    assert [e.execution_id for e in group.executions] == ["a", "b", "c"]
    assert by_id["c"].excluded and by_id["c"].reward is None and by_id["c"].advantage == 0.0
    assert not by_id["c"].trainable and by_id["a"].trainable
    assert np.allclose([by_id["a"].advantage, by_id["b"].advantage], group_advantages([1.0, 0.0]))


def test_a_group_of_only_excluded_executions_is_ready_with_nothing_to_train():
    buffer = TrajectoryBuffer(2)
    buffer.open_group("g1", 0, ["a", "b"], deadline=5.0)
    for e in ("a", "b"):
        buffer.close_execution(e, 1.0, binding(e))
    buffer.tick(5.0)
    group = buffer.pop_ready_group()
    assert [(e.excluded, e.advantage, e.trainable) for e in group.executions] == [(True, 0.0, False)] * 2


def test_drop_group_forgets_a_group_that_cannot_complete():
    buffer = TrajectoryBuffer(2)
    buffer.open_group("g1", 0, ["a", "b"], deadline=5.0)
    buffer.drop_group("g1")
    assert buffer.ready_group_ids() == []
    with pytest.raises(TrajectoryBufferError, match="unknown execution 'a'"):
        buffer.tree("a")
    with pytest.raises(TrajectoryBufferError, match="unknown group"):
        buffer.drop_group("g1")


def test_oversampling_designates_the_first_n_valid():
    buffer = TrajectoryBuffer(2)
    buffer.open_group("g1", 0, ["a", "b", "c"], deadline=100.0)
    finish(buffer, "c", 0.2)
    finish(buffer, "a", 0.8)
    group = buffer.pop_ready_group()
    assert [e.execution_id for e in group.executions] == ["c", "a"]


def test_pull_order_is_oldest_policy_version_first():
    buffer = TrajectoryBuffer(1)
    for group, version in (("new", 5), ("old", 2), ("older-but-later", 2)):
        buffer.open_group(group, version, [f"{group}-x"], deadline=100.0)
    for group in ("new", "old", "older-but-later"):
        finish(buffer, f"{group}-x", 1.0)
    assert [buffer.pop_ready_group().group_id for _ in range(3)] == ["old", "older-but-later", "new"]


def test_bad_events_raise_clearly():
    buffer = TrajectoryBuffer(2)
    with pytest.raises(TrajectoryBufferError, match="at least 2 distinct"):
        buffer.open_group("g", 0, ["a", "a"], deadline=1.0)
    buffer.open_group("g", 0, ["a", "b"], deadline=1.0)
    with pytest.raises(TrajectoryBufferError, match="already open"):
        buffer.open_group("g", 0, ["c", "d"], deadline=1.0)
    with pytest.raises(TrajectoryBufferError, match="already belong"):
        buffer.open_group("h", 0, ["a", "z"], deadline=1.0)
    call = ModelCall(execution_id="ghost", request_id="r", input_ids=[1], output_ids=[2],
                     output_logprobs=[-1.0], policy_version=0)
    with pytest.raises(TrajectoryBufferError, match="unknown execution 'ghost'"):
        buffer.add(call)
    with pytest.raises(TrajectoryBufferError, match="group_size"):
        TrajectoryBuffer(0)
