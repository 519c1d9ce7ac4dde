"""Streaming off vs on (docs/streaming.md#streaming-on-and-off) in the full simulator.

With streaming off, a burst's first update starts only when every one of its
mu x B groups is ready, so no group trained in a burst becomes ready after
the burst's first feed. With streaming on, updates take groups as they come,
so bursts start before their slowest group (the reason C2 beats C1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gyre.sim.runner import run_simulation
from gyre.sim.traces.presets import generate_trace

STEPS = 12


@pytest.fixture(scope="module")
def trace():
    return generate_trace("nl2repo-122b", 200, np.random.default_rng(5), N=16)


def bursts(preset: str, trace) -> tuple[pd.DataFrame, int]:
    result = run_simulation(preset, trace, steps=STEPS, seed=0)
    groups = pd.DataFrame(result.record.consumed_groups(STEPS))
    groups["burst"] = groups.v_t // result.cfg.mu
    return groups, result.cfg.mu


@pytest.mark.parametrize("preset", ["A2", "C1"])
def test_a_non_streaming_burst_waits_for_its_slowest_group(preset, trace):
    groups, mu = bursts(preset, trace)
    assert mu > 1
    for burst, rows in groups.groupby("burst"):
        first_feed = rows.consumed_at_s.min()
        assert rows.ready_at_s.max() <= first_feed + 1e-9, f"burst {burst} started before its slowest group"


def test_a_streaming_burst_starts_before_its_slowest_group(trace):
    groups, _ = bursts("C2", trace)
    early = [b for b, rows in groups.groupby("burst") if rows.ready_at_s.max() > rows.consumed_at_s.min() + 1e-9]
    assert early, "streaming never overlapped a burst's training with its remaining rollouts"


def test_streaming_on_is_faster_than_off_for_the_same_schedule(trace):
    off = run_simulation("C1", trace, steps=STEPS, seed=0).summary["total_hours"]
    on = run_simulation("C2", trace, steps=STEPS, seed=0).summary["total_hours"]
    assert on < off
