"""``gyre run``'s answer to a dead training cell, without engines: resume from the last checkpoint, at most
``cell_restarts`` times, then fail with the cell named (the real thing: ``test_runtime_resume_e2e``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gyre.real.runtime.cli import run_restarting
from gyre.real.runtime.job import CellFailed
from gyre.real.runtime.job_file import job_from_table


def _run_with(tmp_path, failures: int, restarts: int) -> tuple[dict, list, list]:
    """``gyre run``'s restart loop with a job that dies ``failures`` times (``run``) and a fake resume plan."""
    job = job_from_table(dict(workdir=str(tmp_path / "run"), cell_restarts=restarts))
    runs, plans = [], []

    def run(job, resume):
        runs.append(resume)
        if len(runs) <= failures:
            raise CellFailed(f"training cell 1 (exit code -9) died (run {len(runs)})")
        return {"steps": job.steps, "ran": len(runs)}

    def plan_resume(folder):
        plans.append(folder)
        return SimpleNamespace(job=dataclasses.replace(job), version=2, checkpoint=None, name=f"plan{len(plans)}")

    return run_restarting(job, run=run, replan=plan_resume), runs, plans


def test_a_dead_cell_resumes_the_run_from_its_folder(tmp_path, capsys):
    summary, runs, plans = _run_with(tmp_path, failures=2, restarts=2)
    assert summary["ran"] == 3 and runs[0] is None and [p.name for p in runs[1:]] == ["plan1", "plan2"]
    assert plans == [str(tmp_path / "run")] * 2
    assert "training cell 1 (exit code -9) died (run 2); resuming at version 2" in capsys.readouterr().err


def test_past_cell_restarts_the_failure_is_raised(tmp_path):
    with pytest.raises(CellFailed, match=r"run 2\)"):
        _run_with(tmp_path, failures=2, restarts=1)


def test_no_restarts_means_the_first_failure_ends_the_run(tmp_path):
    with pytest.raises(CellFailed, match=r"run 1\)"):
        _run_with(tmp_path, failures=1, restarts=0)
