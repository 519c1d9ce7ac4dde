"""Processor-sharing engines (gyre.sim.engines): hand-worked cases, normalisation, work conservation.

The bank is driven directly on the simulator's clock; finish times are worked out by
hand in each test's comment. The Hypothesis property integrates the speed of
each execution's engine over its life from an independent log of loads and
checks it equals the work it was given.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.sim.clock import Clock
from gyre.sim.costs import CostError, CostModel, parse_cost_overrides
from gyre.sim.engines import DEFAULT_ALPHA, DEFAULT_MODEL, MEASURED, EngineBank, EngineCurve, fit_load_alpha


class Harness:
    """An EngineBank on its own clock, logging every load change and finish."""

    def __init__(self, curve: EngineCurve, capacity: int = 2) -> None:
        self.env = Clock()
        self.curve, self.cap = curve, capacity
        self.finished: dict[int, float] = {}
        self.bank = EngineBank(self.env, curve, lambda _engine: capacity, self._done)
        self.changes: list[tuple[float, int, int, int]] = []  # (time, engine, +1/-1, execution)
        self.where: dict[int, int] = {}

    def _done(self, x: int) -> None:
        assert x not in self.finished, f"execution {x} finished twice"
        self.finished[x] = self.env.now
        self.changes.append((self.env.now, self.where.pop(x), -1, x))

    def at(self, t: float, fn) -> None:
        def call(_e):
            fn()
            self.bank.flush()
        self.env.timeout(t).callbacks.append(call)

    def start(self, x: int, engine: int, work: float) -> None:
        self.bank.start(x, engine, work)
        self.where[x] = engine
        self.changes.append((self.env.now, engine, +1, x))

    def move(self, x: int, dest: int, extra: float = 0.0) -> None:
        if x not in self.bank:
            return
        self.changes.append((self.env.now, self.where[x], -1, x))
        self.bank.move(x, dest, extra)
        self.where[x] = dest
        self.changes.append((self.env.now, dest, +1, x))

    def run(self) -> dict[int, float]:
        self.bank.flush()
        self.env.run()
        return self.finished


def test_two_executions_one_finishes_and_the_other_speeds_up():
    # capacity 2, a = 1, reference load 2: speed(2) = 1, speed(1) = (1 + 1) / 1 = 2.
    # A (work 10) and B (work 30) start at 0 at speed 1; A ends at 10 with B's work 20 left;
    # B alone runs at speed 2 and ends at 10 + 20/2 = 20.
    h = Harness(EngineCurve(1.0), capacity=2)
    h.start(0, 0, 10.0)
    h.start(1, 0, 30.0)
    assert h.run() == pytest.approx({0: 10.0, 1: 20.0})


def test_a_reroute_moves_the_remaining_work_and_both_engines_change_speed():
    # capacity 2, a = 1, reference load 2 (speed 1 at load 2, 2 at load 1).
    # t=0: A(10), B(30) on engine 0; C(40) alone on engine 1 (speed 2).
    # t=4: B moves to engine 1 with 26 left (+5 recompute = 31); C has 40 - 8 = 32 left.
    # engine 0: A alone with 6 left at speed 2 -> ends at 7.
    # engine 1: B and C at speed 1; B ends at 4 + 31 = 35, C has 1 left, alone -> 35.5.
    h = Harness(EngineCurve(1.0), capacity=2)
    h.start(0, 0, 10.0)
    h.start(1, 0, 30.0)
    h.start(2, 1, 40.0)
    h.at(4.0, lambda: h.move(1, 1, extra=5.0))
    assert h.run() == pytest.approx({0: 7.0, 1: 35.0, 2: 35.5})


def test_a_removed_execution_never_finishes_and_frees_its_share():
    # a = 1, capacity 2: A(10), B(10) at speed 1; B removed at 4 with 6 left; A then has 6 left at speed 2 -> 7.
    h = Harness(EngineCurve(1.0), capacity=2)
    h.start(0, 0, 10.0)
    h.start(1, 0, 10.0)
    left = []
    h.at(4.0, lambda: left.append(h.bank.remove(1)))
    assert h.run() == pytest.approx({0: 7.0})
    assert left == [pytest.approx(6.0)]


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.515, 7.0])
@pytest.mark.parametrize("capacity, reference", [(4, 1.0), (4, 0.5), (144, 1.0), (16, 0.25)])
def test_at_the_reference_load_durations_are_the_trace_durations(alpha, capacity, reference):
    load = round(reference * capacity)
    curve = EngineCurve(alpha, reference)
    assert curve.speed(load, capacity) == pytest.approx(1.0)
    h = Harness(curve, capacity=capacity)
    for x in range(load):
        h.start(x, 0, 100.0)
    assert h.run() == pytest.approx({x: 100.0 for x in range(load)})


def test_speed_falls_with_load_and_aggregate_throughput_saturates():
    curve = EngineCurve(1.5)
    speeds = [curve.speed(n, 16) for n in range(1, 17)]
    assert all(a > b for a, b in zip(speeds, speeds[1:]))
    aggregate = [n * s for n, s in enumerate(speeds, start=1)]
    gains = [b - a for a, b in zip(aggregate, aggregate[1:])]
    assert all(g > 0 for g in gains) and all(a > b for a, b in zip(gains, gains[1:]))
    assert EngineCurve(0.0).speed(1, 16) == EngineCurve(0.0).speed(16, 16) == 1.0


def test_the_fit_recovers_a_known_curve_and_rejects_bad_points():
    points = [(c, 100.0 / (1 + 2.0 * (c - 1) / 15)) for c in (1, 2, 4, 8, 16)]
    assert fit_load_alpha(points) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="concurrency 1"):
        fit_load_alpha([(2, 10.0), (4, 5.0)])
    with pytest.raises(ValueError, match="positive"):
        fit_load_alpha([(1, 10.0), (4, 0.0)])


def test_the_default_curve_is_the_fit_of_the_committed_measurement():
    rows = MEASURED[DEFAULT_MODEL]
    assert [r[0] for r in rows] == [1, 2, 4, 8, 16]
    assert DEFAULT_ALPHA == pytest.approx(fit_load_alpha([(c, per) for c, _agg, per in rows]))
    assert DEFAULT_ALPHA > 0 and CostModel().engine_load_alpha == DEFAULT_ALPHA


def test_the_old_slowdown_switch_is_gone_with_a_clear_error():
    with pytest.raises(CostError, match="slowdown_per_load was removed.*engine_load_alpha"):
        parse_cost_overrides(["slowdown_per_load=0.5"])
    with pytest.raises(TypeError, match="slowdown_per_load"):
        CostModel(slowdown_per_load=0.5)
    assert parse_cost_overrides(["engine_load_alpha=0.5", "engine_reference_load=0.5"]) == {
        "engine_load_alpha": 0.5, "engine_reference_load": 0.5}
    with pytest.raises(CostError, match="engine_reference_load"):
        CostModel(engine_reference_load=0.0)
    with pytest.raises(CostError, match="engine_load_alpha"):
        CostModel(engine_load_alpha=-1.0)


def _integrated_work(h: Harness) -> dict[int, float]:
    """Each execution's integral of speed(load of its engine) over its time there, from the change log."""
    times = sorted({t for t, *_ in h.changes})
    load: dict[int, int] = {}
    members: dict[int, set[int]] = {}
    got: dict[int, float] = {}
    by_time: dict[float, list] = {}
    for change in h.changes:
        by_time.setdefault(change[0], []).append(change)
    for i, t in enumerate(times):
        for _t, engine, delta, x in by_time[t]:
            load[engine] = load.get(engine, 0) + delta
            (members.setdefault(engine, set()).add if delta > 0 else members[engine].discard)(x)
        if i + 1 < len(times):
            dt = times[i + 1] - t
            for engine, xs in members.items():
                for x in xs:
                    got[x] = got.get(x, 0.0) + dt * h.curve.speed(load[engine], h.cap)
    return got


@settings(max_examples=60, deadline=None)
@given(alpha=st.floats(0.0, 5.0), reference=st.sampled_from([0.25, 0.5, 1.0]),
       jobs=st.lists(st.tuples(st.floats(0.0, 50.0), st.integers(0, 2), st.floats(0.5, 80.0)), min_size=1, max_size=12),
       moves=st.lists(st.tuples(st.floats(0.0, 120.0), st.integers(0, 11), st.integers(0, 2), st.floats(0.0, 10.0)),
                      max_size=8))
def test_work_conservation(alpha, reference, jobs, moves):
    h = Harness(EngineCurve(alpha, reference), capacity=4)
    work = {}
    for x, (t, engine, w) in enumerate(jobs):
        work[x] = w
        h.at(t, lambda x=x, engine=engine, w=w: h.start(x, engine, w))
    for t, x, dest, extra in moves:
        if x < len(jobs):
            def move(x=x, dest=dest, extra=extra):
                if x in h.bank:
                    work[x] += extra
                    h.move(x, dest, extra)
            h.at(t, move)
    finished = h.run()
    assert set(finished) == set(work)
    got = _integrated_work(h)
    for x, w in work.items():
        assert math.isclose(got.get(x, 0.0), w, rel_tol=1e-6, abs_tol=1e-6), (x, got.get(x), w)
