"""The simulator's clock (gyre.sim.clock) runs calls in exactly SimPy's order of timeouts, at its times.

The driver, the engines and the training plane moved from ``simpy.Environment``
to ``Clock`` to save an event object per call; results stay bit-identical only
if the order of calls due at the same time is the same. The property builds
random programs of timeouts (zero delays and ties included, scheduled from
inside other calls) and runs each on both clocks.
"""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.sim.clock import Chain, Clock, EmptyClock

# a program: each call, when it runs, schedules the children listed for it (delay, child id)
DELAYS = st.sampled_from([0, 0.0, 0.5, 1.0, 1.5, 3.0, 0.1 + 0.2, 0.3])
PROGRAMS = st.lists(st.lists(st.tuples(DELAYS, st.integers(0, 30)), max_size=3), min_size=1, max_size=30)


def _trace(env, program: list[list[tuple[float, int]]], schedule) -> list[tuple[float, int]]:
    """The (time, node) of each call ``program`` makes on ``env``, each child scheduled by
    ``schedule(delay, run, child)``."""
    ran: list[tuple[float, int]] = []
    budget = [200]  # programs may loop; stop scheduling after 200 calls

    def run(node: int) -> None:
        ran.append((env.now, node))
        for delay, child in program[node % len(program)]:
            if budget[0] <= 0:
                return
            budget[0] -= 1
            schedule(delay, run, child)

    env.timeout(0).callbacks.append(lambda _e: run(0))
    env.run()
    return ran


def _by_timeout(env):
    """SimPy's way to schedule a call: a timeout event and its callback."""
    return lambda delay, fn, child: env.timeout(delay).callbacks.append(lambda _e: fn(child))


@settings(max_examples=60, deadline=None)
@given(PROGRAMS, st.booleans())
def test_calls_run_in_simpy_order_at_simpy_times(program, use_call_in):
    expected_env, env = simpy.Environment(), Clock()
    expected = _trace(expected_env, program, _by_timeout(expected_env))
    got = _trace(env, program, env.call_in if use_call_in else _by_timeout(env))
    assert [(type(t), t, n) for t, n in got] == [(type(t), t, n) for t, n in expected]


@settings(max_examples=100, deadline=None)
@given(PROGRAMS, st.lists(st.booleans(), min_size=31, max_size=31))
def test_calls_made_through_a_chain_run_as_clock_call_in_runs_them(program, chained):
    # the same programs, each child scheduled through a Chain when its id says so: same calls, times and order
    expected_clock, clock = Clock(), Clock()
    expected = _trace(expected_clock, program, expected_clock.call_in)
    chain = Chain(clock)
    ran = _trace(clock, program, lambda delay, fn, child: (chain.call_in if chained[child] else clock.call_in)(
        delay, fn, child))
    assert [(type(t), t, n) for t, n in ran] == [(type(t), t, n) for t, n in expected]


def test_a_chain_keeps_only_its_earliest_call_in_the_heap_and_refuses_a_negative_delay():
    clock, ran = Clock(), []
    chain = Chain(clock)
    for delay in (1.0, 2.0, 2.0, 3.0):
        chain.call_in(delay, ran.append, delay)
    chain.call_in(0.5, ran.append, 0.5)  # earlier than the chain's last: into the heap at once
    assert len(clock.queue) == 2
    with pytest.raises(ValueError, match="negative delay"):
        chain.call_in(-1.0, print)
    clock.run()
    assert ran == [0.5, 1.0, 2.0, 2.0, 3.0] and clock.now == 3.0


def test_run_until_stops_before_calls_due_then_and_stands_there():
    for env in (simpy.Environment(), Clock()):
        ran: list[float] = []
        for t in (1.0, 2.0, 3.0):
            env.timeout(t).callbacks.append(lambda _e, t=t, ran=ran: ran.append(t))
        env.run(until=2.0)
        assert ran == [1.0] and env.now == 2.0, type(env)
    assert Clock().peek() == float("inf")


def test_a_negative_delay_and_an_empty_clock_are_refused():
    clock = Clock()
    with pytest.raises(ValueError, match="negative delay"):
        clock.call_in(-1e-9, print)
    with pytest.raises(EmptyClock):
        clock.step()
