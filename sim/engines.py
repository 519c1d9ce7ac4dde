"""Load-dependent rollout engines: processor sharing, one virtual clock per engine and model-call share.

An execution brings *work*: its harness time at the reference load, of which
a *model-call share* m is spent in model calls and the rest in tool, sandbox
and evaluation time. All model calls on one engine progress at the same
rate ``speed(load)``, where ``load`` is the number of executions on that
engine now; tool time does not depend on the load. Calls and tools
interleave finely, so an execution gains ``effective_speed(m, speed) =
1 / ((1 - m) + m / speed)`` harness-seconds per second (docs/simulator.md
section 2). The rate changes only when an execution starts on, finishes
on, is cancelled from, or is rerouted to or from that engine. The
per-request curve (``EngineCurve``) is

    rate(L) = 1 / (1 + a * x(L)),   x(L) = (L - 1) / (C - 1)

(C the engine's capacity; x = 0 for a lone request and 1 for a full engine),
so aggregate throughput ``L * rate(L)`` saturates, and ``speed`` is
``rate(L) / rate(L_ref)`` with ``L_ref = reference_load * C``: at the
reference load every execution takes exactly its trace duration. ``a = 0``
makes engines load-independent (every execution takes its trace duration).
``a`` is fitted to SGLang measurements by ``fit_load_alpha`` (see
``bench/bench_engine_concurrency.py`` and ``MEASURED``): those are rates of
model calls alone, so the law applies to the model-call share only. The
relative load x is the same whether it counts the executions on an engine
or those in a call at one moment (m L of m C, for a uniform share and large C).

Scheme: each engine keeps one virtual clock V per model-call share among its
executions (harness-seconds received by each of them since the engine was
created), advanced lazily to the current time whenever its load changes; an
execution finishes when its clock reaches its finish tag ``F = V(start) +
work`` (reroutes re-tag it on the destination with its remaining work); one
with infinite work (a stuck trace row, ended by its deadline) never finishes
and stays out of its clock's finish heap. Each
engine has at most one live SimPy timeout, re-armed once per change of that
engine (``flush``), never one per execution.

Invariants (tested in tests/sim/test_processor_sharing*.py and
test_wall_clock_deadlines.py): an execution's integral of
``effective_speed(m, speed)`` over its time on engines equals its work (plus
any added work) when it finishes; at constant load ``L_ref`` durations are the
work exactly; an execution finishes exactly once and never after removal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Callable, Iterable

from gyre.sim.clock import Clock

# SGLang 0.5.23 CPU engine, measured 2026-12-02 23:45 UTC on the 2-core machine shared with
# other jobs (AMD EPYC, float32, torch_native attention, one engine) by
# bench/bench_engine_concurrency.py: (concurrency, aggregate decode tokens/s, per-request
# tokens/s), 64 output tokens, 16 prompt tokens, best of 5 interleaved repeats. "tiny" is the
# tests' 2-layer hidden-64 Qwen2 built from a config. Fit: a = 1.42 (fitted relative rates
# 1, 0.913, 0.778, 0.601, 0.413 against measured 1, 0.883, 0.754, 0.578, 0.420); an earlier
# run (median of 3) gave a = 1.52.
MEASURED: dict[str, tuple[tuple[int, float, float], ...]] = {
    "tiny": ((1, 388.4, 389.2), (2, 683.4, 343.6), (4, 1159.2, 293.5), (8, 1765.4, 224.8), (16, 2544.2, 163.5)),
}
DEFAULT_MODEL = "tiny"


def fit_load_alpha(points: Iterable[tuple[int, float]]) -> float:
    """Least-squares ``a`` of ``rate(c) = rate(1) / (1 + a * (c-1)/(c_max-1))`` from (concurrency, rate) points.

    ``1/rel - 1`` is linear in ``a`` (``rel`` the rate relative to concurrency 1), so the fit is closed-form.
    Needs concurrency 1 and at least one other level; the result is clipped at 0 (no engine speeds up
    with load)."""
    points = sorted(points)
    if not points or points[0][0] != 1 or len(points) < 2:
        raise ValueError(f"fit_load_alpha needs concurrency 1 and at least one higher level, got {points}")
    if any(r <= 0 or not math.isfinite(r) for _, r in points):
        raise ValueError(f"fit_load_alpha needs positive finite rates, got {points}")
    c_max, base = points[-1][0], points[0][1]
    xs = [(c - 1) / (c_max - 1) for c, _ in points[1:]]
    ys = [base / r - 1 for _, r in points[1:]]
    return max(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))


DEFAULT_ALPHA = fit_load_alpha((c, per) for c, _agg, per in MEASURED[DEFAULT_MODEL])


@dataclass(frozen=True)
class EngineCurve:
    """Per-request rate against load; ``speed`` is normalised to 1 at the reference load."""

    alpha: float
    reference_load: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"engine_load_alpha must be a finite number >= 0, got {self.alpha!r}")
        if not (math.isfinite(self.reference_load) and self.reference_load > 0):
            raise ValueError(f"engine_reference_load must be a finite number > 0, got {self.reference_load!r}")

    def rate(self, load: float, capacity: int) -> float:
        """Per-request rate relative to a lone request (1 at load 1)."""
        return 1.0 / (1.0 + self.alpha * max(0.0, load - 1) / max(1, capacity - 1))

    def speed(self, load: int, capacity: int) -> float:
        """Work-seconds per second of each execution on an engine of ``capacity`` running ``load`` executions."""
        if self.alpha == 0:
            return 1.0
        return self.rate(load, capacity) / self.rate(max(1.0, self.reference_load * capacity), capacity)

    def speed_range(self, capacity: int) -> tuple[float, float]:
        """(slowest, fastest) model-call speed on an engine of ``capacity``: full, and a lone request."""
        return self.speed(max(1, capacity), capacity), self.speed(1, capacity)


class _Clock:
    """One virtual clock of an engine: the executions on it that share one model-call share."""

    __slots__ = ("share", "v", "eff", "heap", "live")

    def __init__(self, share: float) -> None:
        self.share = share
        self.v = 0.0          # harness-seconds received by each execution of this class so far
        self.eff = 1.0        # harness-seconds per second at the engine's current speed
        self.heap: list[tuple[float, int]] = []  # (finite tag, execution), stale entries skipped lazily
        self.live = 0         # executions of this class on the engine now


def effective_speed(share: float, speed: float) -> float:
    """Harness-seconds per second of an execution spending ``share`` of its reference time in model calls.

    Its model calls run at ``speed`` and its tool, sandbox and evaluation time at 1, interleaved finely
    (docs/simulator.md section 2): one reference second takes ``(1 - share) + share / speed`` seconds."""
    return speed if share == 1.0 else 1.0 / ((1.0 - share) + share / speed)


class _Engine:
    __slots__ = ("capacity", "speeds", "t", "speed", "clocks", "tags", "armed_at", "dirty")

    def __init__(self, capacity: int, speeds: dict[int, float]) -> None:
        self.capacity = capacity
        self.speeds = speeds  # load -> curve.speed(load, capacity), shared by the engines of one capacity
        self.t = 0.0          # real time at which every clock was last brought up to date
        self.speed = 1.0      # model-call speed at the current load
        self.clocks: dict[float, _Clock] = {}  # model-call share -> its clock
        self.tags: dict[int, tuple[_Clock, float]] = {}   # execution -> (its clock, finish tag)
        self.armed_at = math.inf
        self.dirty = False


class EngineBank:
    """Every rollout engine of a simulation; calls ``on_finish(x)`` when an execution's work is done."""

    def __init__(self, env: Clock, curve: EngineCurve, capacity: Callable[[int], int],
                 on_finish: Callable[[int], None]) -> None:
        self.env, self.curve, self._capacity, self._on_finish = env, curve, capacity, on_finish
        self._engines: dict[int, _Engine] = {}
        self._where: dict[int, int] = {}
        self._dirty: list[_Engine] = []
        self._speeds: dict[int, dict[int, float]] = {}  # capacity -> load -> curve.speed: a pure function, hot
        self._fire_call = self._fire  # the timer's function, bound once (flush pushes it once per event)

    # ---- queries -------------------------------------------------------------------
    def load(self, engine: int) -> int:
        e = self._engines.get(engine)
        return len(e.tags) if e else 0

    def __contains__(self, x: int) -> bool:
        return x in self._where

    def remaining(self, x: int) -> float:
        """Work left to execution ``x`` (harness-seconds at the reference load)."""
        e = self._engines[self._where[x]]
        clock, tag = e.tags[x]
        return tag - (clock.v + (self.env.now - e.t) * clock.eff)

    def share(self, x: int) -> float:
        """The model-call share execution ``x`` runs with."""
        return self._engines[self._where[x]].tags[x][0].share

    # ---- changes (each marks its engine; ``flush`` re-arms the timers) ---------------
    def start(self, x: int, engine: int, work: float, share: float = 1.0) -> None:
        """Put ``x`` on ``engine`` with ``work`` harness-seconds, ``share`` of them model calls.

        Infinite work never runs out: such an execution leaves only by ``remove`` (a stuck trace row, ended
        by its deadline), and while it is its engine's earliest, the engine arms no timer."""
        if x in self._where:
            raise ValueError(f"execution {x} is already running on engine {self._where[x]}")
        if not 0.0 <= work <= math.inf:  # >= 0, infinity allowed (NaN fails both comparisons)
            raise ValueError(f"execution {x}: work must be a number >= 0, got {work!r}")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"execution {x}: model-call share must lie in [0, 1], got {share!r}")
        self.start_planned(x, engine, work, share)

    def start_planned(self, x: int, engine: int, work: float, share: float) -> None:
        """``start`` without its checks, for the driver's executions (once per execution): their work and share
        come from ``gyre.sim.deadlines.execution_plan``, which checks its grids once, and the policy core
        starts each execution once (only ``move`` starts one again, through ``start``)."""
        e = self._engines.get(engine)
        if e is None or not e.dirty or e.t != self.env.now:  # else _touch has nothing to do (after a finish)
            e = self._touch(engine)
        clock = e.clocks.get(share)
        if clock is None:
            clock = e.clocks[share] = _Clock(share)
            clock.eff = effective_speed(share, e.speed)
        tag = clock.v + work
        e.tags[x] = (clock, tag)
        clock.live += 1
        if tag < _INF:  # an infinite tag is never due: it would only deepen the heap
            heappush(clock.heap, (tag, x))
        self._where[x] = engine

    def remove(self, x: int) -> float:
        """Take ``x`` off its engine (cancelled, or stopped at its deadline); returns its remaining work."""
        e = self._touch(self._where.pop(x))
        clock, tag = e.tags.pop(x)
        clock.live -= 1
        return max(0.0, tag - clock.v)

    def move(self, x: int, dest: int, extra_work: float = 0.0) -> None:
        """Reroute ``x`` to ``dest`` with its remaining work plus ``extra_work`` (e.g. prefix recompute)."""
        share = self.share(x)
        self.start(x, dest, self.remove(x) + extra_work, share)

    def flush(self) -> None:
        """Re-evaluate the rate of every engine changed since the last flush and re-arm its timer."""
        dirty = self._dirty
        if not dirty:  # (after an event that changed no engine)
            return
        clock_ = self.env
        now = clock_.now
        while dirty:  # once per event: the timer's arming is written here, not in a method of its own
            e = dirty.pop()
            e.dirty = False
            tags = e.tags
            load = len(tags)
            speed = e.speeds.get(load)
            if speed is None:
                speed = e.speeds[load] = self.curve.speed(load, e.capacity)
            changed = speed != e.speed
            if changed:
                e.speed = speed
            due = _INF  # the earliest finish: each clock's first live tag, stale heap entries dropped
            for clock in e.clocks.values():  # (one loop: each clock's speed first, then its earliest finish)
                if changed:  # effective_speed, inlined (the same arithmetic): once per flush
                    share = clock.share
                    clock.eff = speed if share == 1.0 else 1.0 / ((1.0 - share) + share / speed)
                heap = clock.heap
                while heap:
                    tag, x = heap[0]
                    if tags.get(x, _GONE)[1] == tag:
                        left = tag - clock.v  # max(0, left) and min(due, at), as comparisons
                        at = e.t + (left if left > 0.0 else 0.0) / clock.eff
                        if at < due:
                            due = at
                        break
                    heappop(heap)  # removed or re-tagged
            if len(e.clocks) > 1:  # forget classes with no execution left (their heaps are empty by now)
                for share in [s for s, c in e.clocks.items() if not c.live]:
                    del e.clocks[share]
            if due != e.armed_at:
                e.armed_at = due
                if due < _INF:  # Clock.call_in(due - now, ...), pushed here (due >= now: e.t is now)
                    heappush(clock_.queue, (now + (due - now), next(clock_.sequence), self._fire_call, (e, due)))

    # ---- internals -------------------------------------------------------------------
    def _touch(self, engine: int) -> _Engine:
        e = self._engines.get(engine)
        if e is None:
            capacity = self._capacity(engine)
            e = self._engines[engine] = _Engine(capacity, self._speeds.setdefault(capacity, {}))
            e.t = self.env.now
        elif self.env.now != e.t:  # _advance's first test, here: most touches come at the same instant
            self._advance(e)
        if not e.dirty:
            e.dirty = True
            self._dirty.append(e)
        return e

    def _advance(self, e: _Engine) -> None:
        now = self.env.now
        if now != e.t:
            dt = now - e.t
            for clock in e.clocks.values():
                clock.v += dt * clock.eff
            e.t = now

    def _fire(self, e: _Engine, due: float) -> None:
        if e.armed_at != due:
            return  # superseded by a later re-arm
        e.armed_at = _INF
        now = self.env.now
        dt = now - e.t  # _advance, inlined (its clocks brought up to now, each in the loop below): once per finish
        e.t = now
        tags = e.tags
        done = []
        for clock in e.clocks.values():
            if dt:  # (0 when the engine changed at this instant: then the clocks are up to date)
                clock.v += dt * clock.eff
            v = clock.v
            size = v if v >= 0.0 else -v  # max(1.0, abs(v)), as comparisons: once per finish
            heap, limit = clock.heap, v + 1e-9 * (size if size > 1.0 else 1.0)
            while heap and heap[0][0] <= limit:
                tag, x = heappop(heap)
                held = tags.get(x)
                if held is not None and held[0] is clock and held[1] == tag:  # not removed, re-tagged or taken
                    del tags[x]
                    del self._where[x]
                    clock.live -= 1
                    done.append(x)
        if not e.dirty:
            e.dirty = True
            self._dirty.append(e)
        for x in done:
            self._on_finish(x)
        if self._dirty:
            self.flush()


_GONE = (None, math.nan)  # a tag no heap entry equals
_INF = math.inf  # (one global read where math.inf is two)
