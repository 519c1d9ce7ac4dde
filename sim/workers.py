"""Worker processes for many simulations (``gyre sweep``, ``gyre plan``), each collecting its garbage per job.

A simulation runs with Python's cyclic collector paused (``driver.cyclic_gc_paused``):
what it allocates lives until it ends and is then one cyclic graph. In a process
that does nothing else, collecting that graph by the collector's own schedule
costs several passes over it (young, then older generations), and its full
passes also rescan every module the process imported. A worker of
``simulation_pool`` therefore runs with the collector off for good, with what it
inherited at fork (modules, traces) frozen out of collection (``gc.freeze``),
and collects once after each job (``collecting``), a pass over that job's
objects alone: the youngest generation, where everything allocated since the
last pass lies while the collector is off. What outlived a job (a cache's
lists, say) moves to an older generation and is not rescanned after every
job (a full pass over a sweep worker's caches cost ~4% of a schedule's CPU);
garbage that forms among such older objects is freed by a full pass every
``FULL_PASS_EVERY`` jobs.

Invariants: ``pool.map(collecting(fn), items)`` returns exactly what
``[fn(item) for item in items]`` returns, in item order; after each job a
worker holds no garbage of it (its memory does not grow job after job), and
garbage older than a job lives at most ``FULL_PASS_EVERY`` jobs more.
"""

from __future__ import annotations

import gc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

FULL_PASS_EVERY = 16  # jobs between full collections in a worker
_jobs_done = 0  # by this worker process


def simulation_pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` worker processes set up for simulations (see the module docstring)."""
    return ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker)


def _start_worker() -> None:
    global _jobs_done
    _jobs_done = 0
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
            _collect_after_job()


def _collect_after_job() -> None:
    """The job's garbage (the youngest generation); all of it, older too, every ``FULL_PASS_EVERY`` jobs."""
    global _jobs_done
    _jobs_done += 1
    gc.collect(0 if _jobs_done % FULL_PASS_EVERY else 2)
