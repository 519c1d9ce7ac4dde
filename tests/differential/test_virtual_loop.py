"""The virtual-clock loop's invariants (virtual_loop.py): jumps to timers, FIFO ties, inline executor, stalls."""

from __future__ import annotations

import asyncio

import pytest

from .virtual_loop import Pending, VirtualClockStalled, VirtualLoop


def run(coro_fn):
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(coro_fn(loop)), loop
    finally:
        loop.close()


def test_sleeping_advances_virtual_time_exactly_and_never_backwards():
    async def body(loop):
        seen = [loop.time()]
        for seconds in (5.0, 0.0, 1234.5, 0.25):
            await asyncio.sleep(seconds)
            seen.append(loop.time())
        return seen

    seen, _ = run(body)
    assert seen == [0.0, 5.0, 5.0, 1239.5, 1239.75]


def test_time_does_not_advance_while_a_callback_is_ready():
    async def body(loop):
        order = []
        loop.call_later(10.0, order.append, ("timer", loop.time()))
        for _ in range(50):  # many loop iterations, all ready at once
            await asyncio.sleep(0)
        order.append(("ready work done", loop.time()))
        await asyncio.sleep(20.0)
        return order

    order, _ = run(body)
    assert order == [("ready work done", 0.0), ("timer", 0.0)]  # the timer's argument was taken at t=0


def test_timers_due_at_the_same_time_run_in_scheduling_order():
    async def body(loop):
        order = []
        for i in [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]:
            loop.call_at(7.0, order.append, i)
        loop.call_at(6.0, order.append, "earlier")
        await asyncio.sleep(8.0)
        return order

    order, _ = run(body)
    assert order == ["earlier", 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


def test_to_thread_runs_inline_and_a_pending_answer_resumes_at_its_time():
    calls = []

    async def body(loop):
        def quick(x):
            calls.append(("quick", loop.time()))
            return x * 2

        def slow():
            raise Pending(loop.future_at(42.0, "done"))

        a = await asyncio.to_thread(quick, 21)
        b = await asyncio.to_thread(slow)
        return a, b, loop.time()

    (a, b, now), loop = run(body)
    assert (a, b, now) == (42, "done", 42.0)
    assert calls == [("quick", 0.0)]
    assert loop.executor.calls == 2


def test_an_exception_in_an_inline_call_reaches_the_awaiting_coroutine():
    async def body(loop):
        def broken():
            raise KeyError("no engine 'x'")

        with pytest.raises(KeyError, match="no engine"):
            await asyncio.to_thread(broken)
        return True

    assert run(body)[0]


def test_waiting_on_nothing_is_a_stall_naming_the_time():
    async def body(loop):
        await asyncio.sleep(3.0)
        await loop.create_future()  # nobody will ever complete it

    with pytest.raises(VirtualClockStalled, match="t=3.000000"):
        run(body)
