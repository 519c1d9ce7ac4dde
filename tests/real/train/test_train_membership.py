"""Join seats, prefix decisions and per-batch queues of the training plane (one process, real TCPStore)."""

from __future__ import annotations

import datetime
import threading

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from gyre.real.train.context import CellConfig  # noqa: E402
from gyre.real.train.membership import (  # noqa: E402
    BARRED, CLOSED, JOINED, MEMBER, BatchQueues, ControlStore, close_window, open_window,
    participating_prefix, take_seat)
from gyre.real.toy.microsteps import feed, toy_batch  # noqa: E402


@pytest.fixture()
def control():
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=10),
                          wait_for_workers=False)
    return ControlStore(store)


def test_seat_is_either_taken_or_closed_never_both(control):
    open_window(control, 0, 0, {"s": 1}, cells=4, members={2}, barred={3})
    assert take_seat(control, 0, 1) == JOINED
    assert take_seat(control, 0, 2) == MEMBER
    assert take_seat(control, 0, 3) == BARRED
    assert close_window(control, 0, 4) == [1, 2]
    assert take_seat(control, 1, 1) == JOINED  # a later step has its own seats
    open_window(control, 2, 2, {}, cells=3, members=set(), barred=set())
    assert close_window(control, 2, 3) == []
    assert take_seat(control, 2, 1) == CLOSED


def test_racing_joiners_and_close_agree(control):
    """Many threads race take_seat against close_window: each seat ends in exactly one state."""
    cells = 9
    open_window(control, 5, 5, {}, cells=cells, members=set(), barred=set())
    answers: dict[int, str] = {}
    threads = [threading.Thread(target=lambda c=c: answers.__setitem__(c, take_seat(control, 5, c)))
               for c in range(1, cells)]
    for t in threads[:4]:
        t.start()
    seated = close_window(control, 5, cells)
    for t in threads[4:]:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c for c, a in answers.items() if a == JOINED) == seated
    assert all(a in (JOINED, CLOSED) for a in answers.values())


@pytest.mark.parametrize("seated, failed, expected", [
    ([], set(), (0, [])),
    ([1, 2, 3], set(), (3, [])),
    ([1, 2, 3], {2}, (1, [3])),
    ([1, 2, 3], {1}, (0, [2, 3])),
    ([2, 3], set(), (0, [2, 3])),
    ([1, 2], {2}, (1, [])),
])
def test_participating_prefix(seated, failed, expected):
    last, discard = participating_prefix(seated, failed)
    assert (last, discard) == expected
    assert set(range(1, last + 1)).isdisjoint(discard)


def test_batch_queues_route_requeue_and_size(tmp_path):
    queues = BatchQueues(tmp_path)
    feed(queues, toy_batch(1, 0, 3))
    feed(queues, toy_batch(2, 1, 2), close=False)
    assert queues.batch_size(0) == 3
    with pytest.raises(ValueError, match="not closed"):
        queues.batch_size(1)
    first = queues.queue(0).claim("cell2")
    assert first.batch_id == 0 and queues.claimed_by(0, "cell2") == [first.name]
    assert queues.queue(1).claim("cell2").batch_id == 1  # claims never cross batches
    queues.requeue(0, [first.name])
    assert queues.claimed_by(0, "cell2") == [] and queues.queue(0).ready_count() == 3
    with pytest.raises(ValueError, match="not claimed"):
        queues.requeue(0, [first.name])
    for _ in range(3):
        queues.queue(0).claim("cell0")
    assert queues.drained(0) and not queues.drained(1)


def test_wait_has_a_deadline(control):
    with pytest.raises(TimeoutError, match="the core's decision"):
        control.wait("decision/9", 0.05, "the core's decision")


def test_cell_config_rejects_bad_values():
    with pytest.raises(ValueError, match="transport"):
        CellConfig(cells=2, store_port=1, queue_root="q", workdir="w", transport="nccl-p2p")
    with pytest.raises(ValueError, match="cells"):
        CellConfig(cells=0, store_port=1, queue_root="q", workdir="w")
