"""The write timeout of every event stream, kept by one periodic check instead of a timer per write.

A stream marks the start and the end of each of its socket writes
(``Watch.begin`` / ``Watch.end``: an attribute store each). ``WriteWatchdog.run``
wakes every ``period_s`` and aborts the connection of any stream whose current
write began more than ``timeout_s`` ago; the stream's pending write then returns
or fails, ``Watch.end`` raises ``ConnectionResetError`` if it returned, and
``Watch.cut`` tells the stream it was cut off, not left by its client.

Why: an ``asyncio.timeout`` rescheduled around each write made and cancelled a
loop timer per write, 3-4% of the proxy's CPU time per call (py-spy, one client);
a write almost never blocks (only when a client reads more slowly than its stream
is produced).

Invariants:
- a write that has not finished ``timeout_s`` after it began has its connection
  aborted within ``timeout_s + period_s`` (``period_s`` = timeout / 4, at most 1 s);
- a stream between writes (waiting for its engine) is never cut;
- once cut, a stream writes nothing more: ``end`` raises before it could ask for
  its next chunk (so its generation is stopped where the write stalled);
- a stream is watched only between ``watch`` and ``release``: the watchdog holds
  nothing of a finished stream.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


class Watch:
    """One stream's write in progress (``since``: when it began, or ``None``) and whether it was cut."""

    __slots__ = ("transport", "since", "cut", "_clock")
    transport: asyncio.Transport | None  # the stream's connection (``check`` aborts it); None: the request had none
    since: float | None
    cut: bool
    _clock: Callable[[], float]

    def __init__(self, transport: asyncio.Transport | None, clock: Callable[[], float]) -> None:
        self.transport, self.since, self.cut, self._clock = transport, None, False, clock

    def begin(self) -> None:
        self.since = self._clock()

    def end(self) -> None:
        """The write returned: ``ConnectionResetError`` if the watchdog cut its connection meanwhile (an
        aborted connection may wake a stalled write without an error)."""
        if self.cut:
            raise ConnectionResetError("write timed out; connection aborted")
        self.since = None


class WriteWatchdog:
    """Cuts off streams whose write stalls for ``timeout_s`` (see the module doc)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ValueError(f"write timeout must be > 0 s, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.period_s = min(1.0, self.timeout_s / 4)
        self.clock = clock
        self._watches: set[Watch] = set()

    def watch(self, transport: Any) -> Watch:
        watch = Watch(transport, self.clock)
        self._watches.add(watch)
        return watch

    def release(self, watch: Watch) -> None:
        self._watches.discard(watch)

    def check(self) -> list[Watch]:
        """Abort the connections of the writes stalled past the timeout; returns their watches."""
        now = self.clock()
        stalled = [w for w in self._watches if w.since is not None and now - w.since > self.timeout_s]
        for watch in stalled:
            watch.cut = True
            self._watches.discard(watch)
            if watch.transport is not None:
                watch.transport.abort()
        return stalled

    async def run(self) -> None:
        """``check`` every ``period_s``, until cancelled."""
        while True:
            await asyncio.sleep(self.period_s)
            self.check()

    def __len__(self) -> int:
        return len(self._watches)
