"""Durable append-only record logs (storage.py), including a killed writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.trajectory.records import ModelCall, RecordError
from gyre.real.store.commit_journal import HEAD_MAGIC, JOURNAL_NAME
from gyre.real.store.durable import Disk
from gyre.real.store.tito_log import ExecutionStore, RecordLog, TornTailWarning, encode_frame, read_records

try:
    from held_calls import held
except ImportError:
    from ..held_calls import held


def record(i: int, execution: str = "e1", size: int = 50) -> ModelCall:
    rng = np.random.default_rng(i)
    return ModelCall(execution_id=execution, request_id=f"r{i}", input_ids=rng.integers(0, 1000, size),
                     output_ids=rng.integers(0, 1000, 7), output_logprobs=-rng.random(7), policy_version=i)


def write(path, n, **kw):
    with RecordLog(path, "e1", **kw) as log:
        for i in range(n):
            log.append(record(i))


def test_round_trip_in_order(tmp_path):
    path = tmp_path / "e1.tito"
    write(path, 5, fsync=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_records(path) == [record(i) for i in range(5)]


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(1, 400))
def test_torn_tail_is_skipped_with_a_warning_naming_file_and_offset(tmp_path_factory, cut):
    path = tmp_path_factory.mktemp("torn") / "e1.tito"
    write(path, 4)
    size = path.stat().st_size
    frame = len(path.read_bytes()) // 4
    os.truncate(path, size - min(cut, frame - 1))
    with pytest.warns(TornTailWarning, match=rf"e1\.tito: skipping torn tail at byte {3 * frame}"):
        assert read_records(path) == [record(i) for i in range(3)]


def test_corrupt_frame_stops_reading_there(tmp_path):
    path = tmp_path / "e1.tito"
    write(path, 3)
    data = bytearray(path.read_bytes())
    frame = len(data) // 3
    data[frame + 20] ^= 0xFF  # flip a payload byte of the second frame
    path.write_bytes(bytes(data))
    with pytest.warns(TornTailWarning, match="CRC mismatch"):
        assert read_records(path) == [record(0)]


def test_reopening_truncates_a_torn_tail_before_appending(tmp_path):
    path = tmp_path / "e1.tito"
    write(path, 3)
    os.truncate(path, path.stat().st_size - 5)
    with pytest.warns(TornTailWarning):
        log = RecordLog(path, "e1").open()
    assert log.count == 2
    log.append(record(9))
    log.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_records(path) == [record(0), record(1), record(9)]


def test_wrong_execution_is_refused(tmp_path):
    with RecordLog(tmp_path / "e1.tito", "e1") as log:
        with pytest.raises(RecordError, match="sent to the log of 'e1'"):
            log.append(record(0, execution="e2"))
        log.append(record(0))
    with pytest.raises(RecordError, match="other executions"):
        RecordLog(tmp_path / "e1.tito", "zz").open()


def test_store_keeps_one_log_per_execution(tmp_path):
    store = ExecutionStore(tmp_path / "store")
    for i in range(6):
        store.append(record(i, execution=f"e{i % 2}"))
    store.close()
    assert store.executions() == ["e0", "e1"]
    assert [r.request_id for r in store.read("e1")] == ["r1", "r3", "r5"]
    with pytest.raises(KeyError, match="no records stored for execution 'e7'"):
        store.read("e7")
    with pytest.raises(RecordError):
        store.path_for("../evil")


CONVERSATION = textwrap.dedent("""
    import numpy as np
    from gyre.trajectory.records import ModelCall

    def conversation():
        '''Records whose inputs extend earlier ones (delta frames), restarting now and then.'''
        context = np.zeros(0, dtype=np.int64)
        i = 0
        while True:
            rng = np.random.default_rng(i)
            if i % 25 == 0:
                context = rng.integers(0, 1000, 3000)
            output = rng.integers(0, 1000, 7)
            yield ModelCall(execution_id="e1", request_id=f"r{i}", input_ids=context, output_ids=output,
                            output_logprobs=-rng.random(7), policy_version=i)
            context = np.concatenate([context, output, rng.integers(0, 1000, 400)])
            i += 1
""")
WRITER = CONVERSATION + textwrap.dedent("""
    import sys
    from gyre.real.store.tito_log import RecordLog
    log = RecordLog(sys.argv[1], "e1", fsync=False).open()
    for call in conversation():
        log.append(call)
""")

CHUNKED_WRITER = CONVERSATION + textwrap.dedent("""
    # Like a writer that dies in the middle of a frame: each frame leaves in small pieces.
    import os, sys
    from gyre.real.store.tito_log import encode_frame
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for call in conversation():
        frame = encode_frame(call)
        for start in range(0, len(frame), 512):
            os.write(fd, frame[start : start + 512])
""")


def conversation(n: int) -> list[ModelCall]:
    namespace: dict = {}
    exec(CONVERSATION, namespace)
    generator = namespace["conversation"]()
    return [next(generator) for _ in range(n)]


def test_prefix_deltas_shrink_the_log_and_round_trip(tmp_path):
    calls = conversation(60)
    path = tmp_path / "e1.tito"
    with RecordLog(path, "e1") as log:
        for call in calls[:30]:
            log.append(call)
    with RecordLog(path, "e1") as log:  # reopening keeps deltas going from the last records
        for call in calls[30:]:
            log.append(call)
    full = sum(len(c.to_bytes()) for c in calls)
    assert path.stat().st_size < full / 5
    assert read_records(path) == calls
    with pytest.raises(RecordError, match="already in"):
        with RecordLog(path, "e1") as log:
            log.append(calls[3])


def test_a_delta_without_its_base_is_a_torn_tail(tmp_path):
    calls = conversation(3)
    path = tmp_path / "e1.tito"
    path.write_bytes(encode_frame(calls[0]) + encode_frame(calls[2], calls[1], len(calls[1].sequence)))
    with pytest.warns(TornTailWarning, match="base record 'r1'"):
        assert read_records(path) == calls[:1]


@pytest.mark.parametrize("writer", [WRITER, CHUNKED_WRITER], ids=["record-log", "chunked"])
@pytest.mark.parametrize("attempt", range(3))
def test_writer_killed_mid_stream_loses_at_most_the_record_being_written(tmp_path, attempt, writer):
    path = tmp_path / "e1.tito"
    proc = subprocess.Popen([sys.executable, "-c", writer, str(path)])
    try:
        deadline = time.monotonic() + 30
        while (not path.exists() or path.stat().st_size < 100_000 * (attempt + 1)) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(path)
    assert len(records) >= 5
    assert records == conversation(len(records))
    assert all(issubclass(w.category, TornTailWarning) for w in caught)


def commit_all(group, calls, on_done: Callable[[ModelCall], None] = lambda call: None):
    """Submit ``calls`` at once; returns {request_id: error or None} once every ``done`` ran (each
    acknowledgement first told to ``on_done``)."""
    results, finished = {}, threading.Event()

    def done_for(call):
        def done(error):
            on_done(call)
            results[call.request_id] = error
            if len(results) == len(calls):
                finished.set()
        return done

    for call in calls:
        group.submit(call, done_for(call))
    assert finished.wait(20)
    return results


class WatchedDisk(Disk):
    """The store's disk (``durable.Disk``, the seam its classes take): every write and sync is logged as
    (call, file name, data, thread) in ``events`` (shared with the test's own marks); ``fail`` may turn
    one into an OSError, as a full or broken disk would, and ``hold`` may keep one waiting."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.fail: Callable[[str, str, bytes], OSError | None] = lambda call, name, data: None
        self.hold: Callable[[str, str, bytes], None] = lambda call, name, data: None

    def _do(self, call: str, fd: int, data: bytes, then: Callable[[], Any]) -> Any:
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        self.hold(call, name, data)
        error = self.fail(call, name, data)
        if error is not None:
            raise error
        result = then()
        self.events.append((call, name, bytes(data), threading.current_thread().name))
        return result

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return self._do("pwrite", fd, data, lambda: super(WatchedDisk, self).pwrite(fd, data, offset))

    def fdatasync(self, fd: int) -> None:
        self._do("sync", fd, b"", lambda: super(WatchedDisk, self).fdatasync(fd))

    def fsync(self, fd: int) -> None:
        self._do("sync", fd, b"", lambda: super(WatchedDisk, self).fsync(fd))

    def entries(self) -> list[tuple]:
        """The commit journal's entry writes (not its header, nor the zeros it reserves)."""
        return [e for e in self.events if e[:2] == ("pwrite", JOURNAL_NAME) and any(e[2])
                and not e[2].startswith(HEAD_MAGIC)]


def test_group_commit_acknowledges_only_after_the_journal_sync_of_its_batch(tmp_path):
    """Between a record's write into its log and its acknowledgement lies the synced journal write
    of the same frame; one journal write per batch, however many logs it touched, and no log sync
    until the checkpoint at ``close``."""
    from gyre.real.store.group_commit import GroupCommit

    disk = WatchedDisk()
    store = ExecutionStore(tmp_path, fsync=True, preallocate=False, disk=disk)
    group = GroupCommit(store)
    calls = [record(i, execution=f"e{i % 3}") for i in range(30)]
    results = commit_all(group, calls, on_done=lambda call: disk.events.append(("done", call.request_id)))
    assert not [e for e in disk.events if e[0] == "sync" and e[1].endswith(".tito")]
    group.close()
    assert results == {c.request_id: None for c in calls}
    writes = {e: iter(i for i, ev in enumerate(disk.events) if ev[:2] == ("pwrite", f"{e}.tito"))
              for e in ("e0", "e1", "e2")}
    entries = disk.entries()
    for call in calls:  # a log's frames are written in the order of its calls (read back below)
        written = next(writes[call.execution_id])
        frame, acked = disk.events[written][2], disk.events.index(("done", call.request_id))
        journaled = [i for i in range(written, acked) if disk.events[i] in entries and frame in disk.events[i][2]]
        assert journaled and ("sync", JOURNAL_NAME, b"") in [e[:3] for e in disk.events[journaled[0]:acked]], call
    assert len(disk.entries()) == group.batches
    synced_logs = {e[1] for e in disk.events if e[0] == "sync" and e[1].endswith(".tito")}
    assert synced_logs == {"e0.tito", "e1.tito", "e2.tito"} and group.checkpoints == 1
    for e in ("e0", "e1", "e2"):
        assert store.read(e) == [c for c in calls if c.execution_id == e]


def test_group_commit_reports_failures_to_exactly_their_records(tmp_path):
    """A failed log write fails its record only; a failed journal write or sync fails every record
    of its batch and cuts their frames off their logs; a failed checkpoint sync fails the batch that
    needed it and retires nothing."""
    from gyre.real.store.group_commit import GroupCommit

    disk = WatchedDisk()
    store = ExecutionStore(tmp_path, fsync=True, preallocate=False, disk=disk)
    group = GroupCommit(store)
    assert commit_all(group, [record(0, "ok"), record(1, "bad")]) == {"r0": None, "r1": None}

    disk.fail = lambda call, name, data: OSError(5, "Input/output error") if name == "bad.tito" else None
    results = commit_all(group, [record(2, "ok"), record(3, "bad"), record(0, "ok")])  # r0: a duplicate id
    assert results["r2"] is None
    assert isinstance(results["r3"], OSError)
    assert isinstance(results["r0"], RecordError) and "already" in str(results["r0"])

    disk.fail = lambda call, name, data: OSError(28, "No space left on device") if name == JOURNAL_NAME else None
    done, error = group.commit_here(record(4, "ok"))
    assert done and isinstance(error, OSError) and "No space" in str(error)
    disk.fail = lambda call, name, data: None
    assert group.commit_here(record(5, "ok")) == (True, None)

    group.journal.capacity = 1  # every later batch needs a checkpoint first
    disk.fail = lambda call, name, data: OSError(5, "EIO") if call == "sync" and name.endswith(".tito") else None
    epoch = group.journal.epoch
    done, error = group.commit_here(record(6, "ok"))
    assert done and isinstance(error, OSError) and group.journal.epoch == epoch
    disk.fail = lambda call, name, data: None
    assert group.commit_here(record(7, "ok")) == (True, None) and group.journal.epoch == epoch + 1
    group.close()
    assert [r.request_id for r in store.read("ok")] == ["r0", "r2", "r5", "r7"]  # failed ones cut off
    with pytest.raises(RecordError, match="closed"):
        group.submit(record(9, "ok"), lambda error: None)


def test_commit_here_commits_on_the_callers_thread_only_while_the_writer_is_idle(tmp_path):
    """Idle writer: the record is written, journaled and acknowledged on the calling thread before
    ``commit_here`` returns. Writer busy with a batch: nothing happens and the caller is told so;
    the writer takes no batch while a ``commit_here`` runs."""
    from gyre.real.store.group_commit import GroupCommit

    release, appending = threading.Event(), threading.Event()
    disk = WatchedDisk()

    def hold(call, name, data):  # the journal write of execution "slow" waits for the test
        if name == JOURNAL_NAME and b"slow" in data:
            appending.set()
            assert release.wait(20)

    disk.hold = hold
    store = ExecutionStore(tmp_path, fsync=True, disk=disk)
    group = GroupCommit(store)
    assert group.commit_here(record(0, "e1")) == (True, None)
    assert [e[3] for e in disk.entries()] == [threading.current_thread().name] and group.here == 1
    assert b"e1" in disk.entries()[0][2] and store.read("e1") == [record(0, "e1")]

    acked = threading.Event()
    group.submit(record(1, "slow"), lambda error: acked.set())
    assert appending.wait(20)  # the writer is inside its batch
    assert group.commit_here(record(2, "e1")) == (False, None)
    release.set()
    assert acked.wait(20)
    assert group.commit_here(record(3, "e1")) == (True, None)
    group.close()
    assert [r.request_id for r in store.read("e1")] == ["r0", "r3"] and group.here == 2


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=40))
def test_commit_here_and_submit_mixed_from_many_threads_acknowledge_every_record_in_log_order(tmp_path_factory,
                                                                                            plan):
    """Threads committing at once, each record either ``commit_here`` (falling back to ``submit``)
    or ``submit``: every record is acknowledged once without error, each log holds exactly its
    records, and a log's order is the order in which its records were acknowledged."""
    import threading

    from gyre.real.store.group_commit import GroupCommit

    store = ExecutionStore(tmp_path_factory.mktemp("mixed"), fsync=True)
    group = GroupCommit(store)
    lock, acked, outcomes = threading.Lock(), {f"e{i}": [] for i in range(3)}, {}

    def acknowledge(call, error):
        with lock:
            outcomes[call.request_id] = error
            acked[call.execution_id].append(call.request_id)

    def commit(index, execution, here):
        call = record(index, f"e{execution}")
        if here:
            with lock:  # commit_here acknowledges by returning: note it in the same critical section
                done, error = group.commit_here(call)
                if done:
                    outcomes[call.request_id] = error
                    acked[call.execution_id].append(call.request_id)
                    return
        group.submit(call, lambda error: acknowledge(call, error))

    threads = [threading.Thread(target=commit, args=(i, e, here)) for i, (e, here) in enumerate(plan)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    group.close()
    assert sorted(outcomes) == sorted(f"r{i}" for i in range(len(plan))) and not any(outcomes.values())
    for execution, ids in acked.items():
        stored = [r.request_id for r in store.read(execution)] if ids else []
        assert stored == ids, execution


# -- preallocated space (durable logs) -----------------------------------------------------------

def test_a_durable_log_writes_frames_into_synced_zeros_without_growing_the_file(tmp_path):
    """Frames land inside the reserved zero tail (no size change, so ``fdatasync`` has no metadata to
    commit); the file grows only when the room runs out; a clean close leaves exactly the frames."""
    from gyre.real.store import tito_log

    disk = WatchedDisk()
    path = tmp_path / "e1.tito"
    log = RecordLog(path, "e1", fsync=True, disk=disk).open()
    log.append(record(0))
    size = path.stat().st_size
    assert size >= tito_log.MIN_ROOM
    for i in range(1, 20):
        log.append(record(i))
    synced = [e for e in disk.events if e[:2] == ("sync", "e1.tito")]
    assert path.stat().st_size == size and len(synced) == 21  # the zeros reserved once, then each frame
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a zero tail is not a torn tail
        assert read_records(path) == [record(i) for i in range(20)]
    log.close()
    assert path.stat().st_size < size
    assert read_records(path) == [record(i) for i in range(20)]
    assert path.read_bytes()[-4:] != bytes(4)


@settings(max_examples=30, deadline=None)
@given(records=st.integers(0, 6), zeros=st.integers(1, 70_000), garbage=st.booleans())
def test_zeros_after_the_last_frame_end_a_log_quietly_anything_else_is_torn(tmp_path_factory, records, zeros,
                                                                            garbage):
    path = tmp_path_factory.mktemp("zeros") / "e1.tito"
    data = b"".join(encode_frame(record(i)) for i in range(records))
    tail = bytearray(zeros)
    if garbage:
        tail[-1] = 7  # a non-zero byte anywhere in the tail: not preallocated space
    path.write_bytes(data + bytes(tail))
    if garbage:
        with pytest.warns(TornTailWarning, match=rf"at byte {len(data)}"):
            assert read_records(path) == [record(i) for i in range(records)]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert read_records(path) == [record(i) for i in range(records)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torn tail was reported above
        log = RecordLog(path, "e1", fsync=True).open()  # reopening drops the tail, appends after the frames
    log.append(record(99))
    log.close()
    assert read_records(path) == [record(i) for i in range(records)] + [record(99)]


DURABLE_WRITER = CONVERSATION + textwrap.dedent("""
    # Acknowledges (prints) each request id only after its group commit reported it durable:
    # queued (submit: "q") or, every other record, committed on this thread (commit_here: "h";
    # queued when the writer is still finishing the previous batch).
    import sys, threading
    from gyre.real.store.group_commit import GroupCommit
    from gyre.real.store.tito_log import ExecutionStore
    group = GroupCommit(ExecutionStore(sys.argv[1], fsync=True))
    lock = threading.Lock()
    for index, call in enumerate(conversation()):
        how = "q"
        if index % 2:
            here, error = group.commit_here(call)
            assert error is None
            how = "h" if here else how
        if how == "q":
            done = threading.Event()
            group.submit(call, lambda error, done=done: done.set() if error is None else None)
            done.wait()
        with lock:
            sys.stdout.write(call.request_id + " " + how + "\\n")
            sys.stdout.flush()
""")


@pytest.mark.parametrize("attempt", range(3))
def test_kill_9_of_a_durable_writer_loses_nothing_it_acknowledged(tmp_path, attempt):
    """A group-committing writer killed with SIGKILL while it writes into preallocated space, its
    records queued or committed on its own thread: every request id it acknowledged is read back, in
    order, and the log reopens for appending."""
    proc = subprocess.Popen([sys.executable, "-c", DURABLE_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    acked, hows = [], set()
    try:
        while len(acked) < 40 * (attempt + 1):
            line = proc.stdout.readline()
            assert line, "the writer died"
            acked.append(line.split()[0])
            hows.add(line.split()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    acked += [line.split()[0] for line in proc.stdout.read().splitlines() if line.strip()]
    assert hows == {"q", "h"}, hows  # both ways of committing were exercised
    path = tmp_path / "e1.tito"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(path)
    assert all(issubclass(w.category, TornTailWarning) for w in caught)
    assert [r.request_id for r in records[:len(acked)]] == acked
    assert records == conversation(len(records))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        log = RecordLog(path, "e1", fsync=True).open()
    log.append(conversation(len(records) + 1)[-1])
    log.close()
    assert read_records(path) == conversation(len(records) + 1)


@pytest.mark.parametrize("preallocate", [False, True])
@pytest.mark.parametrize("how", ["short", "raises"])
class FullDisk(Disk):
    """A disk that fills up in the middle of the next frame once ``full`` is set: half the frame reaches
    the file, then the write comes back short or raises ENOSPC; zeros (reserved space) still go out."""

    def __init__(self, how: str) -> None:
        self.how, self.full, self.failed = how, False, []

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if not self.full or not any(data):
            return super().pwrite(fd, data, offset)
        self.full = False
        self.failed.append(offset)
        super().pwrite(fd, data[:len(data) // 2], offset)
        if self.how == "short":
            return len(data) // 2
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("preallocate", [False, True])
@pytest.mark.parametrize("how", ["short", "raises"])
def test_a_write_that_fails_part_way_leaves_no_torn_tail(tmp_path, preallocate, how):
    """A full disk mid-frame (issue 32): the partial frame is taken back, so readers see the intact
    records without a torn-tail warning and the log takes the next record."""
    disk = FullDisk(how)
    path = tmp_path / "e1.tito"
    log = RecordLog(path, "e1", preallocate=preallocate, disk=disk).open()
    for i in range(3):
        log.append(record(i))
    disk.full = True
    with pytest.raises(OSError):
        log.append(record(3))
    assert disk.failed
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornTailWarning)
        assert [r.request_id for r in read_records(path)] == [record(i).request_id for i in range(3)]
    log.append(record(4))
    log.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornTailWarning)
        assert len(read_records(path)) == 4


def test_closing_a_group_commit_on_a_stalled_disk_returns_within_its_timeout(tmp_path):
    """A write that never returns (a hung disk) must not hang the shutdown: ``close`` says so at once
    after its timeout, and the record it held is still in the journal, replayed at the next open."""
    from gyre.real.store.group_commit import GroupCommit

    group = GroupCommit(ExecutionStore(tmp_path, fsync=True, preallocate=False))
    acknowledged = threading.Event()
    with held(group.journal, "append") as (stalled, release):
        group.submit(record(0, "e1"), lambda error: acknowledged.set())
        assert stalled.wait(10)
        start = time.monotonic()
        assert group.close(timeout_s=0.2) is False
        assert time.monotonic() - start < 2
        release.set()
        assert acknowledged.wait(10)
        group._thread.join(10)
    group.journal.close()  # what a process exit does to the lock the stalled group kept
    reopened = GroupCommit(ExecutionStore(tmp_path, fsync=True, preallocate=False))
    assert reopened.close() is True
    assert [r.request_id for r in ExecutionStore(tmp_path).read("e1")] == ["r0"]


def test_the_writer_sleeps_on_a_plain_lock_and_wakes_for_every_submit_whenever_it_comes(tmp_path):
    """The group commit's writer sleeps on one plain lock, released once per sleep (``_notify``): records
    submitted from several threads, while it sleeps, commits a batch or is about to sleep, are each
    acknowledged once and land in their logs in submit order; ``close`` wakes a sleeping writer."""
    from gyre.real.store.group_commit import GroupCommit

    store = ExecutionStore(tmp_path, fsync=True)
    group = GroupCommit(store)
    acked: dict[str, int] = {}
    lock, finished = threading.Lock(), threading.Event()
    total = 4 * 40

    def done_for(request_id):
        def done(error):
            assert error is None
            with lock:
                acked[request_id] = acked.get(request_id, 0) + 1
                if len(acked) == total:
                    finished.set()
        return done

    def submitter(t):
        rng = np.random.default_rng(t)
        for i in range(40):
            call = record(t * 1000 + i, f"x{t}")
            group.submit(call, done_for(call.request_id))
            if rng.random() < 0.5:  # sometimes while the writer is busy, sometimes once it went to sleep
                time.sleep(float(rng.random()) * 0.002)

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert finished.wait(20), f"{total - len(acked)} records never acknowledged"
    time.sleep(0.01)
    assert set(acked.values()) == {1} and group.records == total
    for _ in range(50):  # the writer has gone back to sleep: close must wake it
        if group._sleeping:
            break
        time.sleep(0.01)
    assert group._sleeping and group.close(timeout_s=10)
    for t in range(4):
        assert [r.request_id for r in store.read(f"x{t}")] == [f"r{t * 1000 + i}" for i in range(40)]
