"""Id formats: distinct numbers give distinct ids, and the kinds never collide."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gyre.ids import execution_id, group_id, query_id


@given(st.lists(st.integers(0, 10**9), unique=True, max_size=50))
def test_ids_are_distinct_within_and_across_kinds(numbers):
    ids = [f(n) for f in (execution_id, group_id, query_id) for n in numbers]
    assert len(set(ids)) == len(ids)


def test_the_formats_the_proxy_and_buffer_see():
    assert (execution_id(12), group_id(7), query_id(7)) == ("x12", "g7", "q7")
