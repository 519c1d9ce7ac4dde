"""``runtime.tables.from_table``: a job file's sub-table becomes its dataclass, or a ValueError names the key.

Generated tables (Hypothesis): any mapping of known keys builds the dataclass with exactly those values;
any unknown key is named, with the known ones; a missing required key is named with its meaning; a value
that is not a table is refused naming the table. The two real users (``[cluster]``, ``[job.layout]``)
keep their own messages (``test_cluster_config``, ``test_gpu_config``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.real.runtime.tables import from_table


@dataclass
class Shape:
    width: int = 1
    depth: int = 2
    name: str = "x"


KNOWN = ["depth", "name", "width"]
keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


@given(st.dictionaries(st.sampled_from(KNOWN), st.integers()))
def test_known_keys_build_the_dataclass_with_their_values(table):
    built = from_table(Shape, table, "shape")
    assert {k: getattr(built, k) for k in table} == table


@given(st.dictionaries(keys, st.integers(), min_size=1).filter(lambda t: set(t) - set(KNOWN)))
def test_an_unknown_key_is_named_with_the_known_ones(table):
    unknown = sorted(set(table) - set(KNOWN))
    with pytest.raises(ValueError) as refused:
        from_table(Shape, table, "shape")
    assert str(refused.value) == f"shape: unknown key(s) {unknown}; known: {KNOWN}"


@given(st.one_of(st.integers(), st.text(), st.lists(st.integers()), st.none()))
def test_a_value_that_is_not_a_table_is_refused(value):
    with pytest.raises(ValueError, match=r"^shape must be a table \(e\.g\. width = 3\), not "):
        from_table(Shape, value, "shape", "width = 3")


def test_a_missing_required_key_is_named_with_its_meaning():
    with pytest.raises(ValueError, match=r"^shape\.name is missing: what to call it$"):
        from_table(Shape, {"width": 2}, "shape", required={"name": "what to call it"})
    assert from_table(Shape, {"name": "y"}, "shape", required={"name": "what to call it"}) == Shape(name="y")
