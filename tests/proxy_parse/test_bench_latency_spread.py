"""``bench proxy``'s run-to-run spread of the one-client latency (``GYRE_BENCH_LATENCY_RUNS``): one run's
figures pass through unchanged; several give each figure's median, the added p50's lowest and highest,
and how many runs met the goal (added p50 under 1 ms)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.bench_proxy import _latency_runs, latency_figures, latency_spread, memory_folder

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


seconds = st.lists(st.floats(1e-4, 5e-3), min_size=1, max_size=40)


@given(st.data())
def test_a_second_proxy_on_memory_gives_its_added_p50_and_the_paired_cost_of_the_sync(data):
    direct = data.draw(seconds)
    rounds = len(direct)
    disk = data.draw(st.lists(st.floats(1e-4, 5e-3), min_size=rounds, max_size=rounds))
    memory = data.draw(st.lists(st.floats(1e-4, 5e-3), min_size=rounds, max_size=rounds))
    figures = latency_figures(direct, {"disk": disk, "memory": memory})
    direct_p50 = np.percentile(np.array(direct) * 1e3, 50)
    assert figures["added_p50_ms"] == pytest.approx(np.percentile(np.array(disk) * 1e3, 50) - direct_p50)
    assert figures["memory_added_p50_ms"] == pytest.approx(np.percentile(np.array(memory) * 1e3, 50) - direct_p50)
    # paired: each round's difference, then the median (not the difference of the two medians)
    assert figures["sync_paired_ms"] == pytest.approx(np.median((np.array(disk) - np.array(memory)) * 1e3))
    alone = latency_figures(direct, {"disk": disk})
    assert "sync_paired_ms" not in alone and "memory_added_p50_ms" not in alone
    assert alone["added_p50_ms"] == figures["added_p50_ms"]


def test_the_paired_cost_is_not_the_difference_of_the_medians():
    # the same times in other rounds: equal medians, but round by round the first proxy is mostly slower
    figures = latency_figures([0.001] * 3, {"disk": [0.001, 0.002, 0.003], "memory": [0.003, 0.001, 0.002]})
    assert figures["added_p50_ms"] == pytest.approx(figures["memory_added_p50_ms"])
    assert figures["sync_paired_ms"] == pytest.approx(1.0)


@pytest.mark.parametrize(("kind", "found"), [("tmpfs", True), ("ramfs", True), ("ext4", False), (None, False)])
def test_the_memory_folder_is_dev_shm_only_where_a_memory_file_system_is_mounted_there(kind, found):
    mounts = "/dev/vda / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n"
    if kind is not None:
        mounts += f"shm /dev/shm {kind} rw,nosuid,nodev 0 0\n"
    assert (memory_folder(mounts) is not None) is found
    if found:
        assert str(memory_folder(mounts)) == "/dev/shm"
