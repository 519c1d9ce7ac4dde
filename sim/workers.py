"""Worker processes for many simulations (``gyre sweep``, ``gyre plan``), each collecting its garbage per job.

A simulation runs with Python's cyclic collector paused (``driver.cyclic_gc_paused``):
what it allocates lives until it ends and is then one cyclic graph. In a process
that does nothing else, collecting that graph by the collector's own schedule
costs several passes over it (young, then older generations), and its full
passes also rescan every module the process imported. A worker of
``simulation_pool`` therefore runs with the collector off for good, with what it
inherited at fork (modules, traces) frozen out of collection (``gc.freeze``),
and collects once after each job (``collecting``), a pass over that job's
objects alone.

Invariants: ``pool.map(collecting(fn), items)`` returns exactly what
``[fn(item) for item in items]`` returns, in item order; after each job a
worker holds no garbage of it (its memory does not grow job after job).
"""

from __future__ import annotations

import gc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable


def simulation_pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` worker processes set up for simulations (see the module docstring)."""
    return ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker)


def _start_worker() -> None:
    gc.freeze()
    gc.disable()


@dataclass(frozen=True)
class collecting:  # noqa: N801  a function wrapper, named as one
    """``fn``, followed by one collection in the worker that ran it (picklable when ``fn`` is)."""

    fn: Callable[[Any], Any]

    def __call__(self, item: Any) -> Any:
        try:
            return self.fn(item)
        finally:
            gc.collect()
