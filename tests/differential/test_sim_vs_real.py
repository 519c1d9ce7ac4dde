"""Sim vs real: one scripted trace through SimPy and through the real controller + real backend.

The real side is ``gyre.real.runtime.controller.Controller`` driving
``gyre.real.runtime.backend.RealBackend`` on a virtual clock, with only the
outermost edge replaced (``doubles.py``). For each schedule the two worlds must
give the same transcript (every event the core received, at the same time, with
the actions it returned), the same action sequence and the same per-group
staleness v_t - v_d:

- Async (static split) and Colocate (global switch), no streaming: shipped code
  on both sides;
- excluded executions (overall timeouts) and dropped groups (GroupDropped);
- fine-cell streaming Gyre.

Streaming: both worlds ask for groups by one rule (``gyre.driver_rules.asks_for_group``):
the packing buffer asks while its queued micro-steps are fewer than the
training cells; the simulator delivers its ask after the instant's claims
(``sim.training``), the real backend on its next turn of the event loop
(``runtime.batch_feed.BatchFeed.ask``), woken by the plane double when a cell
claims. With that rule ready groups can wait unclaimed and satellites join.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from gyre import events as ev
from gyre.formats.trace import Trace
from gyre.presets import ClusterShape, build_preset

from .doubles import EngineDouble
from .virtual_loop import Pending
from .worlds import EdgeBackend, costs_for_differential, first_difference, run_real, run_sim, times_match, transcript

#: four one-node cells of 4 concurrent executions, groups of N = 2, B = 4 groups per step
SHAPE = ClusterShape(nodes=4, nodes_per_cell=1, per_node_capacity=4, N=2, B=4)
STEPS = 6
OVERALL_TIMEOUT_S = 4000.0  # above every completed execution's end, below every timed-out one's
DROPPED = frozenset({3, 9})


def scripted_trace(queries: int, seed: int, timeout_share: float = 0.0, retry_share: float = 0.0) -> Trace:
    """Seeded durations (60-900 s, so no two events coincide); timed-out executions run 5000 s.

    With ``retry_share`` > 0 the trace has a ``harness_s`` column and that share of executions
    stop their harness 300-1500 s before they end (evaluation retries, outcome harness_timeout).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(queries):
        for i in range(SHAPE.N):
            timed_out = rng.random() < timeout_share
            duration = 5000.0 + rng.random() if timed_out else float(rng.uniform(60, 900))
            rows.append({"query_id": q, "execution_index": i, "duration_s": duration, "harness_s": duration,
                         "outcome": "overall_timeout" if timed_out else "completed"})
            if retry_share and not timed_out and rng.random() < retry_share:
                rows[-1].update(duration_s=duration + float(rng.uniform(300, 1500)), outcome="harness_timeout")
    frame = pd.DataFrame(rows)
    return Trace(frame if retry_share else frame.drop(columns=["harness_s"]), N=SHAPE.N, source="differential")


def both(preset: str, trace: Trace, dropped: frozenset[int] = frozenset(), backend_class=EdgeBackend,
         engine_class=EngineDouble):
    cfg = build_preset(preset, SHAPE)
    costs = costs_for_differential()
    sim = run_sim(cfg, trace, costs, STEPS, dropped)
    real, backend = run_real(cfg, trace, costs, STEPS, dropped, overall_timeout_s=OVERALL_TIMEOUT_S,
                             backend_class=backend_class, engine_class=engine_class)
    return cfg, sim, real, backend


def assert_identical(cfg, sim, real) -> None:
    ts, tr = transcript(cfg, sim.log), transcript(cfg, real.log)
    diff = first_difference(ts, tr)
    assert diff is None, diff
    assert times_match(ts, tr) is None, times_match(ts, tr)
    assert sim.log.actions == real.log.actions
    assert sim.staleness == real.staleness
    assert len(sim.staleness) >= STEPS * cfg.B  # every fed group (non-streaming feeds a burst ahead)


def kinds(log) -> list[str]:
    return [row["kind"] for row in log.rows]


@pytest.mark.parametrize("preset", ["async-1.5", "colocate-1.5"])
def test_non_streaming_schedules_are_identical(preset):
    cfg, sim, real, _ = both(preset, scripted_trace(40, seed=1))
    assert not cfg.streaming
    assert_identical(cfg, sim, real)


def satellite_joins(log) -> int:
    return sum(1 for a in log.actions if a["kind"] == "begin_transition" and a["role"] == "training" and a["cell"] != 0)


@pytest.mark.parametrize("preset", ["gyre-1.5", pytest.param("C2", marks=pytest.mark.slow),
                                    pytest.param("A3", marks=pytest.mark.slow)])
def test_streaming_schedules_are_identical(preset):
    """Shipped code on both sides: the packing buffer asks when its queue runs short, in both worlds."""
    cfg, sim, real, backend = both(preset, scripted_trace(40, seed=1))
    assert cfg.streaming
    assert_identical(cfg, sim, real)
    # the backend starts each StartExecutions with one admin call (keys and routes): per-execution calls held the
    # event loop long enough, on a busy machine, to delay the StartBatch behind them (CPU demo: ~1.8 s a burst)
    starts = [a for a in real.log.actions if a["kind"] == "start_executions" and a["placements"]]
    calls = Counter(backend.proxy_double.calls)
    assert calls[("POST", "/admin/executions/start")] == len(starts) > 0
    assert calls[("POST", "/admin/executions")] == 0
    assert calls[("POST", "/admin/routes")] == sum(1 for a in real.log.actions if a["kind"] == "reroute")
    if preset == "gyre-1.5":
        assert cfg.granularity == "fine"
        assert satellite_joins(real.log) >= 2, "no satellite joined: the elastic path is not exercised"
        assert any(a["kind"] == "broadcast" for a in real.log.actions)
        assert sum(step["microsteps"] for step in backend.metrics.steps.values()) == STEPS * cfg.B * cfg.N


@pytest.mark.parametrize("preset", ["async-1.5", "gyre-1.5"])
def test_excluded_executions_and_dropped_groups_are_identical(preset):
    cfg, sim, real, backend = both(preset, scripted_trace(40, seed=1, timeout_share=0.15), DROPPED)
    # a group with excluded executions trains in fewer micro-steps, in both worlds by one rule
    # (gyre.driver_rules.pack_micro_steps): streaming steps end at the same instants
    assert_identical(cfg, sim, real)
    assert backend.executions.dropped == set(DROPPED)
    assert kinds(real.log).count("group_dropped") == len(DROPPED)
    assert len(backend.metrics.excluded) >= 2  # excluded by their evaluation budget, not by the trace
    consumed_with_exclusions = {x // cfg.group_size for x in backend.metrics.excluded} & set(real.staleness)
    assert consumed_with_exclusions, "no consumed group had an excluded execution"
    assert not DROPPED & set(real.staleness)


@pytest.mark.parametrize("preset", ["async-1.5", "gyre-1.5"])
def test_stopped_harnesses_free_their_slots_identically(preset):
    """HarnessStopped: the simulator at harness_s, the real backend when the evaluation goes into retries."""
    cfg, sim, real, backend = both(preset, scripted_trace(40, seed=2, retry_share=0.3))
    assert_identical(cfg, sim, real)
    stops = kinds(real.log).count("harness_stopped")
    assert stops >= 10 and kinds(sim.log).count("harness_stopped") == stops
    # a freed slot was used: some execution started at a HarnessStopped
    lines = transcript(cfg, real.log)
    assert any("harness_stopped" in line and "start_executions" in line for line in lines), \
        "no queued execution started in a freed slot"
    # the real run's own trace records the stops: harness_s where retries followed, the evaluation in duration_s

    from gyre.real.runtime.trace import trace_from_results

    results = [r for r in backend.metrics.trace if r.outcome != "cancelled"]
    done = Counter(r.query_id for r in results)
    results = [r for r in results if done[r.query_id] == cfg.N]  # groups still running at the end are left out
    written = trace_from_results(results).frame.set_index(["query_id", "execution_index"])
    script = scripted_trace(40, seed=2, retry_share=0.3).frame.set_index(["query_id", "execution_index"])
    sandbox = costs_for_differential().sandbox_start_s  # both worlds start each execution in a fresh sandbox
    stopped = 0
    for (g, i), row in written.iterrows():
        want = script.loc[(int(g) % 40, int(i))]
        assert row["duration_s"] == pytest.approx(want["duration_s"] + sandbox, abs=1e-6), (g, i)
        assert row["harness_s"] == pytest.approx(want["harness_s"] + sandbox, abs=1e-6), (g, i)
        stopped += row["harness_s"] < row["duration_s"]
    assert stopped >= 10


# ---- the comparison can fail: one perturbed double, one perturbed backend ---------------------------
class SlowWeightLoad(EngineDouble):
    def update_weights_from_disk(self, name: str, path: str, weight_version: str = "") -> None:
        self._call("update_weights_from_disk", name)
        raise Pending(self.loop.future_at(self.costs.to_rollout_s + 1.0))  # one second slower than the sim


class NoPublicationWait(EdgeBackend):
    """A backend that lets an engine leave training without waiting for the publication in flight."""

    def on_publish(self, a) -> None:
        super().on_publish(a)
        self.publisher.publishing = None


@pytest.mark.slow
def test_a_slower_double_shows_the_first_differing_event():
    cfg, sim, real, _ = both("colocate-1.5", scripted_trace(40, seed=1), engine_class=SlowWeightLoad)
    diff = first_difference(transcript(cfg, sim.log), transcript(cfg, real.log))
    assert diff is not None and "- sim:" in diff and "+ real:" in diff
    assert "transition_done" in diff  # the first event it moves is a return to rollout


def test_a_backend_without_the_publication_wait_is_caught():
    cfg, sim, real, backend = both("colocate-1.5", scripted_trace(40, seed=1), backend_class=NoPublicationWait)
    diff = first_difference(transcript(cfg, sim.log), transcript(cfg, real.log))
    assert diff is not None and "transition_done" in diff
    assert backend.metrics.publishes  # it still published; only the wait is gone
