"""Micro-step queues: atomic claims across threads and processes (microstep_queue.py)."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from gyre.real.store.microstep_queue import (DirectoryMicroStepQueue, InMemoryMicroStepQueue, load_microstep,
                                             save_microstep)
from gyre.trajectory.packing import MicroStep
from gyre.trajectory.rows import TokenRow


def step(batch: int, index: int, n_rows: int = 2) -> MicroStep:
    rng = np.random.default_rng(batch * 1000 + index)
    rows = tuple(
        TokenRow(f"e{index}-{r}", f"g{batch}", r + 1, rng.integers(0, 9, 5 + r).astype(np.int32),
                 rng.random(5 + r) < 0.5, -rng.random(5 + r), 0.25 * r, 0.1, 7)
        for r in range(n_rows)
    )
    return MicroStep(batch, index, rows, batch_executions=12)


def same(a: MicroStep, b: MicroStep) -> bool:
    meta = ("execution_id", "group_id", "leaf", "advantage", "weight", "execution_targets")
    arrays = ("input_ids", "target_mask", "behavior_logprobs")
    return (a.name, a.batch_executions) == (b.name, b.batch_executions) and len(a.rows) == len(b.rows) and all(
        all(getattr(x, k) == getattr(y, k) for k in meta) and all(np.array_equal(getattr(x, k), getattr(y, k))
                                                                  for k in arrays)
        for x, y in zip(a.rows, b.rows))


def test_save_and_load_round_trip(tmp_path):
    for original in (step(3, 4), step(0, 0, n_rows=0)):
        path = tmp_path / f"{original.name}.npz"
        save_microstep(original, path)
        assert same(load_microstep(path), original)


def test_in_memory_queue_threads_claim_each_step_exactly_once():
    queue = InMemoryMicroStepQueue()
    for i in range(400):
        queue.put(step(0, i, n_rows=1))
    queue.close_batch(0, 400)
    claimed: dict[str, list[str]] = {}

    def worker(name):
        mine = claimed.setdefault(name, [])
        while (s := queue.claim(name)) is not None:
            mine.append(s.name)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [n for mine in claimed.values() for n in mine]
    assert sorted(names) == sorted(step(0, i).name for i in range(400)) and len(set(names)) == 400
    assert queue.batch_closed(0) and queue.ready_count() == 0
    with pytest.raises(ValueError, match="closed"):
        queue.put(step(0, 999))


def _claim_all(root: str, worker: str, start, out) -> None:
    queue = DirectoryMicroStepQueue(root)
    start.wait()
    names = []
    while (s := queue.claim(worker)) is not None:
        names.append(s.name)
    out.put((worker, names))


def test_directory_queue_processes_claim_each_step_exactly_once(tmp_path):
    queue = DirectoryMicroStepQueue(tmp_path / "q")
    expected = []
    for i in range(240):
        s = step(i // 100, i % 100, n_rows=1)
        queue.put(s)
        expected.append(s.name)
    queue.close_batch(0, 100)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(str(tmp_path / "q"), f"p{i}", start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    names = [n for mine in results.values() for n in mine]
    assert sorted(names) == sorted(expected) and len(names) == len(set(names))
    claims = queue.claims()
    assert all(claims[n] == w for w, mine in results.items() for n in mine)
    assert queue.batch_closed(0) and not queue.batch_closed(2) and queue.ready_count() == 0


def test_directory_queue_claims_in_put_order_and_refuses_bad_puts(tmp_path):
    queue = DirectoryMicroStepQueue(tmp_path / "q")
    for index in (2, 0, 1):
        queue.put(step(0, index))
    assert [queue.claim("w").index for _ in range(3)] == [0, 1, 2]
    assert queue.claim("w") is None
    with pytest.raises(ValueError, match="already put"):
        queue.put(step(0, 1))
    queue.close_batch(0, 3)
    with pytest.raises(ValueError, match="closed"):
        queue.put(step(0, 7))
    with pytest.raises(ValueError, match="worker"):
        queue.claim("bad/worker")
