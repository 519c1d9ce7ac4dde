"""Trajectory token splits: the trace column, its validation, the generator's model and the J_max shares."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gyre.formats.trace import Trace, TraceError, load_trace, save_trace
from gyre.sim.traces.model import draw_variates, realize_counts, realize_durations
from gyre.sim.traces.presets import PRESETS, generate_trace
from gyre.sim.traces.stats import trace_stats
from gyre.sim.traces.trajectories import (SPEC51_KEPT_SHARE, TrajectoryModel, fit_trajectory_model, kept_shares,
                                          realize_trajectories)


def frame(cells: list[object]) -> pd.DataFrame:
    n = len(cells)
    return pd.DataFrame({"query_id": np.zeros(n, int), "execution_index": np.arange(n),
                         "duration_s": np.ones(n), "outcome": ["completed"] * n, "trajectory_tokens": cells})


def test_kept_tokens_sum_the_first_j_max_trajectories():
    trace = Trace(frame(["[5,3,2]", "[7]", "[ 1, 1 ]"]))
    assert trace.kept_tokens(1).tolist() == [[5, 7, 1]]
    assert trace.kept_tokens(2).tolist() == [[8, 7, 2]]
    assert trace.kept_tokens(9).tolist() == [[10, 7, 2]]
    with pytest.raises(ValueError, match="j_max"):
        trace.kept_tokens(0)


@pytest.mark.parametrize("cell, problem", [("[]", "non-empty"), ("[1,-2]", "integers >= 0"), ("[1.5]", "integers"),
                                           ("7", "non-empty JSON list"), ("[1,", "not a JSON list"),
                                           ("[true]", "integers")])
def test_a_bad_trajectory_cell_names_its_row_and_column(cell, problem):
    with pytest.raises(TraceError, match=rf"row 2, column 'trajectory_tokens'.*{problem}"):
        Trace(frame(["[1,2]", cell]))


def test_the_column_survives_csv_and_parquet_and_old_traces_load_without_it(tmp_path):
    trace = generate_trace("deepswe", 30, np.random.default_rng(3))
    for suffix in (".csv", ".parquet"):
        again = load_trace(save_trace(trace, tmp_path / f"t{suffix}"))
        assert again.equals(trace) and (again.kept_tokens(2) == trace.kept_tokens(2)).all()
    old = trace.frame.drop(columns=["trajectory_tokens"])
    assert Trace(old).kept_tokens(5) is None and Trace(old).trajectory_sizes() is None


def test_generated_sizes_sum_to_the_tokens_in_admission_order_and_are_seeded():
    trace = generate_trace("nl2repo-122b", 200, np.random.default_rng(9))
    flat, counts = trace.trajectory_sizes()
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    tokens = (trace.column("input_tokens") + trace.column("output_tokens")).ravel()
    assert (np.add.reduceat(flat, starts) == tokens).all() and (counts >= 1).all()
    assert (trace.kept_tokens(int(counts.max())).ravel() == tokens).all()
    assert (np.diff(np.stack([trace.kept_tokens(j) for j in (1, 2, 5, 10)]), axis=0) >= 0).all()
    parsed = Trace(trace.frame, N=16)  # the pre-parsed fast path and the JSON column say the same
    assert (parsed.kept_tokens(3) == trace.kept_tokens(3)).all()
    again = generate_trace("nl2repo-122b", 200, np.random.default_rng(9))
    assert again.equals(trace)


def test_pre_parsed_trajectories_must_match_the_frame():
    cells = ["[5,3]", "[7]"]
    with pytest.raises(ValueError, match="trajectories must be"):
        Trace(frame(cells), trajectories=(np.array([5, 3, 7]), np.array([1, 2, 1])))


def test_the_main_trajectory_comes_first_and_the_others_in_size_biased_order():
    rng = np.random.default_rng(0)
    model = TrajectoryModel(calls_per_branch=10.0, branch_weight=0.3, branch_log_sd=1.0)
    split = realize_trajectories(model, rng, np.full(20_000, 100), np.full(20_000, 1_000_000))
    rank = np.arange(split.sizes.size) - np.repeat(split.starts, split.counts)
    # larger branches are drawn earlier on average: mean size falls with the rank after the main one
    means = [split.sizes[(rank == r) & np.repeat(split.counts > 6, split.counts)].mean() for r in range(1, 6)]
    assert all(a > b for a, b in zip(means, means[1:]))
    assert split.counts.mean() == pytest.approx(11.0, rel=0.02)  # 1 + Poisson(100 / 10)


def test_the_122b_preset_keeps_the_spec51_shares_under_the_cap():
    # every preset's shares are calibration targets too (test_trace_presets, 10,000 queries)
    assert all(p.targets["jmax1_token_share"] == SPEC51_KEPT_SHARE[1] for p in PRESETS.values())
    stats = trace_stats(generate_trace("nl2repo-122b", 1000, np.random.default_rng(11)))
    assert stats["jmax1_token_share"] == pytest.approx(SPEC51_KEPT_SHARE[1], abs=0.015)
    assert stats["jmax5_token_share"] == pytest.approx(SPEC51_KEPT_SHARE[5], abs=0.015)


@pytest.mark.slow
def test_the_fit_recovers_the_shares_from_a_wrong_start():
    model = PRESETS["nl2repo-122b"].model
    v = draw_variates(np.random.default_rng(5), 1500, 16)
    _, codes, active = realize_durations(model, v)
    counts = realize_counts(model, v, active)
    tokens, trains = counts["input_tokens"] + counts["output_tokens"], codes <= 1
    fitted = fit_trajectory_model(TrajectoryModel(calls_per_branch=20.0, branch_weight=0.6),
                                  counts["call_count"], tokens, trains)
    shares = kept_shares(realize_trajectories(fitted, np.random.default_rng(20240601), counts["call_count"], tokens),
                         trains)
    assert shares[1] == pytest.approx(0.414, abs=0.005) and shares[5] == pytest.approx(0.748, abs=0.005)
    start = kept_shares(realize_trajectories(TrajectoryModel(calls_per_branch=20.0, branch_weight=0.6),
                                             np.random.default_rng(20240601), counts["call_count"], tokens), trains)
    assert abs(start[1] - 0.414) > 0.1 and abs(start[5] - 0.748) > 0.1  # the start was genuinely off
