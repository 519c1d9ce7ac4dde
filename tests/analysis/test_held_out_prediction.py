"""Held-out prediction of recorded CPU demo runs: calibrate on one run, predict a run with another seed.

``data/cpu_demo/seed-S`` holds, for three real runs of configs/cpu_demo.toml
(seeds 0, 1 and 2, 30 steps each, made on this machine by
tools/held_out_prediction.py; docs/simulator.md section 7 gives when and at
what load), what ``gyre calibrate RUN_B --costs RUN_A/costs.toml`` reads: the
event log (``log/events.csv``, ``log/summary.json``), the trace and its
sidecar (``trace.csv``, ``trace.json``), and the costs the run's own
calibration wrote at its end (``costs.toml``). Each run is simulated on its
own trace and schedule under another run's costs, so nothing of the predicted
run is fitted: a prediction, not a replay.

Checked against the aims of docs/simulator.md section 7, over the cycle seed 1
from seed 0, seed 2 from seed 1, seed 0 from seed 2 (the median of the three
runs' figures): the median of each step's own relative wall-time error within
20 %, the same training cells in at least 80 % of steps, the total within 10 %;
and every one of the six ordered pairs predicts the total within 10 %.
The suite's live run of the demo (tests/real/runtime/test_runtime_cluster_e2e.py)
is on two Ray nodes: its costs differ from a single host's (a core transition
into training measured 0.3 s there, 3.0 s here), and predicting these runs
from them missed the per-step aim (median 37 %), so it is not the calibration
these runs are predicted from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.analysis.sim_vs_real import held_out

DATA = Path(__file__).parent / "data" / "cpu_demo"
SEEDS = sorted(int(p.name.removeprefix("seed-")) for p in DATA.glob("seed-*"))


@pytest.fixture(scope="module")
def result():
    return held_out({s: DATA / f"seed-{s}" for s in SEEDS})


def test_each_run_is_predicted_from_another_runs_costs_within_the_aims(result):
    m = result["medians"]
    assert result["cycle"] == [(s, SEEDS[i - 1]) for i, s in enumerate(SEEDS)]
    assert m["step_error_median"] <= 0.20, m
    assert m["same_cells_share"] >= 0.80, m
    assert abs(m["total_error"]) <= 0.10, m


def test_every_pair_predicts_the_total(result):
    assert len(SEEDS) >= 2 and len(result["pairs"]) == len(SEEDS) * (len(SEEDS) - 1)
    assert all(p["steps"] == 30 for p in result["pairs"])
    assert all(abs(p["total_error"]) <= 0.10 for p in result["pairs"]), result["pairs"]


def test_one_run_is_not_a_held_out_prediction():
    with pytest.raises(ValueError, match="two runs"):
        held_out({0: DATA / "seed-0"})
