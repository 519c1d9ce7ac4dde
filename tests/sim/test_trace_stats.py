"""Trace statistics on hand-checked traces, the comparison table, and the fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from gyre.formats.trace import Trace
from gyre.sim.traces.presets import PRESETS, draw_variates, realize_durations
from gyre.sim.traces.fit import fit_model
from gyre.sim.traces.stats import duration_stats, format_stats_table, trace_stats, within_tolerance

H = 3600.0


def two_by_two(with_tokens: bool = True) -> Trace:
    frame = pd.DataFrame(
        {
            "query_id": ["a", "a", "b", "b"],
            "execution_index": [0, 1, 0, 1],
            "duration_s": [1 * H, 5 * H, 2 * H, 3 * H],
            "outcome": ["completed", "overall_timeout", "harness_timeout", "failed"],
        }
    )
    if with_tokens:
        frame["input_tokens"] = [100, 300, 200, 0]
        frame["output_tokens"] = [10, 30, 20, 0]
        frame["call_count"] = [1, 3, 2, 0]
    return Trace(frame)


def test_stats_of_a_hand_checked_trace():
    stats = trace_stats(two_by_two())
    expected = {
        "queries": 2,
        "executions": 4,
        "N": 2,
        "mean_execution_h": 2.75,
        "mean_query_h": 4.0,
        "queries_over_4h": 0.5,
        "harness_timeout_rate": 0.25,
        "overall_timeout_rate": 0.25,
        "failed_rate": 0.25,
        "slowest_overall_timeout_share": 0.5,
        "queries_with_timeout": 1.0,  # a: overall timeout, b: harness timeout
        "independent_timeout_queries": 0.75,  # 1 - (1 - 2/4)^2
        "timeouts_per_timed_out_query": 1.0,
        "queries_at_ceiling": 0.5,  # a ends on its overall timeout; b on a failure after its timeout
        "near_ceiling_share": 0.75,  # ceiling read as 2 h: 5, 2 and 3 h are >= 1.6 h
        "tie_share": 0.5,  # completed/failed durations 1 h and 3 h
        "p50_execution_h": 2.5,
        "mean_input_tokens": 150.0,
        "mean_output_tokens": 15.0,
        "mean_tokens": 165.0,
        "mean_call_count": 1.5,
    }
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value), key
    assert stats["p90_execution_h"] == pytest.approx(4.4)


def test_stats_without_optional_columns_skip_token_means():
    stats = trace_stats(two_by_two(with_tokens=False))
    assert "mean_tokens" not in stats and "mean_call_count" not in stats
    assert "mean_tokens" not in format_stats_table(stats)


def test_exactly_four_hours_is_not_over_four_hours():
    stats = duration_stats(np.array([[4 * H, 1.0]]), np.array([["harness_timeout", "completed"]]))
    assert stats["queries_over_4h"] == 0.0


def test_tolerance_rules():
    assert within_tolerance("harness_timeout_rate", 0.0625 + 0.014, 0.0625)
    assert not within_tolerance("harness_timeout_rate", 0.0625 + 0.016, 0.0625)
    assert within_tolerance("queries_over_4h", 0.11, 0.0951)
    assert within_tolerance("mean_query_h", 2.96 * 1.049, 2.96)
    assert not within_tolerance("mean_query_h", 2.96 * 1.051, 2.96)


def test_table_puts_achieved_beside_target():
    stats = trace_stats(two_by_two())
    sources = {"mean_execution_h": "paper: docs/workload.md#workload-profile", "failed_rate": "ours: a guess",
               "queries_with_timeout": "paper: x"}
    table = format_stats_table(stats, {"mean_execution_h": 2.75, "failed_rate": 0.10}, sources=sources,
                               bounds={"queries_with_timeout": 0.5})
    lines = table.splitlines()
    assert lines[0] == "2 queries x N = 2"
    assert lines[1].split() == ["metric", "target", "source", "achieved", "error", "tolerance", "ok"]
    row = next(line for line in lines if line.startswith("mean execution"))
    assert row.count("2.750 h") == 2 and "paper" in row and "+0.0%" in row and "+-5%" in row and row.endswith("yes")
    failed = next(line for line in lines if line.startswith("failed rate"))
    assert "25.00%" in failed and "10.00%" in failed and "ours" in failed and "+15.00 pp" in failed
    assert failed.endswith("NO")
    bound = next(line for line in lines if line.startswith("queries holding a timeout"))
    assert "<= 50.00%" in bound and "100.00%" in bound and "bound" in bound and bound.endswith("NO")
    plain = format_stats_table(stats)
    assert "target" not in plain and "2.750 h" in plain


def test_fit_recovers_targets_from_a_perturbed_start():
    preset = PRESETS["nl2repo-122b"]
    start = dataclasses.replace(
        preset.model,
        difficulty_log_mean=0.3,
        difficulty_log_sd=0.2,
        execution_log_sd=0.2,
        hard_share=0.15,
        stuck_rate=0.6,
        overall_share=0.2,
    )
    fitted = fit_model(start, preset.targets, queries=5_000, seed=11)
    variates = draw_variates(np.random.default_rng(11), 5_000, 16)
    achieved = duration_stats(*realize_durations(fitted, variates)[:2])
    # the 122B targets as realized in E0 are not all reachable at once (the fit's compromise leaves the
    # query mean ~2 % short): the fit from elsewhere must land where the preset's own parameters do
    preset_achieved = duration_stats(*realize_durations(preset.model, variates)[:2])
    for key in ("mean_execution_h", "mean_query_h", "queries_over_4h", "harness_timeout_rate"):
        assert achieved[key] == pytest.approx(preset_achieved[key], rel=0.03), key
        assert achieved[key] == pytest.approx(preset.targets[key], rel=0.03), key
    assert achieved["overall_timeout_rate"] == pytest.approx(preset.targets["overall_timeout_rate"], rel=0.01)
    assert fitted.tokens_per_call == pytest.approx(preset.model.tokens_per_call, rel=0.05)
    assert (fitted.ceiling_h, fitted.budget_h) == (preset.model.ceiling_h, preset.model.budget_h)
