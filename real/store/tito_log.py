"""Durable append-only storage of TITO records, one log file per execution.

Frame layout (little-endian): ``MAGIC (4 bytes) | payload length (u32) |
CRC32 of payload (u32) | payload`` where the payload is ``ModelCall.to_bytes``.
Each frame is handed to the kernel in a single ``write`` call; with
``fsync=True`` it is also forced to disk before ``append`` returns.

Preallocated space (``fsync=True`` logs): appending to a file changes its
size, so every sync of an append must also commit file-system metadata (an
ext4 journal commit, shared with every other writer of the file system:
0.15-1.3 ms p50 on this machine depending on their load), while overwriting
bytes *inside* the file needs only the data itself forced out (``fdatasync``:
0.1 ms p50; ``bench_proxy``'s ``durability`` case measures both). So a durable log, like a database WAL segment, keeps
a zero-filled tail already written and synced (``RecordLog.reserve``: at least
``MIN_ROOM`` and up to the log's own size, at most ``MAX_ROOM`` ahead) and
writes each frame over the start of it. A clean ``close`` cuts the tail off;
after a kill the zeros stay, and a reader treats a log that ends in zeros
(from a frame boundary on) exactly like one that ends there.

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
  the file name and byte offset; nothing before that offset is lost; a tail of
  zeros from a frame boundary to the end is preallocated space, not torn;
- reopening a log for appending truncates a torn tail (with the same warning)
  or a zero tail first, so new frames never land behind garbage;
- a write that fails part way (a full disk) takes its partial frame back before
  the error is raised (cut off, or zeroed inside reserved space): readers see
  no torn tail and the log stays appendable;
- a durable log's frames are synced with ``fdatasync`` (data plus the metadata
  needed to read it back, such as a changed size); the zero tail a frame is
  written into was itself synced (size included) when it was reserved, and a
  new log's directory entry is synced when the log is created;
- a log holds records of exactly one execution (``append`` checks it);

Group commits of many logs (one sync per batch): ``group_commit``.

A corrupt frame in the middle of a log can only come from outside damage (the
writer only appends); the reader treats it like a torn tail and stops there.
"""

from __future__ import annotations

import errno
import os
import struct
import warnings
import zlib
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np

from gyre.real.store.durable import SYSTEM_DISK, Disk, fill_zeros, fsync_path
from gyre.trajectory.records import ModelCall, RecordError

MAGIC = b"GYR1"
_FRAME = struct.Struct("<4sII")
MIN_ROOM = 64 * 1024        # preallocated zeros ahead of a durable log's end, at least ...
MAX_ROOM = 4 * 1024 * 1024  # ... and at most (otherwise as much as the log holds: doubling)
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
        if data[offset] == 0 and data.count(0, offset) == len(data) - offset:
            return  # only zeros left: preallocated space of a log that was not closed cleanly
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
                 delta_window: int = 4, min_shared: int = 64, preallocate: bool | None = None,
                 disk: Disk = SYSTEM_DISK) -> None:
        self.path = Path(path)
        self.disk = disk  # its writes and syncs (durable.Disk)
        self.execution_id = execution_id
        self.fsync = fsync
        self.preallocate = fsync if preallocate is None else preallocate
        self.min_shared = min_shared
        self._fd: int | None = None
        self._end = 0        # where the next frame goes (the end of the intact frames)
        self._allocated = 0  # the file's size: [_end, _allocated) is zeros, written and synced
        self.last_frame = 0  # bytes of the last frame written
        self._recent: deque[tuple[ModelCall, np.ndarray]] = deque(maxlen=max(delta_window, 0))
        self._request_ids: set[str] = set()
        self.count = 0

    def open(self) -> RecordLog:
        if self._fd is not None:
            return self
        if self.path.exists():
            records, good_end = _read_with_end(self.path)
            foreign = {r.execution_id for r in records} - {self.execution_id}
            if foreign:
                raise RecordError(f"{self.path} holds records of other executions: {sorted(foreign)}")
            if good_end < self.path.stat().st_size:
                os.truncate(self.path, good_end)
            self._end = good_end
            self.count = len(records)
            self._request_ids = {r.request_id for r in records}
            if self._recent.maxlen:
                self._recent.extend((r, r.sequence) for r in records[-self._recent.maxlen :])
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._allocated = self._end
        if created and self.fsync:
            fsync_path(self.path.parent, self.disk)  # the new log's directory entry
        return self

    def append(self, call: ModelCall) -> None:
        """Write ``call``'s frame (forced to disk first when the log was opened with ``fsync``)."""
        self.write(call)
        if self.fsync:
            self.sync()

    def sync(self) -> None:
        """Force every frame written so far to disk (``fdatasync``: see the module invariants), through
        the path when the log was closed meanwhile."""
        if self._fd is not None:
            self.disk.fdatasync(self._fd)
        elif self.path.exists():
            fsync_path(self.path, self.disk)

    def reserve(self, room: int) -> None:
        """Make sure at least ``room`` bytes of synced zeros follow the last frame (durable logs only).

        Grows the file by ``room`` plus its own size (``MIN_ROOM`` to ``MAX_ROOM``), writing the
        zeros (so later frames overwrite allocated blocks) and ``fsync``-ing size and blocks."""
        if not self.preallocate or self._allocated - self._end >= room:
            return
        if self._fd is None:
            self.open()
        assert self._fd is not None  # open() set it
        target = self._end + room + min(max(MIN_ROOM, self._end), MAX_ROOM)
        fill_zeros(self._fd, self._allocated, target, self.disk)
        self._allocated = target

    def write(self, call: ModelCall) -> tuple[int, bytes]:
        """Hand ``call``'s frame to the kernel in one ``write`` (durable only after ``sync``); returns
        the frame's offset and bytes."""
        if call.execution_id != self.execution_id:
            raise RecordError(f"record of execution {call.execution_id!r} sent to the log of {self.execution_id!r}")
        if call.request_id in self._request_ids:
            raise RecordError(f"request {call.request_id!r} is already in {self.path}")
        if self._fd is None:
            self.open()
        fd = self._fd
        assert fd is not None  # open() set it; reserve() keeps it
        frame = encode_frame(call, *self._delta_base(call))
        self.reserve(len(frame))
        offset = self._end
        try:
            written = self.disk.pwrite(fd, frame, offset)
            if written != len(frame):  # a full disk: part of the frame went out
                raise OSError(errno.ENOSPC, f"short write: {written} of {len(frame)} bytes", str(self.path))
        except OSError:
            self._take_back(fd, offset, len(frame))
            raise
        self._end += written
        self._allocated = max(self._allocated, self._end)
        self.last_frame = written
        self.count += 1
        self._request_ids.add(call.request_id)
        if self._recent.maxlen:
            self._recent.append((call, call.sequence))
        return offset, frame

    def _take_back(self, fd: int, offset: int, size: int) -> None:
        """Remove whatever part of a failed frame reached the file (``fd``) at ``offset`` (best effort)."""
        try:
            if self._allocated > offset:  # reserved zeros: put them back (no new space needed)
                self.disk.pwrite(fd, bytes(min(size, self._allocated - offset)), offset)
            else:
                os.ftruncate(fd, offset)
        except OSError:
            pass  # the next open finds the torn tail and cuts it (the reader warns until then)

    def _delta_base(self, call: ModelCall) -> tuple[ModelCall | None, int]:
        best, best_shared = None, 0
        if len(call.input_ids) < self.min_shared:  # no base can share enough
            return None, 0
        for base, sequence in self._recent:
            shared = _common_prefix_len(sequence, call.input_ids)
            if shared > best_shared:
                best, best_shared = base, shared
        return (best, best_shared) if best_shared >= self.min_shared else (None, 0)

    def close(self) -> None:
        """Close the file, cutting off its preallocated zeros (so a closed log is exactly its frames)."""
        if self._fd is not None:
            try:
                if self._allocated > self._end:
                    os.ftruncate(self._fd, self._end)
            finally:
                os.close(self._fd)
                self._fd = None
                self._allocated = self._end

    def __enter__(self) -> RecordLog:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExecutionStore:
    """A directory of per-execution logs named ``<execution_id>.tito``."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = False, preallocate: bool | None = None,
                 disk: Disk = SYSTEM_DISK) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.disk = disk  # every log's writes and syncs, and the group commit's journal's (durable.Disk)
        self.preallocate = preallocate  # passed to each ``RecordLog`` (None: as ``fsync``)
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
            log = RecordLog(self.path_for(execution_id), execution_id, fsync=self.fsync,
                            preallocate=self.preallocate, disk=self.disk).open()
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

    def count(self, execution_id: str) -> int:
        """How many intact records the log of ``execution_id`` holds (0 without a log); frames are
        checked, not decoded, so a long log is counted far faster than it is read."""
        path = self.path_for(execution_id)
        if not path.exists():
            return 0
        return sum(1 for _, payload, _ in _scan(path.read_bytes()) if payload is not None)

    def executions(self) -> list[str]:
        return sorted(p.name[: -len(LOG_SUFFIX)] for p in self.root.glob(f"*{LOG_SUFFIX}"))

    def close(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs.clear()
