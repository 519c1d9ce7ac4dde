"""Grids over trace seeds (gyre.sim.seeds): mean and spread per figure, orderings that hold on every seed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.cli import main as gyre_main
from gyre.sim.seeds import orderings, spread_row


@given(st.dictionaries(st.sampled_from("ABCD"), st.lists(st.floats(0, 100), min_size=3, max_size=3),
                       min_size=2))
def test_a_pair_is_settled_exactly_when_one_side_is_faster_on_every_seed(hours):
    settled, unsettled = orderings(hours)
    names = sorted(hours)
    assert len(settled) + len(unsettled) == len(names) * (len(names) - 1) // 2
    for text in settled:
        a, b = text.split(" < ")
        assert all(x < y for x, y in zip(hours[a], hours[b]))
    for text in unsettled:
        a, b = text.split(" ~ ")
        assert not all(x < y for x, y in zip(hours[a], hours[b]))
        assert not all(y < x for x, y in zip(hours[a], hours[b]))


def test_spread_is_the_sample_deviation_between_min_and_max():
    s = spread_row([1.0, 2.0, 3.0, None])
    assert s == {"mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0}
    assert spread_row([4.0])["sd"] == 0.0 and spread_row([None])["mean"] is None


def test_the_methods_grid_over_seeds_reports_spreads_and_orderings(tmp_path, capsys):
    assert gyre_main(["sim", "--grid", "methods", "--trace", "terminalbench", "--steps", "2", "--seeds", "2",
                      "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gyre_hours_sd" in out and "holding on every one of 2 seed(s)" in out
    text = (tmp_path / "methods_seeds.csv").read_text()
    assert text.count("\n") == 3  # header + E[d] 1 and 1.5
    assert (tmp_path / "seed1" / "terminalbench" / "gyre-1" / "summary.json").exists()


@pytest.mark.slow
def test_the_ablation_grid_over_seeds_writes_its_orderings(tmp_path):
    assert gyre_main(["sim", "--grid", "ablation", "--steps", "2", "--seeds", "2", "--out", str(tmp_path)]) == 0
    assert "holds_on_every_seed" in (tmp_path / "orderings.csv").read_text()
    assert "total_hours_sd" in (tmp_path / "ablation_seeds.csv").read_text()
