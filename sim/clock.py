"""The simulator's event clock: SimPy's order of timeouts, without an event object per call.

A simulation only ever waits for a delay and then calls a function, so its
clock is a heap of ``(time, sequence, function, arguments)``. ``call_in(delay,
fn, *args)`` schedules ``fn(*args)`` at ``now + delay``; ``step()`` runs the
earliest. ``timeout(delay).callbacks.append(fn)`` is SimPy's spelling of the
same thing (``fn`` receives the timeout), kept for the parts written against it.

Invariants:
- calls run in order of time, then of scheduling: exactly the order in which
  ``simpy.Environment`` runs timeouts of one priority (its heap key is
  ``(now + delay, priority, event id)``, with the id counting every schedule),
  so a simulation gives the same bytes on either clock;
- ``now`` is the time of the call running (0, an int as in SimPy, before the
  first), computed as ``now + delay`` with the same float additions as SimPy;
- a negative delay is refused with ``ValueError``; ``step()`` on an empty clock
  raises ``EmptyClock``.

The two calls made once per simulated event (an engine's timer, a micro-step's
end) push onto the heap themselves, ``heappush(clock.queue, (clock.now + delay,
next(clock.sequence), fn, args))`` with a delay they know is >= 0: exactly what
``call_in`` pushes, without a call.

A ``Chain`` keeps calls made mostly in order of time (the harness deadlines:
each a start plus one ceiling) out of the heap: only the chain's earliest
waits there, the rest in a deque behind it, each with the sequence number it
drew when it was made, so the clock runs every call at the time and in the
order ``call_in`` gives (a property in tests/sim/test_clock.py), over a
smaller heap (the deadlines were ~120 of its ~195 calls).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from heapq import heappush
from typing import Any, Callable


class EmptyClock(IndexError):
    """Nothing is scheduled: the simulated world has no event left."""


class Timeout:
    """What ``Clock.timeout`` returns: its ``callbacks`` run, in order, when it is due."""

    __slots__ = ("callbacks",)

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Timeout], Any]] = []

    def fire(self) -> None:
        for callback in self.callbacks:
            callback(self)


class Clock:
    __slots__ = ("now", "queue", "sequence")

    def __init__(self) -> None:
        self.now: float = 0
        self.queue: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self.sequence = itertools.count()  # the order of scheduling, among calls due at one time

    def call_in(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` ``delay`` seconds from now."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        heappush(self.queue, (self.now + delay, next(self.sequence), fn, args))

    def timeout(self, delay: float) -> Timeout:
        """SimPy's ``env.timeout(delay)``: append callbacks to the result; each gets the timeout."""
        timeout = Timeout()
        self.call_in(delay, timeout.fire)
        return timeout

    def peek(self) -> float:
        """The time of the next call (infinity when none is scheduled)."""
        return self.queue[0][0] if self.queue else float("inf")

    def step(self) -> None:
        """Run the earliest call."""
        try:
            self.now, _, fn, args = heapq.heappop(self.queue)
        except IndexError:
            raise EmptyClock("no call is scheduled") from None
        fn(*args)

    def run(self, until: float | None = None) -> None:
        """Run calls until none is left or, with ``until``, those due before it (SimPy's ``run(until)``
        stops before the calls due at ``until`` itself), and then stand at ``until``."""
        while self.queue and (until is None or self.queue[0][0] < until):
            self.step()
        if until is not None and until > self.now:
            self.now = until


class Chain:
    """Calls on ``clock`` whose times mostly come in order: only the earliest of them waits in its heap.

    ``call_in(delay, fn, *args)`` is ``clock.call_in``'s: a call due no earlier than the chain's last
    waits in a deque behind the chain's call in the heap, and goes into the heap, with the sequence number
    it drew when it was made, as that one runs; a call due earlier than the chain's last goes into the
    heap at once. Every call in the deque is due after the chain's call in the heap (its time is no earlier
    and its sequence number is larger), so the clock's earliest call is always in its heap."""

    __slots__ = ("clock", "_waiting", "_last", "_in_heap")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._waiting: deque[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = deque()
        self._last = -math.inf  # the time of the chain's latest call (-inf: the chain is empty)
        self._in_heap = False  # the chain's earliest call is in the clock's heap

    def call_in(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` ``delay`` seconds from now (``Clock.call_in``)."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        clock = self.clock
        at, sequence = clock.now + delay, next(clock.sequence)
        if at < self._last:  # out of order: into the heap, as Clock.call_in puts it
            heappush(clock.queue, (at, sequence, fn, args))
            return
        self._last = at
        entry = (at, sequence, self._run, (fn, args))
        if self._in_heap:
            self._waiting.append(entry)
        else:
            heappush(clock.queue, entry)
            self._in_heap = True

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self._waiting:  # the next call of the chain takes this one's place in the heap
            heappush(self.clock.queue, self._waiting.popleft())
        else:
            self._in_heap, self._last = False, -math.inf
        fn(*args)
