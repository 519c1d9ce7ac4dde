"""The event and action invariants of gyre/events.py and gyre/actions.py.

``as_dict`` equals ``dataclasses.asdict`` with the kind first, key for key and in
order; ``event_from_dict`` rebuilds an equal event; events stay frozen. Checked
for every event and action type with generated field values, so a hand-written
constructor (``ExecutionFinished``'s) is held to the generated ones.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre import actions as act
from gyre import events as ev

_VALUES = {
    float: st.floats(allow_nan=False, allow_infinity=False), int: st.integers(-5, 10**9),
    str: st.text(max_size=12), bool: st.booleans(),
}


def _value(annotation: str) -> st.SearchStrategy:
    if annotation.startswith("tuple[tuple"):
        return st.lists(st.tuples(st.integers(), st.integers()), max_size=4).map(tuple)
    if annotation.startswith("tuple"):
        return st.lists(st.integers(), max_size=4).map(tuple)
    return _VALUES[{"float": float, "int": int, "str": str, "bool": bool}[annotation]]


def _instances(cls: type) -> st.SearchStrategy:
    fields = dataclasses.fields(cls)
    return st.fixed_dictionaries({f.name: _value(str(f.type)) for f in fields}).map(
        lambda kw: (cls(**kw), kw))


@pytest.mark.parametrize("cls", list(ev.EVENT_TYPES.values()) + list(act.ACTION_TYPES.values()),
                         ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_rows_equal_asdict_in_order_and_instances_stay_frozen(cls: type, data: st.DataObject) -> None:
    instance, kw = data.draw(_instances(cls))
    positional = [kw[f.name] for f in dataclasses.fields(cls)]
    row = instance.as_dict()
    assert list(row.items()) == [("kind", cls.kind), *dataclasses.asdict(instance).items()]
    assert list(row)[1:] == [f.name for f in dataclasses.fields(cls)]
    assert instance == cls(*positional) and hash(instance) == hash(cls(*positional))
    if cls.kind in ev.EVENT_TYPES:
        assert ev.event_from_dict(row) == instance
    with pytest.raises(dataclasses.FrozenInstanceError):
        instance.kind_of_field = 1  # type: ignore[attr-defined]
    for f in dataclasses.fields(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(instance, f.name, getattr(instance, f.name))


def test_execution_finished_defaults_to_completed() -> None:
    assert ev.ExecutionFinished(1.5, 7) == ev.ExecutionFinished(now=1.5, execution=7, outcome="completed")
    assert ev.ExecutionFinished(1.5, 7).as_dict() == {
        "kind": "execution_finished", "now": 1.5, "execution": 7, "outcome": "completed"}
