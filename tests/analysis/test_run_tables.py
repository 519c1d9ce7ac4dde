"""load_run / run_from_result: the same tables from disk and from memory."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.analysis.runs import COLUMNS, consumed_groups, load_run, make_run, run_from_result
from gyre.sim.runner import run_simulation


@pytest.fixture(scope="module")
def result():
    return run_simulation("E0", "deepswe", steps=3, seed=1)


def test_disk_and_memory_give_the_same_tables(result, tmp_path):
    from_disk = load_run(result.write(tmp_path / "run"))
    in_memory = run_from_result(result)
    for key in ("steps", "groups", "roles", "executions"):
        a, b = getattr(from_disk, key), getattr(in_memory, key)
        assert list(a.columns) == list(COLUMNS[key]) == list(b.columns)
        assert a.shape == b.shape
        numeric = a.select_dtypes("number").columns
        np.testing.assert_allclose(a[numeric].to_numpy(float), b[numeric].to_numpy(float), atol=1e-5)
    assert from_disk.summary["preset"] == "E0"
    assert from_disk.end_s == pytest.approx(in_memory.end_s, abs=1e-5)
    assert from_disk.config["mu"] == 3


def test_consumed_groups_are_those_with_a_staleness(result):
    run = run_from_result(result)
    consumed = consumed_groups(run)
    assert len(consumed) == 3 * result.cfg.B
    assert consumed["staleness"].notna().all()


def test_missing_folder_and_unknown_table_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown tables"):
        make_run(bogus=[])


def test_absent_files_give_empty_tables(tmp_path):
    (tmp_path / "steps.csv").write_text("step,start_s,end_s,duration_s,training_cells_max,published\n"
                                        "0,1.0,3.0,2.0,1,True\n")
    run = load_run(tmp_path)
    assert run.groups.empty and list(run.groups.columns) == list(COLUMNS["groups"])
    assert run.end_s == 3.0
