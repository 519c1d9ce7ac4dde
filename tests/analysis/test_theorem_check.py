"""The Theorem A.1 check on a small grid, its report and the ``gyre theorem`` command."""

from __future__ import annotations

import argparse
import json

import pytest

from gyre.analysis import theorem, theorem_cli
from gyre.paper_figs import cli as figs_cli
from gyre.analysis.theorem import SMALL_GRID, TheoremReport, run_theorem, scaled_shape
from gyre.analysis.theorem_report import format_report, report_json


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gyre")
    sub = parser.add_subparsers()
    theorem_cli.register(sub)
    figs_cli.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def report() -> TheoremReport:
    return run_theorem(SMALL_GRID)


def test_small_grid_passes(report):
    assert report.passed, format_report(report)
    assert report.max_abs_error("error") <= SMALL_GRID.tolerance
    assert report.max_abs_error("continuous_error") <= SMALL_GRID.tolerance
    grid_rows = report.frame("grid")
    assert len(grid_rows) == 9 and len(report.frame("named")) == 2
    # continuous dispatch is mu versions staler than boundary dispatch
    assert (grid_rows["difference"] - grid_rows["mu"]).abs().max() <= 2 * SMALL_GRID.tolerance
    # the identity leaves the tail free: somewhere the maximum exceeds the mean by more than 1
    assert (grid_rows["max"] - grid_rows["measured"]).max() > 1


def test_report_names_the_special_cases_and_the_tolerance(report):
    text = format_report(report)
    for needle in ("Colocate (phi=0)", "Async (mu=1)", "colocate-1", "async-1", "tolerance", "PASS",
                   f"{SMALL_GRID.steps} steps", "tok-wtd", "p99", "max |error|, continuous"):
        assert needle in text
    data = report_json(report)
    json.dumps(data)
    assert data["passed"] is True and data["tolerance"] == SMALL_GRID.tolerance
    assert abs(sum(data["rows"][0]["distribution"].values()) - 1) < 1e-9


def test_a_missed_prediction_fails(report):
    broken = TheoremReport(report.grid, [dict(report.rows[0], error=0.5)] + report.rows[1:], 1.0)
    assert not broken.passed
    assert "FAIL: 1 row(s)" in format_report(broken)


def test_cli_small_grid_writes_json(tmp_path, capsys):
    out = tmp_path / "theorem.json"
    code = run_cli(["theorem", "--small", "--jobs", "1", "--phis", "0,0.5", "--mus", "1,3", "--json", str(out)])
    assert code == 0
    assert "PASS" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 4 + 2 and data["grid"]["phis"] == [0.0, 0.5]


def test_cli_exit_status_is_one_when_a_row_misses(monkeypatch, capsys):
    real = theorem.run_point
    monkeypatch.setattr(theorem, "run_point", lambda point: {**real(point), "error": 1.0})
    assert run_cli(["theorem", "--small", "--jobs", "1", "--phis", "0", "--mus", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "7x4"], "multiple of 8"),
    (["--shapes", "8-4"], "not BxN"),
    (["--traces", "nope"], "unknown trace preset"),
    (["--phis", "0.3"], "phi * B"),
    (["--steps", "4"], "no steady-state burst"),
])
def test_cli_bad_input_exits_2(argv, message, capsys):
    assert run_cli(["theorem", "--small", "--jobs", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_scaled_shape_keeps_the_paper_geometry():
    shape = scaled_shape(32, 16)
    assert (shape.nodes, shape.nodes_per_cell, shape.per_node_capacity) == (32, 4, 36)
    small = scaled_shape(8, 4)
    assert (small.nodes, small.nodes_per_cell, small.per_node_capacity) == (8, 1, 9)
