"""The derived training cost against every training mechanism the paper states, together (docs/simulator.md s. 4).

The training cost is derived (trained tokens x 6 x active parameters over
the training nodes' throughput at a stated utilisation), not fitted to one
figure, so it must reproduce each stated mechanism at once on the default
trace (12 steps, seed 0):

- training follows trained tokens: J_max = 1 keeps ~41.4 % of them, 5 ~74.8 %;
- in E0 rollout masks training: little of each burst's training is exposed
  on the critical path, and rollout delivers with a positive margin;
- on a static split, training idles waiting for data (most of its time);
- a multi-step burst on a fixed rollout pool is not supplied in time;
- Colocate waits for every in-flight execution: training sits exposed;
- a larger separate rollout pool leaves fewer training nodes, so a longer
  training phase per burst;
- with fine cells, training starts from a subset of cells and then expands.
"""

from __future__ import annotations

import numpy as np
import pytest

from gyre.sim.runner import run_simulation
from gyre.sim.sizes import trained_tokens
from gyre.sim.traces.presets import default_trace

PRESETS = ("E0", "A0", "A2", "C0", "C2", "C3")


@pytest.fixture(scope="module")
def runs():
    return {p: run_simulation(p, steps=12, seed=0) for p in PRESETS}


def _exposure(result, key):
    return result.summary["training_exposure"][key]


def test_training_follows_the_trained_tokens():
    trace = default_trace()
    whole = trained_tokens(trace, 10_000).sum()
    assert trained_tokens(trace, 1).sum() / whole == pytest.approx(0.414, abs=0.03)
    assert trained_tokens(trace, 5).sum() / whole == pytest.approx(0.748, abs=0.03)


def test_rollout_masks_training_in_e0_with_a_margin(runs):
    bursts = runs["E0"].summary["training_exposure"]["per_burst"]
    steady = bursts[1:]  # the first burst starts from an empty pipeline
    assert all(b["exposed_s"] < 0.25 * b["train_s"] for b in steady)
    assert all(b["margin_s"] > 0 for b in steady)
    assert runs["E0"].summary["time_breakdown_hours"]["training_exposed"] == 0.0


def test_a_static_split_idles_its_training_nodes_waiting_for_data(runs):
    assert runs["A0"].summary["slack"] > 0.5 > runs["E0"].summary["slack"]
    assert _exposure(runs["A0"], "margin_share_mean") > 1.0  # a batch takes far longer to arrive than to train


def test_a_multi_step_burst_on_a_fixed_rollout_pool_is_not_supplied_in_time(runs):
    assert runs["A2"].summary["total_hours"] > 1.05 * runs["A0"].summary["total_hours"]


def test_colocate_waits_for_every_execution_and_exposes_training(runs):
    c0 = runs["C0"].summary
    assert c0["time_breakdown_hours"]["training_exposed"] > 0.5
    assert c0["total_hours"] > 1.1 * runs["E0"].summary["total_hours"]


def test_a_larger_separate_pool_leaves_a_longer_training_phase(runs):
    def train_s(p):
        return np.mean([b["train_s"] for b in runs[p].summary["training_exposure"]["per_burst"][1:]])
    assert train_s("C3") > 1.5 * train_s("C2")


def test_fine_cells_start_training_from_a_subset_and_expand(runs):
    record = runs["E0"].record
    expanded = 0
    for step in record.step_rows():
        at_start = sum(1 for r in record.roles
                       if r["role"] == "training" and r["start_s"] <= step["start_s"] < r["end_s"])
        expanded += at_start < step["training_cells_max"]
    assert expanded >= 3
