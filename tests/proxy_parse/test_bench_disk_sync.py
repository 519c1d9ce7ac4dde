"""``bench disk_sync``'s measured operation is the commit journal's: each write lands at its own offset
of the preallocated file, one after the other, without growing it, and each is timed once."""

from __future__ import annotations

import os

import pytest

from bench.bench_disk_sync import ENTRY, sync_times


@pytest.mark.parametrize("sleep", [False, True])
def test_each_write_lands_at_its_own_offset_in_the_preallocated_space_and_is_timed_once(tmp_path, sleep):
    path = tmp_path / "journal"
    writes = 7
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, bytes((writes + 2) * ENTRY))
        times = sync_times(fd, writes, 1e-5, sleep=sleep)
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert len(data) == (writes + 2) * ENTRY  # written into the preallocated space, not past it
    assert data[: writes * ENTRY] == b"\x5a" * (writes * ENTRY)
    assert data[writes * ENTRY:] == bytes(2 * ENTRY)
    assert len(times) == writes and all(t > 0 for t in times)


@pytest.mark.parametrize("where", ["missing", "a-file"])
def test_a_folder_that_cannot_be_measured_in_is_refused_by_name(tmp_path, monkeypatch, where):
    from bench.bench_disk_sync import main

    folder = tmp_path / where
    if where == "a-file":
        folder.write_text("x")
    monkeypatch.setenv("GYRE_BENCH_DISK_DIR", str(folder))
    with pytest.raises(SystemExit, match="GYRE_BENCH_DISK_DIR=.*not a folder"):
        main(writes=2)


def test_given_bytes_and_sync_each_write_follows_the_last_growing_the_file(tmp_path):
    # the durability case of ``bench proxy`` (a 2 KB frame appended, ``fsync``) measures through it too
    path, synced = tmp_path / "log", []
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        times = sync_times(fd, 4, 0.0, sleep=True, data=b"abc", sync=lambda f: (synced.append(f), os.fsync(f)))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc" * 4 and synced == [fd] * 4 and len(times) == 4
