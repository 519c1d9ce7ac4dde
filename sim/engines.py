"""Load-dependent rollout engines: processor sharing with one virtual clock per engine.

An execution brings *work*: its trace duration, i.e. the seconds it takes on
an engine running at the reference load. All executions on one engine progress
at the same rate ``speed(load)`` (work-seconds per second), where ``load`` is
the number of executions on that engine now; the rate changes only when an
execution starts on, finishes on, is cancelled from, or is rerouted to or
from that engine. The per-request curve (``EngineCurve``) is

    rate(L) = 1 / (1 + a * x(L)),   x(L) = (L - 1) / (C - 1)

(C the engine's capacity; x = 0 for a lone request and 1 for a full engine),
so aggregate throughput ``L * rate(L)`` saturates, and ``speed`` is
``rate(L) / rate(L_ref)`` with ``L_ref = reference_load * C``: at the
reference load every execution takes exactly its trace duration. ``a = 0``
makes engines load-independent (every execution takes its trace duration).
``a`` is fitted to SGLang measurements by ``fit_load_alpha`` (see
``bench/bench_engine_concurrency.py`` and ``MEASURED``).

Scheme: each engine keeps a virtual clock V (work-seconds received by each of
its executions since the engine was created), advanced lazily to the current
time whenever its load changes; an execution finishes when V reaches its
finish tag ``F = V(start) + work`` (reroutes re-tag it on the destination
with its remaining work). Each engine has at most one live SimPy timeout,
re-armed once per change of that engine (``flush``), never one per execution.

Invariants (tested in tests/sim/test_processor_sharing*.py): an execution's
integral of ``speed`` over its time on engines equals its work (plus any
added work) when it finishes; at constant load ``L_ref`` durations are the
work exactly; an execution finishes exactly once and never after removal.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Iterable

import simpy

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


class _Engine:
    __slots__ = ("capacity", "v", "t", "speed", "tags", "heap", "armed_at", "dirty")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.v = 0.0          # virtual clock: work received by each execution here so far
        self.t = 0.0          # real time at which v was last brought up to date
        self.speed = 1.0
        self.tags: dict[int, float] = {}   # execution -> finish tag
        self.heap: list[tuple[float, int]] = []  # (tag, execution), stale entries skipped lazily
        self.armed_at = math.inf
        self.dirty = False


class EngineBank:
    """Every rollout engine of a simulation; calls ``on_finish(x)`` when an execution's work is done."""

    def __init__(self, env: simpy.Environment, curve: EngineCurve, capacity: Callable[[int], int],
                 on_finish: Callable[[int], None]) -> None:
        self.env, self.curve, self._capacity, self._on_finish = env, curve, capacity, on_finish
        self._engines: dict[int, _Engine] = {}
        self._where: dict[int, int] = {}
        self._dirty: list[_Engine] = []
        self._speeds: dict[tuple[int, int], float] = {}  # (load, capacity) -> curve.speed: a pure function, hot

    # ---- queries -------------------------------------------------------------------
    def load(self, engine: int) -> int:
        e = self._engines.get(engine)
        return len(e.tags) if e else 0

    def __contains__(self, x: int) -> bool:
        return x in self._where

    def remaining(self, x: int) -> float:
        """Work left to execution ``x`` (reference-load seconds)."""
        e = self._engines[self._where[x]]
        return e.tags[x] - (e.v + (self.env.now - e.t) * e.speed)

    # ---- changes (each marks its engine; ``flush`` re-arms the timers) ---------------
    def start(self, x: int, engine: int, work: float) -> None:
        if x in self._where:
            raise ValueError(f"execution {x} is already running on engine {self._where[x]}")
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"execution {x}: work must be a finite number >= 0, got {work!r}")
        e = self._touch(engine)
        tag = e.v + work
        e.tags[x] = tag
        heapq.heappush(e.heap, (tag, x))
        self._where[x] = engine

    def remove(self, x: int) -> float:
        """Take ``x`` off its engine (cancelled); returns its remaining work."""
        e = self._touch(self._where.pop(x))
        return max(0.0, e.tags.pop(x) - e.v)

    def move(self, x: int, dest: int, extra_work: float = 0.0) -> None:
        """Reroute ``x`` to ``dest`` with its remaining work plus ``extra_work`` (e.g. prefix recompute)."""
        self.start(x, dest, self.remove(x) + extra_work)

    def flush(self) -> None:
        """Re-evaluate the rate of every engine changed since the last flush and re-arm its timer."""
        while self._dirty:
            e = self._dirty.pop()
            e.dirty = False
            key = (len(e.tags), e.capacity)
            speed = self._speeds.get(key)
            if speed is None:
                speed = self._speeds[key] = self.curve.speed(*key)
            e.speed = speed
            self._arm(e)

    # ---- internals -------------------------------------------------------------------
    def _touch(self, engine: int) -> _Engine:
        e = self._engines.get(engine)
        if e is None:
            e = self._engines[engine] = _Engine(self._capacity(engine))
            e.t = self.env.now
        else:
            self._advance(e)
        if not e.dirty:
            e.dirty = True
            self._dirty.append(e)
        return e

    def _advance(self, e: _Engine) -> None:
        now = self.env.now
        if now != e.t:
            e.v += (now - e.t) * e.speed
            e.t = now

    def _arm(self, e: _Engine) -> None:
        heap, tags = e.heap, e.tags
        while heap and tags.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # removed or re-tagged
        if not heap:
            e.armed_at = math.inf
            return
        due = e.t + max(0.0, heap[0][0] - e.v) / e.speed
        if due == e.armed_at:
            return
        e.armed_at = due
        self.env.timeout(due - self.env.now).callbacks.append(lambda _ev, e=e, due=due: self._fire(e, due))

    def _fire(self, e: _Engine, due: float) -> None:
        if e.armed_at != due:
            return  # superseded by a later re-arm
        e.armed_at = math.inf
        self._advance(e)
        heap, tags = e.heap, e.tags
        limit = e.v + 1e-9 * max(1.0, abs(e.v))
        done = []
        while heap and heap[0][0] <= limit:
            tag, x = heapq.heappop(heap)
            if tags.get(x) == tag:  # not removed, re-tagged, or already taken (a move to the same engine)
                del tags[x]
                del self._where[x]
                done.append(x)
        if not e.dirty:
            e.dirty = True
            self._dirty.append(e)
        for x in done:
            self._on_finish(x)
        self.flush()
