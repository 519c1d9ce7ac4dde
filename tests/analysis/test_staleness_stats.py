"""Staleness statistics against hand-computed values."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gyre.analysis.staleness import staleness_distribution, staleness_stats, token_distribution
from gyre.staleness import steady_window, warmup_bursts

# six consumed groups, one never consumed
GROUPS = pd.DataFrame({
    "v_t": [0, 0, 1, 1, 2, 2, None],
    "staleness": [0, 1, 1, 2, 2, 4, None],
    "tokens": [10.0, 10.0, 20.0, 20.0, 30.0, 10.0, 99.0],
})


def test_stats_of_all_consumed_groups():
    stats = staleness_stats(GROUPS)
    assert stats["groups"] == 6
    assert stats["mean"] == pytest.approx(10 / 6)
    # (0*10 + 1*10 + 1*20 + 2*20 + 2*30 + 4*10) / 100
    assert stats["token_weighted_mean"] == pytest.approx(170 / 100)
    assert (stats["min"], stats["max"]) == (0.0, 4.0)
    assert (stats["p50"], stats["p90"], stats["p99"]) == (1.0, 4.0, 4.0)


def test_window_selects_by_training_version():
    stats = staleness_stats(GROUPS, window=(1, 2))
    assert stats["groups"] == 2 and stats["mean"] == 1.5


def test_empty_selection():
    stats = staleness_stats(GROUPS, window=(5, 6))
    assert stats["groups"] == 0 and math.isnan(stats["mean"])
    assert staleness_distribution(GROUPS, window=(5, 6)).empty


def test_distributions():
    dist = staleness_distribution(GROUPS)
    assert dist.to_dict() == pytest.approx({0: 1 / 6, 1: 2 / 6, 2: 2 / 6, 4: 1 / 6})
    tokens = token_distribution(GROUPS)
    assert tokens.to_dict() == pytest.approx({0: 0.1, 1: 0.3, 2: 0.5, 4: 0.1})


def test_steady_window_keeps_whole_bursts_after_warmup():
    assert warmup_bursts(0.5, 3) == 3 and warmup_bursts(0.0, 4) == 2 and warmup_bursts(2.5, 1) == 5
    assert steady_window(0.5, 3, 60) == (9, 60)
    assert steady_window(1.5, 4, 30) == (12, 28)
    with pytest.raises(ValueError, match="no steady-state burst"):
        steady_window(0.5, 3, 10)
