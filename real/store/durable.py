"""Forcing what was written to disk: one file's bytes, or one folder's entries (a file created, renamed).

``fsync_path(path)`` opens ``path`` read-only (a folder as a directory), fsyncs
it and closes it. A new or renamed file survives a crash only once both its
bytes and its folder's entry are synced. ``fill_zeros(fd, start, end)``
writes zeros over a byte range and fsyncs the file (size included): space
written ahead like this is later overwritten and synced without metadata
(the record logs' tails, the commit journal). ``Disk`` is the seam of the
writes and syncs the store makes (``pwrite``, ``fdatasync``, ``fsync``): the
store's classes take one (``SYSTEM_DISK``, the system calls themselves, by
default), so a test can watch the order of writes and syncs or fail one as a
full or broken disk would, without reaching into the store. Stdlib only.
"""

from __future__ import annotations

import os


class Disk:
    """The store's writes and syncs of open files, one method each (the system calls by default)."""

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


SYSTEM_DISK = Disk()


def fsync_path(path: str | os.PathLike, disk: Disk = SYSTEM_DISK) -> None:
    """Force ``path`` (a file's data, or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        disk.fsync(fd)
    finally:
        os.close(fd)


_ZEROS = bytes(1 << 16)


def fill_zeros(fd: int, start: int, end: int, disk: Disk = SYSTEM_DISK) -> None:
    """Write zeros over ``[start, end)`` of ``fd``, then ``fsync`` it (its new size included)."""
    offset = start
    while offset < end:
        offset += disk.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - offset)], offset)
    disk.fsync(fd)
