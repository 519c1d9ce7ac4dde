"""The proxy process's garbage collector: tuned for a long-lived server, and watched.

``tune("tuned")`` (what ``gyre proxy`` does once the server is built, before it
listens) freezes every object alive then (about 226k: transformers, the
tokenizer, numpy) out of every later collection, and lets the youngest
generation wait for ``THRESHOLD0`` new container objects instead of CPython's
700; ``tune("default")`` leaves CPython's settings (``gyre proxy --gc default``,
for comparison). Either way ``stats()`` counts the collections since ``tune``,
their total time and the longest one; ``GET /`` reports them.

Why (``GYRE_BENCH_PROXY=rps,gc python -m bench proxy``, 4 s windows): with
CPython's defaults the collector took 7% of the proxy's CPU time at 64 clients
and 22% at 384, and each full collection stopped every stream for 180-210 ms
to traverse the startup objects again; tuned, it took under 1% and its longest
pause was 20-46 ms, since almost every object a call makes is freed before a
collection comes.

Invariants: ``tune`` runs once per process (a second call is an error);
``stats()`` never decreases within a process.
"""

from __future__ import annotations

import gc
import time
from typing import Any

THRESHOLD0 = 50_000  # new container objects between youngest-generation collections (CPython: 700)
MODES = ("tuned", "default")

_stats: dict[str, Any] = {"mode": None, "collections": 0, "seconds": 0.0, "longest_ms": 0.0}
_started = [0.0]


def _watch(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    spent = time.perf_counter() - _started[0]
    _stats["collections"] += 1
    _stats["seconds"] += spent
    _stats["longest_ms"] = max(_stats["longest_ms"], spent * 1e3)


def tune(mode: str = "tuned") -> None:
    """Apply ``mode`` (see the module doc) and start counting collections."""
    if mode not in MODES:
        raise ValueError(f"gc mode must be one of {MODES}, got {mode!r}")
    if _stats["mode"] is not None:
        raise RuntimeError("the proxy's garbage collector was already tuned in this process")
    if mode == "tuned":
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(THRESHOLD0, older, oldest)
    _stats["mode"] = mode
    gc.callbacks.append(_watch)


def stats() -> dict[str, Any]:
    """Mode, frozen objects, youngest threshold, and the collections since ``tune``."""
    return dict(_stats, frozen=gc.get_freeze_count(), threshold0=gc.get_threshold()[0])
