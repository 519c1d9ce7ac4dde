"""An asyncio event loop on a virtual clock, for running the real controller and backend against doubles.

``VirtualLoop.time()`` is virtual seconds. When the loop has nothing ready to
run, its selector does not sleep: it moves the clock straight to the earliest
scheduled timer. When nothing is ready and no timer is scheduled, the run can
never go on and ``VirtualClockStalled`` is raised (the simulator's
``SimulationStalled``).

No thread ever runs. The default executor (``asyncio.to_thread``,
``run_in_executor(None, ...)``) calls the function inline on the loop thread;
a double whose answer lies in the virtual future raises ``Pending(future)``
with a ``concurrent.futures.Future`` that a loop timer completes later, and the
awaiting coroutine resumes then. So thread completions never race the clock.

Ties: timers due at the same virtual time run in the order they were
scheduled (a sequence number breaks ties, as SimPy's event ids do), and
callbacks made ready at one instant run first-in first-out, so equal runs give
equal orders.

Invariants: ``time()`` never decreases; it only advances when no callback is
ready; a timer never runs before its time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import selectors
from typing import Any, Callable


class VirtualClockStalled(RuntimeError):
    """Nothing is ready and no timer is scheduled: virtual time cannot advance."""


class Pending(Exception):
    """Raised by a double called through the executor: its answer is ``future``, completed later."""

    def __init__(self, future: concurrent.futures.Future) -> None:
        super().__init__("answer pending on the virtual clock")
        self.future = future


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs submitted calls inline; a ``Pending`` call returns the double's own future."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        self.calls += 1
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Pending as pending:
            return pending.future
        except BaseException as exc:  # delivered to the awaiting coroutine, as a thread's would be
            future.set_exception(exc)
        return future


class _OrderedTimer(asyncio.TimerHandle):
    """A timer ordered by (time, scheduling order)."""

    __slots__ = ("_seq",)

    def __init__(self, seq: int, when: float, callback, args, loop, context=None) -> None:
        super().__init__(when, callback, args, loop, context=context)
        self._seq = seq

    def __lt__(self, other) -> bool:
        return (self._when, self._seq) < (other._when, other._seq)

    def __le__(self, other) -> bool:
        return (self._when, self._seq) <= (other._when, other._seq)

    def __gt__(self, other) -> bool:
        return (self._when, self._seq) > (other._when, other._seq)

    def __ge__(self, other) -> bool:
        return (self._when, self._seq) >= (other._when, other._seq)


class _VirtualSelector(selectors.DefaultSelector):
    loop: "VirtualLoop"

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None or not self.loop._scheduled:
            raise VirtualClockStalled(f"virtual clock stalled at t={self.loop.time():.6f}: nothing ready, no timer")
        self.loop._advance_to(self.loop._scheduled[0].when())
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._seq = itertools.count()
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.executor = InlineExecutor()
        self.set_default_executor(self.executor)

    def time(self) -> float:
        return self._now

    def _advance_to(self, when: float) -> None:
        self._now = max(self._now, when)

    def call_at(self, when, callback, *args, context=None):
        self._check_closed()
        timer = _OrderedTimer(next(self._seq), when, callback, args, self, context)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def future_at(self, seconds: float, value: Any = None) -> concurrent.futures.Future:
        """A future completed with ``value`` ``seconds`` from now (on this loop's thread)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.call_later(seconds, future.set_result, value)
        return future
