"""Start-up faults of ``gyre proxy``: one line on stderr naming the file, exit status 2, no traceback.

Cases (issue 32): a damaged ``keys.json`` (truncated, a list, empty, wrong field types), a
records folder that cannot be created, a disk too small for the commit journal's reserved
space. Run in-process through ``cli.main`` (the same code path as ``gyre proxy``).
"""

from __future__ import annotations

import errno
import json

import pytest

from gyre.real.store.durable import Disk

try:
    from proxy_fixtures import build_tiny_tokenizer, shared_tiny_dir
except ImportError:
    from .proxy_fixtures import build_tiny_tokenizer, shared_tiny_dir

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))


def run_proxy(tmp_path, model, records, capsys, fsync: bool = True, disk=None) -> tuple[int, str]:
    from gyre.real.proxy import cli

    config = tmp_path / "proxy.json"
    config.write_text(json.dumps({"model_path": str(model), "records_dir": str(records), "fsync": fsync,
                                  "admin_token": "admin-secret-token", "port": 0,
                                  "engines": [{"id": "e0", "url": "http://127.0.0.1:9"}]}))
    status = cli.main(["--config", str(config), "--port", "0", "--loop", "asyncio"], disk=disk)
    return status, capsys.readouterr().err


def assert_one_line(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gyre proxy: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, err)


@pytest.mark.parametrize("content", [b'{"version": 2, "keys": {"ab', b"[1, 2]", b"", b'{"version": 2, "keys": []}',
                                     b'{"version": 2, "keys": {}, "revoked": "x"}', b"\xff\xfe"])
def test_a_damaged_key_file_is_named(tmp_path, model, capsys, content):
    records = tmp_path / "records"
    records.mkdir()
    (records / "keys.json").write_bytes(content)
    status, err = run_proxy(tmp_path, model, records, capsys)
    assert status == 2
    assert_one_line(err, str(records / "keys.json"), "damaged key file")


def test_a_records_folder_that_cannot_be_created_is_named(tmp_path, model, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the records folder should be")
    status, err = run_proxy(tmp_path, model, blocker / "records", capsys, fsync=False)
    assert status == 2
    assert_one_line(err, str(blocker))


class FullDisk(Disk):
    """A disk with no space left: every write fails (the proxy's ``disk`` seam, which the journal writes on)."""

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_disk_too_small_for_the_journal_is_named(tmp_path, model, capsys):
    from gyre.real.store import commit_journal

    status, err = run_proxy(tmp_path, model, tmp_path / "records", capsys, disk=FullDisk())
    assert status == 2
    assert_one_line(err, str(tmp_path / "records" / commit_journal.JOURNAL_NAME), "No space left")
