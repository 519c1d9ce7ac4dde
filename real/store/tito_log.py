"""Durable append-only storage of TITO records, one log file per execution.

Frame layout (little-endian): ``MAGIC (4 bytes) | payload length (u32) |
CRC32 of payload (u32) | payload`` where the payload is ``ModelCall.to_bytes``.
Each frame is handed to the kernel in a single ``write`` call; with
``fsync=True`` it is also forced to disk before ``append`` returns.

Prefix deltas: a request's input usually extends an earlier request's input
and output, so the writer compares it with the last ``delta_window`` records
of the log and, when they share at least ``min_shared`` tokens, writes only
the input suffix plus (base request id, shared length). A base is always an
earlier frame of the same log, so any intact prefix of a log decodes on its
own. Request ids are unique within a log (the writer checks).

Invariants:
- a writer killed at any moment loses at most the frame being written; every
  frame whose ``append`` returned is read back intact;
- the reader yields frames in append order and stops at the first frame that is
  incomplete or fails its magic/length/CRC check (a *torn tail*), warning with
  the file name and byte offset; nothing before that offset is lost;
- reopening a log for appending truncates a torn tail first (with the same
  warning), so new frames never land behind garbage;
- a log holds records of exactly one execution (``append`` checks it);
- ``GroupCommit``: a record's ``done`` callback runs only after the batch
  holding it is written *and* fsynced (one fsync per log the batch touched,
  the logs of a batch synced in parallel), so every record a caller was told
  is durable survives a kill -9; a failed write or fsync is reported to the
  callers of exactly the records it concerns.

A corrupt frame in the middle of a log can only come from outside damage (the
writer only appends); the reader treats it like a torn tail and stops there.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
import warnings
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from gyre.trajectory.records import ModelCall, RecordError

MAGIC = b"GYR1"
_FRAME = struct.Struct("<4sII")
MAX_PAYLOAD = 1 << 31
LOG_SUFFIX = ".tito"


class TornTailWarning(UserWarning):
    """A log ends with an incomplete or corrupt frame that was skipped."""


def encode_frame(call: ModelCall, base: ModelCall | None = None, shared: int = 0) -> bytes:
    payload = call.to_bytes(base=base, shared=shared)
    if len(payload) >= MAX_PAYLOAD:
        raise RecordError(f"record {call.request_id} is too large to frame ({len(payload)} bytes)")
    return _FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _scan(data: bytes) -> Iterator[tuple[int, bytes | None, str]]:
    """Yield (offset, payload, problem) for each frame; payload None on a bad frame."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < _FRAME.size:
            yield offset, None, "incomplete frame header"
            return
        magic, length, crc = _FRAME.unpack_from(data, offset)
        if magic != MAGIC:
            yield offset, None, "bad frame magic"
            return
        end = offset + _FRAME.size + length
        if end > len(data):
            yield offset, None, "incomplete frame payload"
            return
        payload = data[offset + _FRAME.size : end]
        if zlib.crc32(payload) != crc:
            yield offset, None, "frame CRC mismatch"
            return
        yield offset, payload, ""
        offset = end


def read_records(path: str | os.PathLike) -> list[ModelCall]:
    """Every intact record of ``path`` in append order; warns on a torn tail."""
    records, _ = _read_with_end(Path(path))
    return records


def _read_with_end(path: Path) -> tuple[list[ModelCall], int]:
    data = path.read_bytes()
    records: list[ModelCall] = []
    bases: dict[str, ModelCall] = {}
    good_end = 0
    for offset, payload, problem in _scan(data):
        if payload is None:
            warnings.warn(f"{path}: skipping torn tail at byte {offset} ({problem}, {len(data) - offset} bytes)",
                          TornTailWarning, stacklevel=3)
            break
        try:
            record = ModelCall.from_bytes(payload, bases)
        except RecordError as exc:
            warnings.warn(f"{path}: skipping torn tail at byte {offset} (undecodable record: {exc})",
                          TornTailWarning, stacklevel=3)
            break
        records.append(record)
        bases[record.request_id] = record
        good_end = offset + _FRAME.size + len(payload)
    return records, good_end


def _common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differs = a[:n] != b[:n]
    first = int(differs.argmax()) if n else 0
    return first if n and differs[first] else n


class RecordLog:
    """Appends records of one execution to one file; see the module invariants."""

    def __init__(self, path: str | os.PathLike, execution_id: str, *, fsync: bool = False,
                 delta_window: int = 4, min_shared: int = 64) -> None:
        self.path = Path(path)
        self.execution_id = execution_id
        self.fsync = fsync
        self.min_shared = min_shared
        self._fd: int | None = None
        self._recent: deque[tuple[ModelCall, np.ndarray]] = deque(maxlen=max(delta_window, 0))
        self._request_ids: set[str] = set()
        self.count = 0

    def open(self) -> "RecordLog":
        if self._fd is not None:
            return self
        if self.path.exists():
            records, good_end = _read_with_end(self.path)
            foreign = {r.execution_id for r in records} - {self.execution_id}
            if foreign:
                raise RecordError(f"{self.path} holds records of other executions: {sorted(foreign)}")
            if good_end < self.path.stat().st_size:
                os.truncate(self.path, good_end)
            self.count = len(records)
            self._request_ids = {r.request_id for r in records}
            if self._recent.maxlen:
                self._recent.extend((r, r.sequence) for r in records[-self._recent.maxlen :])
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self

    def append(self, call: ModelCall) -> None:
        """Write ``call``'s frame (forced to disk first when the log was opened with ``fsync``)."""
        self.write(call)
        if self.fsync:
            self.sync()

    def sync(self) -> None:
        """Force every frame written so far to disk."""
        if self._fd is not None:
            os.fsync(self._fd)

    def write(self, call: ModelCall) -> None:
        """Hand ``call``'s frame to the kernel in one ``write`` (durable only after ``sync``)."""
        if call.execution_id != self.execution_id:
            raise RecordError(f"record of execution {call.execution_id!r} sent to the log of {self.execution_id!r}")
        if call.request_id in self._request_ids:
            raise RecordError(f"request {call.request_id!r} is already in {self.path}")
        if self._fd is None:
            self.open()
        frame = encode_frame(call, *self._delta_base(call))
        written = os.write(self._fd, frame)
        if written != len(frame):  # pragma: no cover - regular files write fully
            raise OSError(f"short write to {self.path}: {written} of {len(frame)} bytes")
        self.count += 1
        self._request_ids.add(call.request_id)
        if self._recent.maxlen:
            self._recent.append((call, call.sequence))

    def _delta_base(self, call: ModelCall) -> tuple[ModelCall | None, int]:
        best, best_shared = None, 0
        for base, sequence in self._recent:
            shared = _common_prefix_len(sequence, call.input_ids)
            if shared > best_shared:
                best, best_shared = base, shared
        return (best, best_shared) if best_shared >= self.min_shared else (None, 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RecordLog":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExecutionStore:
    """A directory of per-execution logs named ``<execution_id>.tito``."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self._logs: dict[str, RecordLog] = {}

    def path_for(self, execution_id: str) -> Path:
        if not execution_id or "/" in execution_id or execution_id.startswith("."):
            raise RecordError(f"execution_id {execution_id!r} cannot name a log file")
        return self.root / f"{execution_id}{LOG_SUFFIX}"

    def log_for(self, execution_id: str) -> RecordLog:
        """The open log of ``execution_id`` (opened, its torn tail truncated, on first use)."""
        log = self._logs.get(execution_id)
        if log is None:
            self.root.mkdir(parents=True, exist_ok=True)
            log = RecordLog(self.path_for(execution_id), execution_id, fsync=self.fsync).open()
            self._logs[execution_id] = log
        return log

    def append(self, call: ModelCall) -> None:
        self.log_for(call.execution_id).append(call)

    def forget(self, execution_id: str) -> None:
        """Close the log of ``execution_id``; the next append reopens it (and rechecks its tail)."""
        log = self._logs.pop(execution_id, None)
        if log is not None:
            log.close()

    def read(self, execution_id: str) -> list[ModelCall]:
        path = self.path_for(execution_id)
        if not path.exists():
            raise KeyError(f"no records stored for execution {execution_id!r} under {self.root}")
        return read_records(path)

    def executions(self) -> list[str]:
        return sorted(p.name[: -len(LOG_SUFFIX)] for p in self.root.glob(f"*{LOG_SUFFIX}"))

    def close(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs.clear()


class GroupCommit:
    """Durable appends for many logs from one writer thread, one fsync per log per batch.

    ``submit(call, done)`` queues a record; the writer takes everything queued
    (up to ``max_batch``), writes each frame, fsyncs every log the batch touched
    (in parallel: the file system merges concurrent journal commits), and only
    then calls ``done(None)`` for each record, or ``done(error)`` for a record
    whose write or fsync failed. ``done`` runs on the writer thread. A log whose
    fsync failed is closed, so its next use reopens it and checks its tail.
    """

    def __init__(self, store: ExecutionStore, *, max_batch: int = 512, sync_threads: int = 16) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batches = 0
        self.records = 0
        self._pending: list[tuple[ModelCall, Callable[[BaseException | None], None]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._syncers = ThreadPoolExecutor(max_workers=sync_threads, thread_name_prefix="gyre-fsync")
        self._thread = threading.Thread(target=self._run, name="gyre-group-commit", daemon=True)
        self._thread.start()

    def submit(self, call: ModelCall, done: Callable[[BaseException | None], None]) -> None:
        with self._cond:
            if self._closed:
                raise RecordError("the group commit is closed")
            self._pending.append((call, done))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            self._commit(batch)

    def _commit(self, batch: list[tuple[ModelCall, Callable[[BaseException | None], None]]]) -> None:
        errors: dict[int, BaseException] = {}
        touched: dict[str, tuple[RecordLog, list[int]]] = {}
        for index, (call, _) in enumerate(batch):
            try:
                log = self.store.log_for(call.execution_id)
                log.write(call)
            except Exception as exc:  # noqa: BLE001 - reported to this record's caller only
                errors[index] = exc
                continue
            touched.setdefault(call.execution_id, (log, []))[1].append(index)
        logs = list(touched.values())
        if len(logs) == 1:
            outcomes = [self._sync(logs[0][0])]
        else:
            outcomes = list(self._syncers.map(self._sync, [log for log, _ in logs]))
        for (log, indices), problem in zip(logs, outcomes):
            if problem is not None:
                self.store.forget(log.execution_id)
                errors.update((i, problem) for i in indices)
        self.batches += 1
        self.records += len(batch)
        for index, (_, done) in enumerate(batch):
            done(errors.get(index))

    @staticmethod
    def _sync(log: RecordLog) -> BaseException | None:
        try:
            log.sync()
        except OSError as exc:
            return exc
        return None

    def close(self) -> None:
        """Commit what is queued, then stop the writer."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._syncers.shutdown(wait=True)
