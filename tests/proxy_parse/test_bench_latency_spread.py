"""``bench proxy``'s run-to-run spread of the one-client latency (``GYRE_BENCH_LATENCY_RUNS``): one run's
figures pass through unchanged; several give each figure's median, the added p50's lowest and highest,
and how many runs met the goal (added p50 under 1 ms)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.bench_proxy import _latency_runs, latency_spread

NAMES = ("direct_p50_ms", "added_p50_ms", "added_p99_ms", "latency_cpu_ms_per_call")
run = st.fixed_dictionaries({name: st.floats(0.0, 5.0) for name in NAMES})


@given(st.lists(run, min_size=1, max_size=9))
def test_the_spread_is_the_runs_medians_extremes_and_the_count_that_met_the_goal(runs):
    spread = latency_spread([dict(r) for r in runs])
    if len(runs) == 1:
        assert spread == runs[0]
        return
    added = [r["added_p50_ms"] for r in runs]
    for name in NAMES:
        assert spread[name] == float(np.median([r[name] for r in runs]))
    assert (spread["added_p50_ms_min"], spread["added_p50_ms_max"]) == (min(added), max(added))
    assert spread["latency_runs"] == len(runs)
    assert spread["latency_runs_met"] == sum(a < 1 for a in added)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_a_run_count_that_is_not_a_positive_whole_number_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("GYRE_BENCH_LATENCY_RUNS", value)
    with pytest.raises(SystemExit, match="GYRE_BENCH_LATENCY_RUNS"):
        _latency_runs()


def test_the_run_count_defaults_to_one(monkeypatch):
    monkeypatch.delenv("GYRE_BENCH_LATENCY_RUNS", raising=False)
    assert _latency_runs() == 1
    monkeypatch.setenv("GYRE_BENCH_LATENCY_RUNS", "5")
    assert _latency_runs() == 5
