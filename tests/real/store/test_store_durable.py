"""``store.durable.fsync_path``: a file and a folder are both forced to disk; a missing path is named."""

from __future__ import annotations

import os

import pytest

from gyre.real.store import durable


def test_files_and_folders_are_synced_and_a_missing_path_raises(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                         real_fsync(fd)))
    (tmp_path / "f").write_text("x")
    durable.fsync_path(tmp_path / "f")
    durable.fsync_path(tmp_path)
    assert synced == [str(tmp_path / "f"), str(tmp_path)]
    with pytest.raises(FileNotFoundError, match="missing"):
        durable.fsync_path(tmp_path / "missing")
