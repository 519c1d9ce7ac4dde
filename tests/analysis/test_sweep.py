"""Sweeps (gyre.sim.sweep, gyre sweep): axes, order, parallel equals serial, refused points, the maps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gyre.analysis.sweep import heatmap_grid, sweep_means
from gyre.cli import main as gyre_main
from gyre.config import ConfigError
from gyre.sim.sweep import parse_sweep, points, run_sweep


def test_axes_are_typed_like_set_and_ranges_are_inclusive():
    axes = parse_sweep(["phi=0,0.5", "mu=1..3", "streaming=on,off"])
    assert axes == {"phi": [0.0, 0.5], "mu": [1, 2, 3], "streaming": [True, False]}
    assert points(axes)[:2] == [{"phi": 0.0, "mu": 1, "streaming": True}, {"phi": 0.0, "mu": 1, "streaming": False}]
    assert len(points(axes)) == 12


@pytest.mark.parametrize("spec, message", [
    (["phi"], "is not key=v1,v2"), (["mu=3..x"], "two integers"), (["mu=4..2"], "empty range"),
    (["warp=1"], "unknown field 'warp'"), (["mu=1", "mu=2"], "given twice"), (["mu=a"], "cannot parse"),
])
def test_a_bad_axis_is_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep(spec)


def test_parallel_rows_equal_serial_rows_and_a_refused_point_is_a_row():
    axes = parse_sweep(["phi=0,0.3", "mu=1,2"])  # phi = 0.3 with B = 32 is not a whole number of groups
    serial = run_sweep(axes, steps=2, seeds=2, jobs=1)
    parallel = run_sweep(axes, steps=2, seeds=2, jobs=2)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]
    assert strip(serial) == strip(parallel)
    assert [(r["phi"], r["mu"], r["seed"]) for r in serial] == [
        (phi, mu, seed) for phi in (0.0, 0.3) for mu in (1, 2) for seed in (0, 1)]
    refused = [r for r in serial if r["error"]]
    assert {r["phi"] for r in refused} == {0.3} and all("whole number" in r["error"] for r in refused)
    assert all(r["total_hours"] > 0 for r in serial if not r["error"])


def test_means_skip_refused_rows_and_the_grid_holds_them():
    rows = pd.DataFrame([
        {"phi": 0.0, "mu": 1, "seed": 0, "total_hours": 2.0, "staleness_steady_mean": 0.0, "error": None},
        {"phi": 0.0, "mu": 1, "seed": 1, "total_hours": 4.0, "staleness_steady_mean": 0.0, "error": None},
        {"phi": 0.5, "mu": 1, "seed": 0, "total_hours": None, "staleness_steady_mean": None, "error": "refused"},
        {"phi": 0.5, "mu": 2, "seed": 0, "total_hours": 1.0, "staleness_steady_mean": 1.0, "error": None},
    ])
    means = sweep_means(rows, ["phi", "mu"])
    assert means.set_index(["phi", "mu"]).loc[(0.0, 1), "total_hours"] == 3.0
    xs, ys, grid = heatmap_grid(means, ["phi", "mu"], "total_hours")
    assert (xs, ys) == ([0.0, 0.5], [1, 2])
    assert grid[0, 0] == 3.0 and np.isnan(grid[0, 1]) and np.isnan(grid[1, 0]) and grid[1, 1] == 1.0


def test_the_command_writes_the_table_and_the_steady_staleness_map_is_the_identity(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert gyre_main(["sweep", "--sweep", "phi=0,1", "--sweep", "mu=1,2", "--steps", "16", "--out", str(out)]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 4 and table["error"].isna().all()
    assert np.allclose(table.staleness_steady_mean, table.phi + (table.mu - 1) / 2, atol=0.05)
    assert (out / "sweep.png").stat().st_size > 0
    assert gyre_main(["sweep", "--sweep", "mu=x", "--out", str(out)]) == 2
    assert "gyre sweep: error" in capsys.readouterr().err


def test_a_sweep_row_reports_what_the_full_run_reports():
    """Sweeps skip the wall-clock breakdown for speed; the figures they keep, the slack included, are unchanged."""
    from gyre.sim.runner import run_simulation

    point = {"phi": 1.0, "mu": 2, "K": 4}
    row = run_sweep({k: [v] for k, v in point.items()}, steps=3, jobs=1)[0]
    full = run_simulation("E0", "nl2repo-122b", steps=3, overrides=point).summary
    lean = run_simulation("E0", "nl2repo-122b", steps=3, overrides=point, breakdown=False).summary
    assert full["slack"] is not None and row["slack"] == full["slack"] == lean["slack"]
    assert (row["total_hours"], row["staleness_mean"], row["events"]) == \
           (full["total_hours"], full["staleness_mean"], full["events"])
    assert "time_breakdown_hours" in full and "time_breakdown_hours" not in lean


def test_warming_the_caches_leaves_a_run_of_that_schedule_nothing_to_build():
    """What a sweep's parent builds before its workers fork: a run of the schedule then only reads caches."""
    from gyre.sim.deadlines import execution_plan
    from gyre.sim.driver import trace_lists
    from gyre.sim.runner import _preset_trace, run_simulation, warm_caches

    point = {"phi": 1.5, "K": 5}
    warm_caches("E0", "deepswe", steps=2, seed=7, overrides=point)
    caches = (_preset_trace, trace_lists, execution_plan)
    misses = [cache.cache_info().misses for cache in caches]
    run_simulation("E0", "deepswe", steps=2, seed=7, overrides=point, breakdown=False)
    assert [cache.cache_info().misses for cache in caches] == misses
