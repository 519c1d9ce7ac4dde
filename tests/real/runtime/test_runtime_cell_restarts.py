"""``gyre run``'s answer to a dead training cell, without engines: resume from the last checkpoint, at most
``cell_restarts`` times, then fail with the cell named (the real thing: ``test_runtime_resume_e2e``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gyre.real.runtime import cli
from gyre.real.runtime import job as job_module
from gyre.real.runtime import resume as resume_module
from gyre.real.runtime.job import CellFailed
from gyre.real.runtime.job_file import job_from_table


def _run_with(monkeypatch, tmp_path, failures: int, restarts: int) -> tuple[int, list, list]:
    job = job_from_table(dict(workdir=str(tmp_path / "run"), cell_restarts=restarts))
    runs, plans = [], []

    def run_job(job, progress=None, watch=None, resume=None):
        runs.append(resume)
        if len(runs) <= failures:
            raise CellFailed(f"training cell 1 (exit code -9) died (run {len(runs)})")
        return {"steps": job.steps, "published": job.steps, "replay_identical": True, "staleness_mean": 0.0,
                "staleness_predicted": 0.0, "reward_curve": [], "reward_trend": None, "step_wall_s": [], "outcomes": {},
                "trace": None, "log": None, "timings": {}}

    def plan_resume(folder):
        plans.append(folder)
        return SimpleNamespace(job=dataclasses.replace(job), version=2, checkpoint=None, name=f"plan{len(plans)}")

    monkeypatch.setattr(job_module, "run_job", run_job)
    monkeypatch.setattr(resume_module, "plan_resume", plan_resume)
    monkeypatch.setattr("gyre.real.runtime.lifetime.terminate_on_sigterm", lambda: None)
    return cli._run(job), runs, plans


def test_a_dead_cell_resumes_the_run_from_its_folder(monkeypatch, tmp_path, capsys):
    code, runs, plans = _run_with(monkeypatch, tmp_path, failures=2, restarts=2)
    assert code == 0 and runs[0] is None and [p.name for p in runs[1:]] == ["plan1", "plan2"]
    assert plans == [str(tmp_path / "run")] * 2
    assert "training cell 1 (exit code -9) died (run 2); resuming at version 2" in capsys.readouterr().err


def test_past_cell_restarts_the_failure_is_raised(monkeypatch, tmp_path):
    with pytest.raises(CellFailed, match=r"run 2\)"):
        _run_with(monkeypatch, tmp_path, failures=2, restarts=1)


def test_no_restarts_means_the_first_failure_ends_the_run(monkeypatch, tmp_path):
    with pytest.raises(CellFailed, match=r"run 1\)"):
        _run_with(monkeypatch, tmp_path, failures=1, restarts=0)
