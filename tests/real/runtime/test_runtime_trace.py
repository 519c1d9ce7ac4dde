"""Real-run results written as simulator traces: round trip, replay, and rejection of bad input.

The results are built by hand the way a real run reports them (wall-clock
start/end, outcomes, counts from ``ModelCall`` records); the trace is read
back with the simulator's own ``load_trace`` and replayed by
``run_simulation`` on a small cluster.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.real.runtime.trace import (
    CANCELLED,
    ExecutionResult,
    call_wall_s,
    counts_from_calls,
    trace_from_results,
    write_trace,
)
from gyre.sim.runner import run_simulation
from gyre.formats.trace import TraceError, load_trace
from gyre.trajectory.records import ModelCall

N = 3


def _call(n_in: int, n_out: int, k: int) -> ModelCall:
    return ModelCall(execution_id="e", request_id=f"r{k}", input_ids=np.arange(n_in), output_ids=np.arange(n_out),
                     output_logprobs=np.full(n_out, -0.5), policy_version=0)


def _results(queries: int = 4) -> list[ExecutionResult]:
    outcomes = ["completed", "harness_timeout", "failed", "overall_timeout"]
    results = []
    for q in range(queries):
        for i in range(N + 1):  # one oversampled execution per query; the slowest is cancelled
            start = 100.0 + q
            counts = counts_from_calls([_call(20 + i, 5 + q, 0), _call(40 + i, 7, 1)])
            outcome = CANCELLED if i == N else outcomes[(q + i) % 4]
            results.append(ExecutionResult(query_id=q, execution_index=i, start_s=start, end_s=start + 30 + 10 * i,
                                           outcome=outcome, **counts))
    return results


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip_drops_cancelled_surplus(tmp_path, suffix):
    path = write_trace(_results(), tmp_path / f"run{suffix}", N=N)
    trace = load_trace(path, N=N)
    assert trace.queries == 4 and trace.N == N
    assert (trace.outcomes != CANCELLED).all()
    np.testing.assert_allclose(trace.durations_s, np.tile([30.0, 40.0, 50.0], (4, 1)))
    np.testing.assert_array_equal(trace.column("call_count"), 2)
    np.testing.assert_array_equal(trace.column("input_tokens")[0], [60, 62, 64])
    np.testing.assert_array_equal(trace.column("output_tokens")[:, 0], [12, 13, 14, 15])
    assert trace.outcomes[1, 0] == "harness_timeout"


def test_real_run_trace_replays_in_simulator(tmp_path):
    path = write_trace(_results(queries=6), tmp_path / "run.csv", N=N)
    result = run_simulation("E0", load_trace(path, N=N), steps=1, overrides={"K": 2, "C_e": 8, "N": N, "B": 2})
    assert result.summary["steps"] == 1 and result.summary["total_hours"] > 0


def test_counts_are_optional_but_all_or_none():
    bare = [ExecutionResult(query_id="q", execution_index=i, start_s=0.0, end_s=1.0, outcome="completed")
            for i in range(2)]
    assert trace_from_results(bare).column("input_tokens") is None
    mixed = [bare[0], ExecutionResult(query_id="q", execution_index=1, start_s=0.0, end_s=1.0,
                                      outcome="completed", input_tokens=3)]
    with pytest.raises(TraceError, match=r"execution_index=0\).*no input_tokens"):
        trace_from_results(mixed)


@pytest.mark.parametrize("change, match", [
    ({"outcome": "timeout"}, r"query_id=2, execution_index=1\): unknown outcome 'timeout'"),
    ({"end_s": 90.0}, r"query_id=2, execution_index=1\): negative duration"),
    ({"end_s": float("nan")}, r"execution_index=1\): .*must be finite"),
    ({"output_tokens": -1}, r"execution_index=1\): output_tokens=-1"),
    ({"execution_index": -1}, r"execution_index=-1\): execution_index must be"),
])
def test_bad_result_names_the_execution(tmp_path, change, match):
    results = _results()
    fields = {**results[9].__dict__, **change}
    results[9] = ExecutionResult(**fields)
    with pytest.raises(TraceError, match=match):
        write_trace(results, tmp_path / "bad.csv", N=N)
    assert not (tmp_path / "bad.csv").exists()


def test_group_short_of_n_after_dropping_is_rejected():
    results = [r for r in _results() if not (r.query_id == 1 and r.execution_index == 0)]
    with pytest.raises(TraceError, match=r"query 1 has 2 executions, expected N=3"):
        trace_from_results(results, N=N)


def test_evaluation_retries_are_written_as_harness_stops(tmp_path):
    """An execution whose evaluation went into retries has harness_s < duration_s; the others harness_s = duration_s."""
    results = [ExecutionResult(query_id=0, execution_index=0, start_s=10.0, end_s=110.0, outcome="completed",
                               harness_end_s=40.0),
               ExecutionResult(query_id=0, execution_index=1, start_s=10.0, end_s=60.0, outcome="completed"),
               ExecutionResult(query_id=0, execution_index=2, start_s=12.0, end_s=70.0, outcome="completed")]
    trace = load_trace(write_trace(results, tmp_path / "t.csv", N=N))
    assert trace.durations_s[0].tolist() == [100.0, 50.0, 58.0]
    assert trace.harness_s[0].tolist() == [30.0, 50.0, 58.0]
    plain = trace_from_results(results[1:] + [ExecutionResult(query_id=0, execution_index=0, start_s=0.0, end_s=1.0,
                                                               outcome="completed")], N=N)
    assert "harness_s" not in plain.frame.columns  # no retries: the column is left out, as before


@pytest.mark.parametrize("stop", [9.0, 111.0, float("nan"), float("inf")])
def test_a_harness_stop_outside_the_execution_is_named(stop):
    bad = ExecutionResult(query_id=7, execution_index=0, start_s=10.0, end_s=110.0, outcome="completed",
                          harness_end_s=stop)
    with pytest.raises(TraceError, match=r"query_id=7.*harness_end_s"):
        trace_from_results([bad])


def _timed_call(k: int, start: float, end: float) -> ModelCall:
    return ModelCall(execution_id="e", request_id=f"r{k}", input_ids=np.arange(4), output_ids=np.arange(2),
                     output_logprobs=np.full(2, -0.5), policy_version=0, started_at=start, finished_at=end)


def test_the_model_call_share_is_the_calls_wall_time_over_the_harness_time(tmp_path):
    # calls 10-14 and 12-20 overlap (a subagent's call inside the main one): 10 s of calls, counted once;
    # plus 30-35: 15 s of a 60 s harness (its evaluation retries after 60 s are not the harness's)
    calls = [_timed_call(0, 10.0, 14.0), _timed_call(1, 12.0, 20.0), _timed_call(2, 30.0, 35.0)]
    counts = counts_from_calls(calls)
    assert counts["model_call_s"] == pytest.approx(15.0)
    results = [ExecutionResult(query_id=0, execution_index=i, start_s=0.0, end_s=90.0, harness_end_s=60.0,
                               outcome="harness_timeout", **counts) for i in range(N)]
    trace = load_trace(write_trace(results, tmp_path / "run.csv", N=N), N=N)
    np.testing.assert_allclose(trace.model_call_share, 0.25)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=12))
def test_call_wall_time_is_the_length_of_the_union_of_the_calls(spans):
    intervals = [(float(a), float(a + w)) for a, w in spans]
    covered = {t for a, b in intervals for t in range(int(a), int(b))}  # unit cells inside some call
    assert call_wall_s(intervals) == pytest.approx(len(covered))


def test_a_bad_model_call_time_is_named():
    bad = ExecutionResult(query_id="q", execution_index=0, start_s=0.0, end_s=1.0, outcome="completed",
                          model_call_s=float("nan"))
    with pytest.raises(TraceError, match=r"query_id='q'.*model_call_s"):
        trace_from_results([bad], N=1)
