"""Forcing what was written to disk: one file's bytes, or one folder's entries (a file created, renamed).

``fsync_path(path)`` opens ``path`` read-only (a folder as a directory), fsyncs
it and closes it. A new or renamed file survives a crash only once both its
bytes and its folder's entry are synced. ``fill_zeros(fd, start, end)``
writes zeros over a byte range and fsyncs the file (size included): space
written ahead like this is later overwritten and synced without metadata
(the record logs' tails, the commit journal). Stdlib only.
"""

from __future__ import annotations

import os


def fsync_path(path: str | os.PathLike) -> None:
    """Force ``path`` (a file's data, or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_ZEROS = bytes(1 << 16)


def fill_zeros(fd: int, start: int, end: int) -> None:
    """Write zeros over ``[start, end)`` of ``fd``, then ``fsync`` it (its new size included)."""
    offset = start
    while offset < end:
        offset += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - offset)], offset)
    os.fsync(fd)
