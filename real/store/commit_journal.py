"""A redo journal that makes a group commit's batch durable with one ``fdatasync``, whatever
the number of logs it touched.

``group_commit.GroupCommit`` writes each record's frame into its execution's log
(the page cache only) and the same bytes, tagged with the log and the offset,
into this journal; then it syncs the journal alone and acknowledges the
batch. Syncing every touched log instead cost one thread hand-off per log per
batch (5-20% of the proxy's throughput with 64 executions calling at once,
depending on this machine's phase; ``bench proxy``). The logs themselves are
synced at a *checkpoint*: when the journal's space runs out, when the group
commit closes, and after a replay; the journal then starts a new *epoch* and
its old entries stop counting.

Layout (little-endian): a header at offset 0, ``HEAD_MAGIC | epoch (u64) |
CRC32 of the epoch (u32)``, then entries, each ``ENTRY_MAGIC | payload length
(u32) | CRC32 of payload (u32) | payload``, the payload being ``epoch (u64) |
log offset (u64) | execution id length (u16) | execution id | frame bytes``.

Invariants:
- ``append`` returns only after its entries are written and ``fdatasync``-ed;
  the space they land in was written with zeros and synced beforehand, so the
  sync commits no file-system metadata;
- replay applies, in journal order, every entry from the header on whose CRC
  holds and whose epoch is the header's, and stops at the first that is not
  (zeros, a torn entry, an entry of an older epoch); applying an entry writes
  its bytes at its offset of its log, so replaying twice is replaying once;
- an epoch is retired (``start_epoch``) only after every log written during it
  was synced: a log's bytes are always either synced or in the current epoch;
- the header is written and synced before any entry of its epoch;
- one open journal per folder: a second one (another proxy on the same
  records folder) fails with ``JournalBusy`` before it replays or writes.

After a machine crash, logs may lack frames whose records were acknowledged
until a group commit is opened on the folder (the proxy opens one when it
starts) and replays the journal; a killed process loses nothing either way,
since the page cache keeps what it wrote.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from pathlib import Path
from typing import Callable, Iterable

from gyre.real.store.durable import SYSTEM_DISK, Disk, fill_zeros, fsync_path

JOURNAL_NAME = ".commit-journal"  # in the records folder; not a ``.tito`` log, so not an execution
HEAD_MAGIC = b"GYJH"
ENTRY_MAGIC = b"GYJE"
_HEAD = struct.Struct("<4sQI")
_ENTRY = struct.Struct("<4sII")
_TAG = struct.Struct("<QQH")
MIN_SPACE = 1 << 20   # zeros synced ahead of the journal's end, at least ...
CAPACITY = 64 << 20   # ... growing by doubling up to this; a fuller journal is checkpointed


class JournalBusy(RuntimeError):
    """Another open journal (a proxy, a group commit) holds this records folder."""


class Journal:
    """The commit journal of one records folder; see the module invariants. Not thread-safe:
    one writer (the group commit's) uses it at a time."""

    def __init__(self, root: str | os.PathLike, *, capacity: int = CAPACITY, disk: Disk = SYSTEM_DISK) -> None:
        self.path = Path(root) / JOURNAL_NAME
        self.disk = disk  # its writes and syncs, and a replay's (durable.Disk)
        self.capacity = capacity
        self.epoch = 0
        self._fd: int | None = None
        self._end = _HEAD.size    # where the next entry goes
        self._allocated = 0       # the file's size: written (zeros or old entries) and synced

    def replay(self, path_for: Callable[[str], Path]) -> list[Path]:
        """Write every entry of the current epoch into its log (``path_for(execution_id)``), sync those
        logs (and their folder, for a log the replay created), and return their paths."""
        self._open()
        data = self.path.read_bytes()
        if len(data) < _HEAD.size:
            return []
        magic, epoch, crc = _HEAD.unpack_from(data, 0)
        if magic != HEAD_MAGIC or _head_crc(epoch) != crc:
            return []  # never synced with a valid header: no entry of it was ever acknowledged
        self.epoch = epoch
        fds: dict[Path, int] = {}
        created = False
        try:
            for execution_id, offset, frame in _entries(data, epoch):
                path = path_for(execution_id)
                if path not in fds:
                    created |= not path.exists()
                    fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                self.disk.pwrite(fds[path], frame, offset)
            for fd in fds.values():
                self.disk.fsync(fd)
        finally:
            for fd in fds.values():
                os.close(fd)
        if created:
            fsync_path(self.path.parent, self.disk)
        return list(fds)

    def start_epoch(self) -> None:
        """Retire every entry written so far (their logs must be synced) and start an empty epoch."""
        fd = self._open()
        self._reserve(_HEAD.size)  # a new journal: its first space, so the header lands in synced zeros
        self.epoch += 1
        self.disk.pwrite(fd, _HEAD.pack(HEAD_MAGIC, self.epoch, _head_crc(self.epoch)), 0)
        self.disk.fdatasync(fd)
        self._end = _HEAD.size

    def fits(self, entries: Iterable[tuple[str, int, bytes]]) -> bool:
        """Whether ``entries`` fit in this epoch without passing the capacity (an empty epoch takes
        anything: one batch may exceed the capacity)."""
        return self._end == _HEAD.size or self._end + sum(map(_entry_size, entries)) <= self.capacity

    def append(self, entries: list[tuple[str, int, bytes]], told: Callable[[], object] | None = None) -> None:
        """Write ``(execution_id, log offset, frame)`` entries in one write and sync them; ``told``
        is called between the two (the entries are written, not yet durable; what it returns is
        ignored). The journal must be open: ``start_epoch`` (or ``replay``) first."""
        assert self._fd is not None, "Journal.append before start_epoch"
        blob = b"".join(_entry(self.epoch, *entry) for entry in entries)
        self._reserve(self._end + len(blob))
        written = self.disk.pwrite(self._fd, blob, self._end)
        if written != len(blob):  # pragma: no cover - regular files write fully
            raise OSError(f"short write to {self.path}: {written} of {len(blob)} bytes")
        if told is not None:
            told()
        self.disk.fdatasync(self._fd)
        self._end += written

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        """Open (creating) and lock the journal: one writer per records folder; returns its descriptor."""
        if self._fd is None:
            created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise JournalBusy(f"{self.path.parent} is in use: another process (or group commit) writes "
                                  f"records there (its commit journal {self.path.name} is locked)") from None
            self._fd = fd
            self._allocated = os.fstat(self._fd).st_size
            if created:
                fsync_path(self.path.parent, self.disk)
        return self._fd

    def _reserve(self, end: int) -> None:
        """Zeros written and synced (size included) up to at least ``end``."""
        if end <= self._allocated:
            return
        assert self._fd is not None, "the journal is opened before space is reserved in it"
        target = max(end, min(max(MIN_SPACE, 2 * self._allocated), max(self.capacity, end)))
        try:
            fill_zeros(self._fd, self._allocated, target, self.disk)
        except OSError as exc:  # e.g. a disk smaller than the space asked for: named, with the file
            raise OSError(exc.errno, f"cannot reserve {target} bytes for the commit journal "
                                     f"({exc.strerror or exc})", str(self.path)) from None
        self._allocated = target


def _head_crc(epoch: int) -> int:
    return zlib.crc32(struct.pack("<Q", epoch))


def _entry(epoch: int, execution_id: str, offset: int, frame: bytes) -> bytes:
    name = execution_id.encode()
    payload = _TAG.pack(epoch, offset, len(name)) + name + frame
    return _ENTRY.pack(ENTRY_MAGIC, len(payload), zlib.crc32(payload)) + payload


def _entry_size(entry: tuple[str, int, bytes]) -> int:
    return _ENTRY.size + _TAG.size + len(entry[0].encode()) + len(entry[2])


def _entries(data: bytes, epoch: int) -> Iterable[tuple[str, int, bytes]]:
    """The valid entries of ``epoch`` from the header on, up to the first that is not one."""
    offset = _HEAD.size
    while offset + _ENTRY.size <= len(data):
        magic, length, crc = _ENTRY.unpack_from(data, offset)
        start, end = offset + _ENTRY.size, offset + _ENTRY.size + length
        if magic != ENTRY_MAGIC or end > len(data) or length < _TAG.size or zlib.crc32(data[start:end]) != crc:
            return
        entry_epoch, log_offset, name_length = _TAG.unpack_from(data, start)
        if entry_epoch != epoch:
            return
        name_end = start + _TAG.size + name_length
        yield data[start + _TAG.size:name_end].decode(), log_offset, data[name_end:end]
        offset = end
