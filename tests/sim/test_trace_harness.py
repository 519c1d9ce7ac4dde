"""The optional ``harness_s`` column: validation with generated bad values, defaults, and the generators.

A bad value (negative, not a finite number, above its row's ``duration_s``)
must be rejected with a ``TraceError`` naming its row and the column, from a
frame, a CSV file and a Parquet file alike; a trace without the column reads
``harness_s = duration_s``; the preset generator writes the column by the
duration model's rule (a harness stopped at the ceiling stops at the ceiling;
only an overall timeout spends time in evaluation retries after it).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gyre.formats.trace import HARNESS_COLUMN, Trace, TraceError, load_trace, save_trace
from gyre.sim.sizes import with_sandbox_start
from gyre.sim.traces.presets import HOUR_S, generate_trace, get_preset

ROWS = 8


def frame_with_harness() -> pd.DataFrame:
    """Four queries of two, sorted; harness_s = half of each duration."""
    durations = 100.0 + 10.0 * np.arange(ROWS)
    return pd.DataFrame({"query_id": np.repeat(np.arange(ROWS // 2), 2), "execution_index": np.tile([0, 1], ROWS // 2),
                         "duration_s": durations, "outcome": "completed", HARNESS_COLUMN: durations / 2})


BAD = st.one_of(
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False).map(lambda v: (v, "negative")),
    st.sampled_from([float("nan"), float("inf"), float("-inf")]).map(lambda v: (v, "not a finite number")),
    st.floats(min_value=1e-6, max_value=1e9).map(lambda v: (("above", v), "above the row's duration_s")),
)


@settings(max_examples=examples(120), deadline=None)
@given(row=st.integers(0, ROWS - 1), bad=BAD, medium=st.sampled_from(["frame", "csv", "parquet"]))
def test_a_bad_harness_value_names_its_row_and_the_column(tmp_path_factory, row, bad, medium):
    (value, problem) = bad
    frame = frame_with_harness()
    if isinstance(value, tuple):  # strictly above this row's duration
        value = float(frame.loc[row, "duration_s"]) + value[1]
    frame.loc[row, HARNESS_COLUMN] = value
    with pytest.raises(TraceError) as error:
        if medium == "frame":
            Trace(frame)
        else:
            path = tmp_path_factory.mktemp("t") / f"t.{medium}"
            frame.to_csv(path, index=False) if medium == "csv" else frame.to_parquet(path, index=False)
            load_trace(path)
    message = str(error.value)
    assert re.search(rf"\brow {row + 1}\b", message) and f"'{HARNESS_COLUMN}'" in message, message
    assert problem in message, message


def test_harness_s_may_equal_duration_and_defaults_to_it(tmp_path):
    frame = frame_with_harness()
    frame.loc[3, HARNESS_COLUMN] = frame.loc[3, "duration_s"]
    trace = Trace(frame)
    assert trace.harness_s[1, 1] == trace.durations_s[1, 1] and trace.harness_s[0, 0] == 50.0
    for suffix in (".csv", ".parquet"):
        assert load_trace(save_trace(trace, tmp_path / f"t{suffix}")).equals(trace)
    without = Trace(frame.drop(columns=[HARNESS_COLUMN]))
    np.testing.assert_array_equal(without.harness_s, without.durations_s)


def test_sandbox_start_shifts_the_harness_stop_too():
    trace = with_sandbox_start(Trace(frame_with_harness()), 7.0)
    np.testing.assert_array_equal(trace.harness_s, Trace(frame_with_harness()).harness_s + 7.0)


def test_a_shifted_trace_is_built_once_per_trace_and_shift():
    """Sweeps shift one trace hundreds of times: the same (trace, seconds) gives the same object, any other a new one."""
    base, other = Trace(frame_with_harness()), Trace(frame_with_harness())
    first = with_sandbox_start(base, 7.0)
    assert with_sandbox_start(base, 7.0) is first
    assert with_sandbox_start(other, 7.0) is not first and with_sandbox_start(other, 7.0).equals(first)
    longer = with_sandbox_start(base, 9.0)
    np.testing.assert_allclose(longer.durations_s, base.durations_s + 9.0)
    np.testing.assert_allclose(first.durations_s, base.durations_s + 7.0)
    assert with_sandbox_start(base, 0.0) is base


def test_the_generator_writes_the_harness_ceiling_and_is_deterministic():
    preset = get_preset("nl2repo-122b")
    trace = generate_trace(preset, 3000, np.random.default_rng(11))
    again = generate_trace(preset, 3000, np.random.default_rng(11))
    assert trace.equals(again)
    harness, duration, outcome = trace.harness_s, trace.durations_s, trace.outcomes
    ceiling, budget = preset.model.ceiling_h * HOUR_S, preset.model.budget_h * HOUR_S
    overall = outcome == "overall_timeout"
    assert overall.sum() > 10
    np.testing.assert_allclose(harness[overall], ceiling)
    np.testing.assert_allclose(duration[overall], budget)  # the rest is evaluation retries
    np.testing.assert_array_equal(harness[~overall], duration[~overall])
    np.testing.assert_allclose(harness[outcome == "harness_timeout"], ceiling)
