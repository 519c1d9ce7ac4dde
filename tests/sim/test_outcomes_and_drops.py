"""Excluded executions and dropped groups in the full simulator (docs/trajectories.md#evaluation-and-outcomes, the
core's GroupDropped).

- An excluded execution (overall timeout) never blocks its group: every
  consumed group has N designated outcomes, participants + excluded == N, and
  the staleness identity holds as without exclusions.
- A dropped group is replaced at once: it is never consumed, the run still
  consumes B groups per step, its event log replays, and the group-weighted
  staleness stays at phi + (mu - 1) / 2 in the steady window.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gyre.formats.eventlog import replay
from gyre.formats.trace import Trace
from gyre.presets import build_preset
from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation
from gyre.sim.traces.presets import generate_trace
from gyre.staleness import steady_window

STEPS = 36


@pytest.fixture(scope="module")
def base_trace() -> Trace:
    return generate_trace("nl2repo-122b", 200, np.random.default_rng(11), N=16)


def with_exclusions(trace: Trace, share: float, seed: int) -> Trace:
    """The same trace with a seeded share of executions turned into overall timeouts."""
    frame = trace.frame.copy()
    rng = np.random.default_rng(seed)
    frame.loc[rng.random(len(frame)) < share, "outcome"] = "overall_timeout"
    return Trace(frame, N=trace.N, source="with-exclusions")


def run(preset: str, trace: Trace, dropped: frozenset[int] = frozenset()) -> Simulation:
    cfg = build_preset(preset)
    sim = Simulation(cfg, trace, CostModel(), STEPS, dropped_groups=dropped)
    sim.run()
    return sim


def steady_mean(sim: Simulation) -> float:
    groups = pd.DataFrame(sim.record.consumed_groups(STEPS))
    first, stop = steady_window(sim.cfg.phi, sim.cfg.mu, STEPS)
    return float(groups[(groups.v_t >= first) & (groups.v_t < stop)].staleness.mean())


@pytest.mark.parametrize("preset", ["E0", pytest.param("A0", marks=pytest.mark.slow)])
def test_excluded_executions_never_block_their_groups(preset, base_trace):
    trace = with_exclusions(base_trace, 0.15, seed=1)
    sim = run(preset, trace)
    consumed = pd.DataFrame(sim.record.consumed_groups(STEPS))
    assert len(consumed) == STEPS * sim.cfg.B
    assert (consumed.participants + consumed.excluded == sim.cfg.N).all()
    assert consumed.excluded.sum() > 0.1 * len(consumed) * sim.cfg.N
    assert steady_mean(sim) == pytest.approx(sim.cfg.predicted_staleness, abs=0.1)


@pytest.mark.parametrize("preset", ["E0", pytest.param("C2", marks=pytest.mark.slow)])
def test_dropped_groups_are_replaced_and_staleness_still_holds(preset, base_trace):
    cfg = build_preset(preset)
    dropped = frozenset(range(5, 40 * cfg.B, 9))
    sim = run(preset, base_trace, dropped)
    groups = pd.DataFrame(sim.record.groups.values())
    was_dropped = groups.dropped_at_s.notna()
    assert set(groups[was_dropped].group_id) == dropped & set(groups.group_id)
    assert groups[was_dropped].v_t.isna().all(), "a dropped group was consumed"
    assert sim.record.log.action_counts["dispatch_groups"] > 0
    consumed = sim.record.consumed_groups(STEPS)
    assert len(consumed) == STEPS * cfg.B
    assert replay(cfg, sim.record.log.events()) == sim.record.log.actions
    assert steady_mean(sim) == pytest.approx(cfg.predicted_staleness, abs=0.1)


@pytest.mark.slow
def test_without_drops_no_group_is_marked_dropped(base_trace):
    sim = run("E0", base_trace)
    assert all(row["dropped_at_s"] is None for row in sim.record.groups.values())


@pytest.mark.slow
def test_oversampled_surplus_is_cancelled_and_never_designated(base_trace):
    """Groups of N + 2: the first N to end are designated; the surplus is cancelled once the group is ready."""
    cfg = build_preset("E0").replace_fields(oversample=2)
    sim = Simulation(cfg, base_trace, CostModel(), 6)
    sim.run()
    consumed = pd.DataFrame(sim.record.consumed_groups(6))
    assert len(consumed) == 6 * cfg.B and (consumed.participants + consumed.excluded == cfg.N).all()
    outcomes = pd.DataFrame(sim.record.executions.values()).groupby("group_id").outcome
    assert (outcomes.apply(lambda o: (o == "cancelled").sum())[consumed.group_id] <= 2).all()
    assert replay(cfg, sim.record.log.events()) == sim.record.log.actions
