"""The group commit's journal (real/store/commit_journal.py): a machine crash loses no acknowledged
record, however little of the logs' unsynced bytes reached the disk."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.store.commit_journal import JOURNAL_NAME, Journal, JournalBusy
from gyre.real.store.group_commit import GroupCommit
from gyre.real.store.durable import Disk
from gyre.real.store.tito_log import ExecutionStore, read_records
from test_store_tito_log import commit_all, record


class CrashDisk(Disk):
    """The store's disk, watched: what each record log held at its last sync (``synced``: what a crash
    keeps of it), and an I/O error for a journal write that holds a record marked to fail."""

    def __init__(self, doomed: list[bytes]) -> None:
        self.doomed = doomed
        self.synced: dict[Path, bytes] = {}

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if _path(fd).name == JOURNAL_NAME and any(name in data for name in self.doomed):
            raise OSError(5, "Input/output error")
        return super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self._seen(fd)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._seen(fd)

    def _seen(self, fd: int) -> None:
        path = _path(fd)
        if path.suffix == ".tito":
            self.synced[path] = path.read_bytes()


def _path(fd: int) -> Path:
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


def crash_image(root: Path, image: Path, synced: dict[Path, bytes], rng: np.random.Generator) -> None:
    """What a machine crash may leave of ``root`` in ``image``: the journal as synced (all of it:
    nothing is written to it after its last sync); of each log, what its last sync made durable,
    overlaid with a random prefix of what it holds now (pages written back since) but for a random
    run inside it (pages never written back: the durable bytes, or zeros past them); a log never
    synced may be missing altogether."""
    image.mkdir()
    shutil.copyfile(root / JOURNAL_NAME, image / JOURNAL_NAME)
    for path in root.glob("*.tito"):
        durable, now = synced.get(path, b""), path.read_bytes()
        if not durable and rng.random() < 0.3:
            continue
        kept = int(rng.integers(0, len(now) + 1))
        data = bytearray(now[:kept] + durable[kept:])
        if kept:  # a run of pages not written back: the durable bytes there, or a hole (zeros) past them
            start = int(rng.integers(0, kept))
            end = min(start + int(rng.integers(1, 200)), kept)
            data[start:end] = (durable[start:end] + bytes(end - start))[:end - start]
        (image / path.name).write_bytes(bytes(data))


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 400), st.booleans()), min_size=1, max_size=30),
       capacity=st.sampled_from([700, 4000, 1 << 20]), width=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_a_machine_crash_loses_no_acknowledged_record(tmp_path_factory, plan, capacity, width, seed):
    """Records committed through a group commit (with checkpoints when the journal is small, and
    batches whose journal write fails when they hold a record marked to fail), then a crash that
    keeps only what was synced of the logs (plus any part of the rest): the next group commit on
    the folder replays the journal, and every log holds its acknowledged records, in order, followed
    by nothing but records whose batch failed. Replaying again changes nothing; a cleanly closed group
    leaves nothing to replay."""
    root = tmp_path_factory.mktemp("crash")
    calls = [record(i, f"e{execution}", size) for i, (execution, size, _) in enumerate(plan)]
    doomed = [b'"request_id":"%s"' % c.request_id.encode() for c, (_, _, fail) in zip(calls, plan) if fail]
    disk = CrashDisk(doomed)

    # the store's disk (durable.Disk) is the seam: nothing of the store is patched
    group = GroupCommit(ExecutionStore(root, fsync=True, preallocate=False, disk=disk),
                        journal_capacity=capacity)
    outcomes: dict[str, BaseException | None] = {}
    for start in range(0, len(calls), width):  # batches then hold several logs
        outcomes.update(commit_all(group, calls[start:start + width]))
    image = root.parent / (root.name + "-image")
    crash_image(root, image, dict(disk.synced), np.random.default_rng(seed))
    group.close()  # the original folder, closed cleanly: nothing left to replay
    journal = Journal(root)
    assert journal.replay(lambda e: root / f"{e}.tito") == []
    journal.close()

    assert all(outcomes[c.request_id] is None for c, (_, _, fail) in zip(calls, plan) if not fail and width == 1)
    expected = {f"e{e}": [c for c in calls if c.execution_id == f"e{e}" and outcomes[c.request_id] is None]
                for e, _, _ in plan}
    for attempt in range(2):  # replaying a second time is replaying once
        reopened = GroupCommit(ExecutionStore(image, fsync=True, preallocate=False))
        reopened.close()
        for execution, records in expected.items():
            path = image / f"{execution}.tito"
            stored = read_records(path) if path.exists() else []
            assert stored[:len(records)] == records, (attempt, execution)
            # a record whose batch failed may survive a crash (like any write whose sync failed), but
            # only after every acknowledged record of its log
            assert all(outcomes[r.request_id] is not None for r in stored[len(records):]), (attempt, execution)


def test_a_second_group_commit_on_a_folder_in_use_is_refused_naming_it(tmp_path):
    """Two writers on one records folder (two proxies given the same folder) would interleave the
    journal: the second is refused before it replays or writes anything; once the first closes, a
    new one opens."""
    first = GroupCommit(ExecutionStore(tmp_path, fsync=True))
    assert first.commit_here(record(0, "e1", 20)) == (True, None)
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    with pytest.raises(JournalBusy, match=rf"{tmp_path} is in use"):
        GroupCommit(ExecutionStore(tmp_path, fsync=True))
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before
    first.close()
    second = GroupCommit(ExecutionStore(tmp_path, fsync=True))
    assert second.commit_here(record(1, "e1", 20)) == (True, None)
    second.close()
    assert [r.request_id for r in read_records(tmp_path / "e1.tito")] == ["r0", "r1"]


class OrderDisk(Disk):
    """The system disk, each write and sync noted in ``events`` (and a journal write failing on demand)."""

    def __init__(self, events: list[str]) -> None:
        self.events, self.fail_journal = events, False

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        journal = _path(fd).name == JOURNAL_NAME
        if journal and self.fail_journal:
            raise OSError(28, "no space left on device")
        self.events.append("journal write" if journal else "log write")
        return super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self.events.append("sync")
        super().fdatasync(fd)


def test_a_records_written_hook_runs_once_it_is_in_the_journal_before_the_sync_and_never_for_a_failed_write(tmp_path):
    events: list[str] = []
    disk = OrderDisk(events)
    group = GroupCommit(ExecutionStore(tmp_path, fsync=True, preallocate=False, disk=disk))
    try:
        for round_, fail in enumerate((False, True)):
            disk.fail_journal = fail
            events.clear()
            done = threading.Event()
            errors: list[BaseException | None] = []
            group.submit(record(round_), lambda error: (errors.append(error), events.append("done"), done.set()),
                         written=lambda: events.append("written"))
            assert done.wait(10)
            if fail:
                assert isinstance(errors[0], OSError) and "written" not in events and "done" in events
            else:
                assert errors == [None]
                assert events == ["log write", "journal write", "written", "sync", "done"]
    finally:
        disk.fail_journal = False
        group.close()
        group.store.close()
