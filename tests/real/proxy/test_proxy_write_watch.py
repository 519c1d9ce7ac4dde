"""``proxy.write_watch``: one periodic check keeps every stream's write timeout.

A Hypothesis state machine drives streams (watch, begin, end, release) and a
clock, checks at random times, and holds the module's invariants against a
model: a write stalled past the timeout is aborted at the next check, nothing
between writes or released is ever cut, and a cut stream's ``end`` raises.
The real cut-off of a stalled client is ``test_proxy_write_timeout``.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gyre.real.proxy.write_watch import WriteWatchdog

TIMEOUT = 2.0


class Transport:
    def __init__(self) -> None:
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


class WatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0
        self.dog = WriteWatchdog(TIMEOUT, clock=lambda: self.now)
        self.streams: list[dict] = []  # model: watch, transport, write began at (or None), released, cut

    @rule()
    def open_stream(self) -> None:
        transport = Transport()
        self.streams.append({"watch": self.dog.watch(transport), "transport": transport, "since": None,
                             "released": False, "cut": False})

    def _live(self) -> list[dict]:
        return [s for s in self.streams if not s["released"] and not s["cut"]]

    @precondition(lambda self: any(s["since"] is None for s in self._live()))
    @rule(data=st.data())
    def begin_write(self, data) -> None:
        stream = data.draw(st.sampled_from([s for s in self._live() if s["since"] is None]))
        stream["watch"].begin()
        stream["since"] = self.now

    @precondition(lambda self: any(s["since"] is not None for s in self.streams if not s["released"]))
    @rule(data=st.data())
    def end_write(self, data) -> None:
        stream = data.draw(st.sampled_from([s for s in self.streams if s["since"] is not None and not s["released"]]))
        if stream["cut"]:
            with pytest.raises(ConnectionResetError):
                stream["watch"].end()
            stream["released"] = True  # the stream's handler gives up on a cut connection
            self.dog.release(stream["watch"])
        else:
            stream["watch"].end()
            stream["since"] = None

    @precondition(lambda self: any(not s["released"] for s in self.streams))
    @rule(data=st.data())
    def release(self, data) -> None:
        stream = data.draw(st.sampled_from([s for s in self.streams if not s["released"]]))
        self.dog.release(stream["watch"])
        stream["released"] = True

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 1.99, 2.0, 2.01, 5.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def check(self) -> None:
        expected = [s for s in self._live() if s["since"] is not None and self.now - s["since"] > TIMEOUT]
        cut = self.dog.check()
        assert {id(w) for w in cut} == {id(s["watch"]) for s in expected}
        for stream in expected:
            stream["cut"] = True

    @invariant()
    def only_stalled_writes_are_cut(self) -> None:
        for stream in self.streams:
            assert stream["watch"].cut == stream["cut"]
            assert stream["transport"].aborted == int(stream["cut"])  # aborted once, when cut

    @invariant()
    def holds_only_live_streams(self) -> None:
        assert len(self.dog) == len(self._live())


WatchMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_write_watchdog_cuts_exactly_the_stalled_writes = WatchMachine.TestCase


def test_the_check_period_follows_the_timeout_and_a_bad_timeout_is_refused() -> None:
    assert WriteWatchdog(60).period_s == 1.0
    assert WriteWatchdog(1.0).period_s == 0.25
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="write timeout"):
            WriteWatchdog(bad)


def test_a_write_is_cut_only_once_it_has_lasted_more_than_the_timeout() -> None:
    now = [0.0]
    dog = WriteWatchdog(TIMEOUT, clock=lambda: now[0])
    transport = Transport()
    watch = dog.watch(transport)
    watch.begin()
    now[0] = TIMEOUT  # exactly the timeout: not yet
    assert dog.check() == [] and not watch.cut
    now[0] = TIMEOUT + 0.001
    assert dog.check() == [watch] and watch.cut and transport.aborted == 1
    with pytest.raises(ConnectionResetError):
        watch.end()


def test_run_checks_every_period_until_cancelled() -> None:
    async def main() -> int:
        dog = WriteWatchdog(0.08)
        transport = Transport()
        watch = dog.watch(transport)
        watch.begin()
        task = asyncio.ensure_future(dog.run())
        await asyncio.sleep(0.2)  # past the timeout and at least one period after it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert watch.cut and len(dog) == 0
        return transport.aborted

    assert asyncio.run(main()) == 1
