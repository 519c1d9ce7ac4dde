"""Durable appends of many executions' records from one writer thread, one ``fdatasync`` per batch.

Invariants:
- a record's ``done`` callback runs only after its frame is written to its
  log and, tagged with the log and offset, to the folder's commit journal, and
  the journal is synced: one ``fdatasync`` per batch, however many logs it
  touched (``commit_journal``); the logs are synced before the journal retires
  those entries. So every record a caller was told is durable survives a
  kill -9 (in its log) and a machine crash (in the journal, written back into
  its log when the next group commit opens the folder);
- a failed write is reported to the caller of exactly its record, a failed
  journal write or sync (or checkpoint) to every record of the batch, whose
  frames are then cut off their logs again (no log holds a frame that is in
  no journal before one that is); as with any write whose sync failed, such a
  record may still reappear after a machine crash, but only after every
  acknowledged record of its log;
- records of one log are written, and acknowledged, in the order they were
  queued (or committed on their caller's thread);
- ``done`` runs once per record, on the writer thread (``submit``); a
  ``commit_here`` caller is answered by its return value instead;
- ``submit``'s ``written`` hook runs at most once, on the writer thread, after the
  record's frame and its journal entry are written and before the journal's sync:
  so before ``done``, and never for a record whose write, or whose batch's journal
  write, failed;
- the writer sleeps only with nothing queued (or while a ``commit_here`` runs), on a plain lock that
  the next ``submit`` (or ``close``, or the end of a ``commit_here`` with records queued) releases,
  exactly once per sleep.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from gyre.real.store.commit_journal import CAPACITY, Journal
from gyre.real.store.durable import fsync_path
from gyre.real.store.tito_log import ExecutionStore, RecordLog
from gyre.trajectory.records import ModelCall, RecordError

# a queued record: the record, its ``done`` and its ``written`` hook (``GroupCommit.submit``)
_Queued = tuple[ModelCall, Callable[[BaseException | None], None], Callable[[], None] | None]


class GroupCommit:
    """Durable appends for many logs from one writer thread, one ``fdatasync`` per batch.

    ``submit(call, done)`` queues a record; the writer takes everything queued
    (up to ``max_batch``), writes each frame into its log and all of them, with
    their logs and offsets, into the folder's commit journal
    (``commit_journal.Journal``), syncs the journal, and only then calls
    ``done(None)`` for each record, or ``done(error)`` for a record whose write
    failed (every record of the batch when the journal's write or sync failed).
    ``done`` runs on the writer thread. A log whose write failed is closed, so
    its next use reopens it and checks its tail.

    Checkpoints: the logs written since the journal's epoch began are synced
    (in parallel: the file system merges concurrent journal commits) before a
    new epoch starts: when a batch no longer fits in the journal, and on
    ``close``. Opening a group commit first replays the folder's journal (what a
    machine crash may have kept only there) and checkpoints.

    ``commit_here(call)`` commits one record on the caller's thread when the
    writer is idle (nothing queued, no batch being written), with the same
    write-sync-acknowledge order, and says whether it did; the writer takes no
    batch meanwhile. It spares a lone caller the two thread hand-offs of a
    queued commit (about 0.2 ms of a 0.3 ms round trip here).
    """

    def __init__(self, store: ExecutionStore, *, max_batch: int = 512, sync_threads: int = 16,
                 journal_capacity: int = CAPACITY) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batches = 0
        self.records = 0
        self.here = 0  # records committed on their caller's thread (``commit_here``)
        self.checkpoints = 0
        self._pending: list[_Queued] = []
        # ``_lock`` guards the queue and the flags; a sleeping writer waits on ``_wake``, a plain lock
        # released once per sleep (``_notify``): less of the GIL's time and no waiter lock per sleep,
        # as a ``threading.Condition`` would take
        self._lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()
        self._sleeping = False  # the writer waits (or is about to wait) on ``_wake``
        self._closed = False
        self._busy = False  # a batch is being committed (by the writer or by ``commit_here``)
        self._syncers = ThreadPoolExecutor(max_workers=sync_threads, thread_name_prefix="gyre-fsync")
        self._dirty: dict[str, RecordLog] = {}  # logs written during the journal's current epoch
        store.close()  # the replay writes the files themselves: open logs are reopened after it
        self.journal = Journal(store.root, capacity=journal_capacity, disk=store.disk)
        store.root.mkdir(parents=True, exist_ok=True)
        self.journal.replay(store.path_for)  # synced by the replay itself
        self.journal.start_epoch()
        self._thread = threading.Thread(target=self._run, name="gyre-group-commit", daemon=True)
        self._thread.start()

    def submit(self, call: ModelCall, done: Callable[[BaseException | None], None],
               written: Callable[[], None] | None = None) -> None:
        """Queue ``call``. ``written`` (optional) runs on the writer thread once the record's batch is in the
        journal's file, just before the journal's sync (not durable yet), so always before ``done``; not at
        all when the record's write or the journal's fails."""
        with self._lock:
            if self._closed:
                raise RecordError("the group commit is closed")
            self._pending.append((call, done, written))
            self._notify()

    def commit_here(self, call: ModelCall) -> tuple[bool, BaseException | None]:
        """``(True, error or None)`` after committing ``call`` on this thread if the writer was idle;
        ``(False, None)`` when it was not (then nothing happened: ``submit`` it)."""
        with self._lock:
            if self._closed:
                raise RecordError("the group commit is closed")
            if self._pending or self._busy:
                return False, None
            self._busy = True
        outcome: list[BaseException | None] = []
        try:
            self._commit([(call, outcome.append, None)])
            self.here += 1
        finally:
            with self._lock:
                self._busy = False
                if self._pending or self._closed:  # else the writer has nothing to do: let it sleep
                    self._notify()
        return True, outcome[0]

    def _notify(self) -> None:
        """Wake the writer if it sleeps (under ``_lock``)."""
        if self._sleeping:
            self._sleeping = False
            self._wake.release()

    def _run(self) -> None:
        while True:
            with self._lock:
                # nothing to do, or a ``commit_here`` running (closing too: let it finish first)
                sleep = self._busy or not (self._pending or self._closed)
                if sleep:
                    self._sleeping = True
                elif not self._pending:
                    return
                else:
                    batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                    self._busy = True
            if sleep:
                self._wake.acquire()
                continue
            try:
                self._commit(batch)
            finally:
                with self._lock:
                    self._busy = False

    def _commit(self, batch: list[_Queued]) -> None:
        errors: dict[int, BaseException] = {}
        entries: list[tuple[str, int, bytes]] = []
        journaled: list[int] = []
        touched: dict[str, RecordLog] = {}
        told: list[Callable[[], None]] = []
        for index, (call, _, written) in enumerate(batch):
            try:
                log = self.store.log_for(call.execution_id)
                offset, frame = log.write(call)
            except Exception as exc:  # noqa: BLE001 - reported to this record's caller only
                errors[index] = exc
                if isinstance(exc, OSError):  # perhaps half a frame: reopening checks the tail
                    self.store.forget(call.execution_id)
                continue
            entries.append((call.execution_id, offset, frame))
            journaled.append(index)
            if written is not None:
                told.append(written)
            touched[call.execution_id] = log
        if entries:
            try:
                if not self.journal.fits(entries):
                    self._checkpoint()
                self.journal.append(entries, told=(lambda: [tell() for tell in told]) if told else None)
            except Exception as exc:  # noqa: BLE001 - the batch is not durable: every record of it is told
                errors.update((i, exc) for i in journaled)
                self._roll_back(entries)
            else:
                self._dirty.update(touched)
        self.batches += 1
        self.records += len(batch)
        for index, (_, done, _) in enumerate(batch):
            done(errors.get(index))

    def _roll_back(self, entries: list[tuple[str, int, bytes]]) -> None:
        """Cut a failed batch's frames off their logs again: a frame that is in no journal must never
        sit before a later, journaled one (a crash could leave a hole there that hides the later one,
        or a later delta could name it as its base). Where the cut fails, the log is synced instead."""
        starts: dict[str, int] = {}
        for execution_id, offset, _ in entries:
            starts.setdefault(execution_id, offset)  # a log's frames of one batch are in offset order
        for execution_id, offset in starts.items():
            self.store.forget(execution_id)  # its next use reopens it from the file
            path = self.store.path_for(execution_id)
            try:
                os.truncate(path, offset)
            except OSError:
                try:
                    fsync_path(path, self.store.disk)
                except OSError:
                    pass  # the disk refuses both: the journal, on that same disk, refuses every batch too

    def _checkpoint(self) -> None:
        """Sync every log written during this epoch, then start a new one; raises the first failure
        (the epoch then stays, so its entries still cover those logs)."""
        logs = list(self._dirty.values())
        outcomes = list(self._syncers.map(self._sync, logs)) if len(logs) > 1 else [self._sync(log) for log in logs]
        failed = [(log, problem) for log, problem in zip(logs, outcomes) if problem is not None]
        for log, _ in failed:
            self.store.forget(log.execution_id)
        if failed:
            raise failed[0][1]
        self.journal.start_epoch()
        self._dirty.clear()
        self.checkpoints += 1

    @staticmethod
    def _sync(log: RecordLog) -> BaseException | None:
        try:
            log.sync()
        except OSError as exc:
            return exc
        return None

    def close(self, timeout_s: float | None = None) -> bool:
        """Commit what is queued, stop the writer, then checkpoint (a closed group leaves an empty
        journal: its logs hold everything, synced). False, at once, when the writer has not stopped
        within ``timeout_s`` (a stalled disk): then nothing more is done, and the journal is replayed
        when the folder is next opened."""
        with self._lock:
            self._closed = True
            self._notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        try:
            self._checkpoint()
        finally:
            self._syncers.shutdown(wait=True)
            self.journal.close()
        return True
