"""Simulation worker processes (gyre.sim.workers): same results as in-process, and no garbage left per job."""

from __future__ import annotations

import gc
import weakref

from gyre.sim.workers import collecting, simulation_pool

_KEPT: list[weakref.ref] = []


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def _square_and_leave_a_cycle(x: int) -> tuple[int, bool, bool]:
    """Leaves one cyclic object behind and says whether the previous job's one is gone."""
    previous_gone = all(ref() is None for ref in _KEPT)
    _KEPT.append(weakref.ref(_Node()))
    return x * x, previous_gone, gc.isenabled()


def test_a_pool_maps_in_item_order_and_each_job_leaves_no_garbage():
    items = list(range(12))
    with simulation_pool(1) as pool:
        results = list(pool.map(collecting(_square_and_leave_a_cycle), items))
    assert [r[0] for r in results] == [x * x for x in items]  # what the function gives, in order
    assert all(gone for _, gone, _ in results)  # each job's cycle was collected before the next job
    assert not any(enabled for _, _, enabled in results)  # workers collect per job, not by schedule
    assert gc.isenabled()  # the calling process is untouched


def test_without_collecting_a_worker_keeps_the_garbage():
    with simulation_pool(1) as pool:
        results = list(pool.map(_square_and_leave_a_cycle, range(3)))
    assert [gone for _, gone, _ in results] == [True, False, False]  # the check above can fail
