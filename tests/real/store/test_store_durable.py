"""``store.durable.fsync_path``: a file and a folder are both forced to disk; a missing path is named."""

from __future__ import annotations

import os

import pytest

from gyre.real.store import durable


class WatchedDisk(durable.Disk):
    """The store's disk seam, noting the path of every fsync."""

    def __init__(self) -> None:
        self.synced: list[str] = []

    def fsync(self, fd: int) -> None:
        self.synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        super().fsync(fd)


def test_files_and_folders_are_synced_and_a_missing_path_raises(tmp_path):
    disk = WatchedDisk()
    (tmp_path / "f").write_text("x")
    durable.fsync_path(tmp_path / "f", disk)
    durable.fsync_path(tmp_path, disk)
    assert disk.synced == [str(tmp_path / "f"), str(tmp_path)]
    with pytest.raises(FileNotFoundError, match="missing"):
        durable.fsync_path(tmp_path / "missing")
