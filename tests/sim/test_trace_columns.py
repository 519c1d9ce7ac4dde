"""``Trace.from_columns``: a trace built from numpy columns, without pandas, equals ``Trace(frame)``.

Invariants held here (gyre/formats/trace_columns.py, gyre/formats/trace_frame.py): columns that
``check_columns`` accepts give the frame, grids and trajectories that ``Trace(frame)`` gives for the
same table; a broken cell is refused with ``TraceError`` naming its row and column, as ``Trace(frame)``
refuses it too; a simulation on a generated trace never imports pandas.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.formats.trace import OUTCOMES, Trace, TraceError
from gyre.sim.sizes import with_sandbox_start
from gyre.sim.traces.presets import generate_trace


@st.composite
def tables(draw: st.DrawFn) -> tuple[dict, int]:
    """Valid normalized columns: queries x N rows in blocks, with the optional columns drawn in or out."""
    queries, n = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    rows = queries * n
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    durations = rng.uniform(0.0, 500.0, rows)
    columns = {
        "query_id": np.repeat(np.sort(rng.choice(1000, queries, replace=False)).astype(np.int64), n),
        "execution_index": np.tile(np.sort(rng.choice(50, n, replace=False)).astype(np.int64), queries),
        "duration_s": durations,
    }
    if draw(st.booleans()):
        columns["harness_s"] = durations * rng.uniform(0.0, 1.0, rows)
    columns["outcome"] = rng.integers(0, len(OUTCOMES), rows).astype(np.int8)
    if draw(st.booleans()):
        columns["model_call_share"] = rng.uniform(0.0, 1.0, rows)
    if draw(st.booleans()):
        columns["output_tokens"] = rng.integers(0, 10_000, rows).astype(np.int64)
    return columns, n


def as_frame(columns: dict) -> pd.DataFrame:
    raw = dict(columns)
    raw["outcome"] = np.asarray(OUTCOMES)[columns["outcome"]]
    return pd.DataFrame(raw)


@settings(max_examples=40, deadline=None)
@given(tables())
def test_columns_give_the_trace_a_frame_gives(table: tuple[dict, int]) -> None:
    columns, n = table
    fast, slow = Trace.from_columns(columns, n), Trace(as_frame(columns), N=n)
    assert fast.frame.equals(slow.frame) and list(fast.frame.dtypes) == list(slow.frame.dtypes)
    assert fast.N == slow.N and fast.columns == tuple(slow.frame.columns)
    for grid in ("durations_s", "harness_s", "model_call_share", "outcomes"):
        assert np.array_equal(getattr(fast, grid), getattr(slow, grid))
    assert [g.query_id for g in fast.iter_groups()] == [g.query_id for g in slow.iter_groups()]


BREAKS = {  # column -> (bad value, or None: just above the row's duration_s; words of the message)
    "duration_s": (-1.0, "is negative"),
    "harness_s": (None, "above the row's duration_s"),
    "model_call_share": (1.5, "is above 1"),
    "output_tokens": (-3, "is negative"),
    "outcome": (len(OUTCOMES), "not a code"),
    "execution_index": (-1, "is negative"),
}


@settings(max_examples=60, deadline=None)
@given(tables(), st.sampled_from(sorted(BREAKS)), st.data())
def test_a_broken_cell_is_refused_naming_row_and_column(table: tuple[dict, int], column: str,
                                                        data: st.DataObject) -> None:
    columns, n = table
    if column not in columns:
        columns[column] = np.zeros(len(columns["query_id"]), dtype=np.int64 if column.endswith("tokens") else float)
    row = data.draw(st.integers(0, len(columns["query_id"]) - 1))
    broken = {k: v.copy() for k, v in columns.items()}
    bad, words = BREAKS[column]
    broken[column][row] = broken["duration_s"][row] * 1.01 + 1e-3 if bad is None else bad
    with pytest.raises(TraceError, match=re.escape(f"row {row + 1}, column {column!r}") + ".*" + words):
        Trace.from_columns(broken, n)


def test_unsorted_or_ragged_queries_are_refused() -> None:
    columns = {"query_id": np.array([0, 0, 1, 1], np.int64), "execution_index": np.array([0, 1, 0, 1], np.int64),
               "duration_s": np.ones(4), "outcome": np.zeros(4, np.int8)}
    assert Trace.from_columns(columns, 2).queries == 2
    swapped = {**columns, "query_id": np.array([1, 1, 0, 0], np.int64)}
    with pytest.raises(TraceError, match=r"row 3, column 'query_id'.*not above the previous query"):
        Trace.from_columns(swapped, 2)
    with pytest.raises(TraceError, match=r"row 3, column 'query_id'.*not above the previous query"):
        Trace.from_columns({**columns, "query_id": np.zeros(4, np.int64)}, 2)  # one query twice
    with pytest.raises(TraceError, match=r"row 2, column 'query_id'.*breaks its block of N=2"):
        Trace.from_columns({**columns, "query_id": np.array([0, 1, 1, 1], np.int64)}, 2)
    with pytest.raises(TraceError, match=r"row 2, column 'execution_index'.*not above"):
        Trace.from_columns({**columns, "execution_index": np.array([0, 0, 0, 1], np.int64)}, 2)
    with pytest.raises(TraceError, match=r"not whole groups of N=3"):
        Trace.from_columns(columns, 3)
    with pytest.raises(TraceError, match=r"row 0, column 'outcome': required column is missing"):
        Trace.from_columns({k: v for k, v in columns.items() if k != "outcome"}, 2)
    with pytest.raises(TraceError, match=r"column 'duration_s' must be float64"):
        Trace.from_columns({**columns, "duration_s": np.ones(4, np.int64)}, 2)


def test_a_generated_trace_keeps_its_frame_through_pandas_and_a_shift() -> None:
    trace = generate_trace("deepswe", 20, np.random.default_rng(5), N=4)
    again = Trace(trace.frame, N=4)  # the pandas path, trajectories parsed from the JSON column
    assert again.frame.equals(trace.frame) and np.array_equal(again.kept_tokens(2), trace.kept_tokens(2))
    shifted = with_sandbox_start(trace, 7.5)
    assert np.array_equal(shifted.durations_s, trace.durations_s + 7.5)
    assert np.array_equal(shifted.harness_s, trace.harness_s + 7.5)
    assert np.array_equal(shifted.kept_tokens(3), trace.kept_tokens(3))
    copy = pickle.loads(pickle.dumps(shifted))
    assert copy.frame.equals(shifted.frame) and copy.N == 4


def test_a_simulation_on_a_generated_trace_never_imports_pandas() -> None:
    program = ("import sys\nfrom gyre.sim.runner import run_simulation\n"
               "run_simulation('E0', 'nl2repo-122b', steps=1, seed=0)\n"
               "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_a_trace_is_never_modified() -> None:
    trace = generate_trace("nl2repo-122b", 4, np.random.default_rng(0), N=2)
    with pytest.raises(AttributeError, match="never modified"):
        trace.N = 3  # type: ignore[misc]
    assert trace.N == 2 and trace.frame is trace.frame  # the lazily built frame is built once
