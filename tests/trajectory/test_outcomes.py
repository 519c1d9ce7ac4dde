"""Designated outcomes and readiness (outcomes.py): the rule the buffer and the simulator share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.trajectory.outcomes import Designated, GroupOutcomes, OutcomeError, designated_outcome

OUTCOMES = st.sampled_from(list(Designated))


@given(N=st.integers(1, 6), surplus=st.integers(0, 3), as_integers=st.booleans(), data=st.data())
def test_ready_exactly_when_n_resolved_and_designation_is_stable(N, surplus, as_integers, data):
    """The same for the real buffer's string ids and the simulator's integer executions."""
    outcomes = [data.draw(OUTCOMES) for _ in range(N + surplus)]
    key = (lambda i: 1000 + i) if as_integers else (lambda i: f"x{i}")
    group, became_ready = GroupOutcomes(N), []
    for i, outcome in enumerate(outcomes):
        became_ready.append(group.resolve(key(i), outcome))
        assert group.ready == (i + 1 >= N)
        if group.ready:
            assert group.designated == [(key(j), o) for j, o in enumerate(outcomes[:N])]
    assert became_ready.count(True) == 1 and became_ready[N - 1]
    assert len(group.participants) + len(group.excluded) == N == group.denominator
    assert all(o is not Designated.EXCLUDED for e, o in group.designated if e in group.participants)


def test_resolving_twice_is_refused_and_changes_nothing():
    group = GroupOutcomes(2)
    group.resolve("a", Designated.VALID)
    with pytest.raises(OutcomeError, match="already"):
        group.resolve("a", Designated.EXCLUDED)
    assert group.resolved == [("a", Designated.VALID)]


def test_trace_outcomes_map_to_designated_outcomes():
    assert designated_outcome("completed") is Designated.VALID
    assert designated_outcome("harness_timeout") is Designated.VALID  # partial work is scored
    assert designated_outcome("failed") is Designated.PLACEHOLDER
    assert designated_outcome("overall_timeout") is Designated.EXCLUDED
    with pytest.raises(ValueError, match="no designated outcome for 'cancelled'"):
        designated_outcome("cancelled")
