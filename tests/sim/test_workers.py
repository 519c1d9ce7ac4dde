"""Simulation worker processes (gyre.sim.workers): same results as in-process, and no garbage left per job."""

from __future__ import annotations

import gc
import weakref

from gyre.sim.workers import FULL_PASS_EVERY, collecting, simulation_pool

_KEPT: list[weakref.ref] = []
_HELD: list[object] = []


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


def _hold_a_cycle_past_its_job_then_drop_it(job: int) -> bool:
    """Job 0 makes a cycle and keeps it (it outlives the job's collection); job 1 drops it, so it is garbage
    older than a job. Each job says whether it is gone yet."""
    if job == 0:
        _HELD.append(_Node())
        _KEPT.append(weakref.ref(_HELD[0]))
    elif job == 1:
        _HELD.clear()
    return _KEPT[-1]() is None


def test_garbage_older_than_a_job_is_freed_by_the_periodic_full_pass():
    with simulation_pool(1) as pool:
        gone = list(pool.map(collecting(_hold_a_cycle_past_its_job_then_drop_it), range(FULL_PASS_EVERY + 1)))
    assert not any(gone[:FULL_PASS_EVERY])  # a young pass does not rescan what outlived a job
    assert gone[FULL_PASS_EVERY]  # the full pass after the 16th job freed it
