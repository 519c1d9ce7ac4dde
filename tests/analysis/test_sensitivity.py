"""Sensitivity (analysis/sensitivity.py): one constant at a time, rankings from the same runs, the tornado."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gyre.analysis.sensitivity import FOCAL, SCHEDULER_RANGES, draw, ranges, run_sensitivity, variations
from gyre.cli import main as gyre_main
from gyre.presets import build_preset
from gyre.sim.costs import CostModel


def test_every_constant_but_the_distorting_one_is_varied_over_its_stated_range():
    table = ranges()
    assert "slowdown_per_load" not in table and table["publish_s"] == (15.0, 60.0)
    assert table["micro_step_tokens"] == (2048, 4_194_304) and table["evaluation_s"] == (0.0, 600.0)
    assert table["rho_min"] == (0.25, 0.75) and table["tau"] == (0.0, 120.0)  # the paper gives neither
    assert table["train_utilisation"] == (0.15, 0.40)  # the derivation's range (gyre.sim.costs)
    for name, (low, high) in table.items():
        if name in SCHEDULER_RANGES:
            build_preset("E0", **{name: low}), build_preset("E0", **{name: high})  # valid schedules only
        else:
            CostModel(**{name: low}), CostModel(**{name: high})  # valid values only
        assert low < high, name
    rows = variations(["publish_s"])
    assert rows == [("default", "default", None), ("publish_s", "low", 15.0), ("publish_s", "high", 60.0)]
    with pytest.raises(ValueError, match="unknown cost constant"):
        variations(["warp_s"])


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return run_sensitivity(["C0", "E0"], steps=3, only=["active_params_b", "publish_s"], jobs=2)


def test_a_scheduler_constant_is_varied_through_the_schedule():
    from gyre.analysis.sensitivity import _run

    low, high = (_run(("E0", "nl2repo-122b", 3, "tau", v)) for v in SCHEDULER_RANGES["tau"])
    assert low != high  # the supply timer moves when cells switch


def test_rankings_and_ratios_come_from_the_runs_shown(table):
    assert list(table.side) == ["default", "low", "high", "low", "high"]
    assert np.allclose(table[f"E0_vs_{FOCAL}"], 1.0)
    assert np.allclose(table[f"C0_vs_{FOCAL}"], table["C0_h"] / table["E0_h"])
    expected_rank = np.where(table["E0_h"] <= table["C0_h"], 1, 2)
    assert list(table[f"{FOCAL}_rank"]) == list(expected_rank)
    assert list(table["ranking"]) == ["E0 < C0" if r == 1 else "C0 < E0" for r in expected_rank]
    assert np.allclose(table[f"{FOCAL}_speedup_over_best_other"], table["C0_h"] / table["E0_h"])
    # slower training hurts the colocated block (training on its critical path) more than E0
    training = table[table.constant == "active_params_b"].set_index("side")  # more FLOPs per trained token
    # in hours: with load-dependent engines (processor sharing) E0's tail speed-up shrinks as more cells
    # train, so the ratio C0/E0 need not grow at 3 steps; the extra hours still fall harder on C0
    assert (training.loc["high", "C0_h"] - training.loc["low", "C0_h"]
            > training.loc["high", "E0_h"] - training.loc["low", "E0_h"])


def test_the_tornado_draws_one_bar_per_side_and_constant(table):
    fig = draw(table)
    bars = fig.axes[0].patches
    assert len(bars) == 4
    base = float(table.loc[0, f"{FOCAL}_speedup_over_best_other"])
    widths = sorted(round(b.get_width(), 9) for b in bars)
    expected = sorted(round(v - base, 9) for v in table.loc[1:, f"{FOCAL}_speedup_over_best_other"])
    assert widths == expected


def test_the_command_needs_the_focal_preset(tmp_path, capsys):
    assert gyre_main(["sensitivity", "--presets", "A0,C0", "--only", "publish_s", "--steps", "1",
                      "--out", str(tmp_path)]) == 2
    assert "must include the focal preset E0" in capsys.readouterr().err
