"""An execution's record row: kept as a list on the hot path, read as the dict it always was (sim/record.py).

``SimRecord.executions`` must give, key for key and in order, the row the
record used to build at each start (``start_s`` a float even at t = 0) and
the driver completed at each finish, with ``harness_end_s`` after it where a
harness stopped early; a read during a run is a copy, and after ``close``
one dict is built and kept.
"""

from __future__ import annotations

import numpy as np
import pytest

from gyre.sim.record import EXECUTION_FIELDS, SimRecord, execution_row
from gyre.sim.runner import run_simulation
from gyre.sim.traces.presets import generate_trace


@pytest.fixture(scope="module")
def result():
    """nl2repo-2.4t: some executions stop their harness before evaluation retries (harness_end_s)."""
    trace = generate_trace("nl2repo-2.4t", 60, np.random.default_rng(4))
    return run_simulation("E0", trace, steps=3, seed=0, overrides={"K": 4}, breakdown=False)


def test_rows_read_as_the_dicts_of_their_fields_in_order(result):
    record = result.record
    rows = record.executions
    assert rows and list(rows) == list(record.execution_rows)
    stopped = 0
    for x, row in rows.items():
        values = record.execution_rows[x]
        assert list(row) == list(EXECUTION_FIELDS) + (["harness_end_s"] if len(values) == 8 else [])
        assert row["execution"] == x and row["group_id"] == values[1] and row["engine"] == values[2]
        assert type(row["start_s"]) is float and row["start_s"] == values[3]
        assert (row["end_s"], row["outcome"], row["reroutes"]) == tuple(values[4:7])
        if "harness_end_s" in row:
            stopped += 1
            assert row["start_s"] <= row["harness_end_s"] and (row["end_s"] is None  # still evaluating at the end
                                                                or row["harness_end_s"] <= row["end_s"])
            assert record.slot_interval(x) == (row["start_s"], row["harness_end_s"])
        else:
            assert record.slot_interval(x) == (row["start_s"], row["end_s"])
    assert stopped > 0  # the trace's evaluation tails are exercised
    assert any(row["start_s"] == 0.0 for row in rows.values())  # started at t = 0 (an int before close)
    assert all(row["outcome"] is not None for row in rows.values() if row["end_s"] is not None)


def test_a_closed_record_builds_its_rows_once_and_an_open_one_gives_copies():
    record = SimRecord(result_cfg())
    record.execution_rows[0] = execution_row(0, 0, 1, 0)
    first = record.executions
    first[0]["engine"] = 99  # a copy: the record is unchanged
    assert record.executions is not first and record.executions[0]["engine"] == 1
    record.reroute(0, 1, 2, 5.0)
    assert record.executions[0]["engine"] == 2 and record.executions[0]["reroutes"] == 1
    assert record.executions[0]["start_s"] == 0.0 and type(record.executions[0]["start_s"]) is float
    record.close(10.0)
    closed = record.executions
    assert closed is record.executions and closed[0]["engine"] == 2


def result_cfg():
    from gyre.presets import build_preset

    return build_preset("E0")
