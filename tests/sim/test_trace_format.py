"""The trace format: validation messages, round trips, group access and cycling."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.formats.trace import OUTCOMES, Trace, TraceError, load_trace, save_trace


def small_frame(queries: int = 3, N: int = 2) -> pd.DataFrame:
    """A valid table, deliberately unsorted (queries descending, indices reversed)."""
    rows = []
    for q in reversed(range(queries)):
        for j in reversed(range(N)):
            rows.append(
                {
                    "query_id": q,
                    "execution_index": j,
                    "duration_s": 100.0 * (q + 1) + j,
                    "outcome": OUTCOMES[(q + j) % len(OUTCOMES)],
                    "input_tokens": 1000 * (q + 1),
                    "output_tokens": 10 * (j + 1),
                    "call_count": 3,
                }
            )
    return pd.DataFrame(rows)


def write_csv(tmp_path, frame: pd.DataFrame, name: str = "t.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def assert_names(error: pytest.ExceptionInfo, row: int, column: str) -> None:
    message = str(error.value)
    assert re.search(rf"\brow {row}\b", message), message
    assert f"'{column}'" in message, message


def test_trace_is_sorted_and_grouped():
    trace = Trace(small_frame())
    assert (trace.queries, trace.N) == (3, 2)
    assert list(trace.frame["query_id"]) == [0, 0, 1, 1, 2, 2]
    assert list(trace.frame["execution_index"]) == [0, 1] * 3
    group = trace.group(1)
    assert group.query_id == 1
    np.testing.assert_array_equal(group.durations_s, [200.0, 201.0])
    assert list(group.outcomes) == [OUTCOMES[1], OUTCOMES[2]]
    np.testing.assert_array_equal(group.input_tokens, [2000, 2000])
    assert group.query_duration_s == 201.0
    assert [g.query_id for g in trace.iter_groups()] == [0, 1, 2]


def test_query_at_cycles_deterministically():
    trace = Trace(small_frame())
    drawn = [trace.query_at(k).query_id for k in range(8)]
    assert drawn == [0, 1, 2, 0, 1, 2, 0, 1]
    assert trace.query_at(3000).query_id == trace.query_at(0).query_id
    with pytest.raises(IndexError):
        trace.query_at(-1)
    with pytest.raises(IndexError):
        trace.group(3)


def test_grids_are_read_only():
    trace = Trace(small_frame())
    assert trace.durations_s.shape == (3, 2)
    with pytest.raises(ValueError):
        trace.durations_s[0, 0] = 1.0
    with pytest.raises(ValueError):
        trace.group(0).durations_s[0] = 1.0


def test_text_query_ids_sort_lexicographically_and_extra_columns_survive(tmp_path):
    frame = small_frame()
    frame["query_id"] = frame["query_id"].map({0: "b-task", 1: "a-task", 2: "c-task"})
    frame["note"] = "kept"
    trace = load_trace(write_csv(tmp_path, frame))
    assert [g.query_id for g in trace.iter_groups()] == ["a-task", "b-task", "c-task"]
    assert (trace.frame["note"] == "kept").all()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip(tmp_path, suffix):
    frame = small_frame()
    frame["duration_s"] = np.random.default_rng(3).lognormal(8, 1, len(frame))
    frame["call_durations_s"] = ["[1.5, 2.25, 0.125]"] * len(frame)
    trace = Trace(frame)
    loaded = load_trace(save_trace(trace, tmp_path / f"trace{suffix}"), N=2)
    pd.testing.assert_frame_equal(loaded.frame, trace.frame)
    assert loaded.equals(trace)


def test_missing_column_names_header_row(tmp_path):
    path = write_csv(tmp_path, small_frame().drop(columns=["duration_s"]))
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert_names(error, 0, "duration_s")
    assert "missing" in str(error.value)


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("duration_s", -5.0, "negative"),
        ("duration_s", "abc", "not a finite number"),
        ("duration_s", "", "not a finite number"),
        ("duration_s", "inf", "not a finite number"),
        ("outcome", "crashed", "unknown outcome"),
        ("execution_index", 1.5, "not an integer"),
        ("input_tokens", -1, "negative"),
        ("call_count", "many", "not a finite number"),
    ],
)
def test_bad_cell_names_row_and_column(tmp_path, column, value, problem):
    frame = small_frame().astype({column: object})
    frame.loc[3, column] = value  # data row 4 of the file, line 5
    with pytest.raises(TraceError) as error:
        load_trace(write_csv(tmp_path, frame))
    assert_names(error, 4, column)
    assert problem in str(error.value)


def test_bad_cell_in_parquet(tmp_path):
    frame = small_frame()
    frame.loc[5, "duration_s"] = -1.0
    path = tmp_path / "bad.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert_names(error, 6, "duration_s")


def test_wrong_group_size_given_n(tmp_path):
    path = write_csv(tmp_path, small_frame())
    with pytest.raises(TraceError) as error:
        load_trace(path, N=3)
    assert_names(error, 1, "query_id")
    assert "expected N=3" in str(error.value)


def test_wrong_group_size_inferred_from_first_query(tmp_path):
    frame = small_frame().drop(index=[4])  # query 0 keeps one execution; it starts at row 5
    with pytest.raises(TraceError) as error:
        load_trace(write_csv(tmp_path, frame))
    assert_names(error, 5, "query_id")
    assert "has 1 executions, expected N=2" in str(error.value)


def test_duplicate_execution(tmp_path):
    frame = small_frame()
    frame.loc[1, "execution_index"] = 1  # row 2 repeats row 1's (2, 1)
    with pytest.raises(TraceError) as error:
        load_trace(write_csv(tmp_path, frame))
    assert_names(error, 2, "execution_index")
    assert "duplicate" in str(error.value) and "row 1" in str(error.value)


def test_call_durations_must_match_call_count(tmp_path):
    frame = small_frame()
    frame["call_durations_s"] = ["[1.0, 2.0, 3.0]"] * len(frame)
    frame.loc[2, "call_durations_s"] = "[1.0]"
    with pytest.raises(TraceError) as error:
        load_trace(write_csv(tmp_path, frame))
    assert_names(error, 3, "call_durations_s")
    frame.loc[2, "call_durations_s"] = "not json"
    with pytest.raises(TraceError) as error:
        load_trace(write_csv(tmp_path, frame))
    assert_names(error, 3, "call_durations_s")


def test_file_level_errors(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="suffix"):
        load_trace(tmp_path / "trace.txt")
    (tmp_path / "empty.csv").write_text("query_id,execution_index,duration_s,outcome\n")
    with pytest.raises(TraceError, match="no rows"):
        load_trace(tmp_path / "empty.csv")
    (tmp_path / "blank.csv").write_text("")
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "blank.csv")
    with pytest.raises(ValueError, match="positive integer"):
        Trace(small_frame(), N=0)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not 0 <= v <= 1),
                 st.just("half")))
def test_a_model_call_share_outside_0_1_is_named_with_its_row(bad):
    from gyre.formats.trace import MODEL_SHARE_COLUMN

    frame = pd.DataFrame({"query_id": [0, 0], "execution_index": [0, 1], "duration_s": [10.0, 20.0],
                          "outcome": ["completed", "completed"], MODEL_SHARE_COLUMN: [0.5, bad]})
    with pytest.raises(TraceError, match=r"row 2, column 'model_call_share'"):
        Trace(frame, N=2)


def test_the_model_call_share_defaults_and_round_trips(tmp_path):
    from gyre.formats.trace import DEFAULT_MODEL_CALL_SHARE, MODEL_SHARE_COLUMN

    frame = pd.DataFrame({"query_id": [0, 0], "execution_index": [0, 1], "duration_s": [10.0, 20.0],
                          "outcome": ["completed", "completed"]})
    assert (Trace(frame, N=2).model_call_share == DEFAULT_MODEL_CALL_SHARE).all()
    shared = Trace(frame.assign(**{MODEL_SHARE_COLUMN: [0.0, 1.0]}), N=2)
    loaded = load_trace(save_trace(shared, tmp_path / "t.csv"), N=2)
    np.testing.assert_array_equal(loaded.model_call_share, [[0.0, 1.0]])
