"""Cost files (``gyre sim --costs FILE``): every key checked, every error names the file and the key."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.cli import main
from gyre.sim.cost_file import load_cost_file
from gyre.sim.costs import CostError, CostModel
from hypothesis_budget import examples


def test_a_cost_file_sets_the_fields_it_names(tmp_path):
    path = tmp_path / "costs.toml"
    path.write_text("[costs]\nto_training_s = 1.5\nmicro_step_tokens = 3\npublish_s = 2\n")
    fields = load_cost_file(path)
    assert fields == {"to_training_s": 1.5, "micro_step_tokens": 3, "publish_s": 2.0}
    assert CostModel(**fields).to_training_s == 1.5


def test_satellite_transition_costs_default_to_the_core_units():
    shared = CostModel(to_training_s=3.0, to_rollout_s=2.0)
    assert shared.transition_s("training", satellite=True) == 3.0
    assert shared.transition_s("rollout", satellite=True) == 2.0
    split = CostModel(to_training_s=3.0, to_rollout_s=2.0, satellite_to_training_s=0.5, satellite_to_rollout_s=0.25)
    assert (split.transition_s("training", satellite=False), split.transition_s("rollout", satellite=False)) == (3.0, 2.0)
    assert (split.transition_s("training", satellite=True), split.transition_s("rollout", satellite=True)) == (0.5, 0.25)


def test_a_cost_file_may_set_the_satellites_transitions(tmp_path):
    path = tmp_path / "costs.toml"
    path.write_text("[costs]\nsatellite_to_training_s = 0.5\n")
    assert CostModel(**load_cost_file(path)).transition_s("training", satellite=True) == 0.5


@pytest.mark.parametrize("text, words", [
    ("[costs]\nsatellite_to_rollout_s = -0.5\n", ["satellite_to_rollout_s"]),
    ("[costs]\nwarp_s = 1\n", ["warp_s"]),
    ("[costs]\nto_training_s = -1\n", ["to_training_s"]),
    ("[costs]\nto_training_s = \"fast\"\n", ["to_training_s", "number"]),
    ("[costs]\nto_training_s = true\n", ["to_training_s", "number"]),
    ("[costs]\nmicro_step_tokens = 2.5\n", ["micro_step_tokens"]),
    ("[costs]\nmicro_steps_per_group = 4\n", ["micro_steps_per_group was removed", "micro_step_tokens"]),
    ("to_training_s = 1\n", ["no [costs] table"]),
    ("[costs\n", ["costs.toml"]),
])
def test_a_bad_cost_file_is_an_error_naming_file_and_key(tmp_path, text, words):
    path = tmp_path / "costs.toml"
    path.write_text(text)
    with pytest.raises(CostError) as info:
        load_cost_file(path)
    assert str(path) in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_a_missing_cost_file_is_an_error(tmp_path):
    with pytest.raises(CostError, match="not found"):
        load_cost_file(tmp_path / "nothing.toml")


@given(st.text(alphabet=string.printable, max_size=200))
@settings(max_examples=examples(60), deadline=None)
def test_any_file_either_loads_or_raises_cost_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("c") / "costs.toml"
    path.write_text(text)
    try:
        fields = load_cost_file(path)
    except CostError:
        return
    CostModel(**fields)


def test_gyre_sim_reads_costs_and_overrides_win(tmp_path, capsys):
    path = tmp_path / "costs.toml"
    path.write_text("[costs]\npublish_s = 1234.0\n")
    assert main(["sim", "--steps", "2", "--costs", str(path), "--out", str(tmp_path / "a")]) == 0
    path.write_text("[costs]\nwarp_s = 1\n")
    assert main(["sim", "--steps", "2", "--costs", str(path)]) == 2
    assert "warp_s" in capsys.readouterr().err
