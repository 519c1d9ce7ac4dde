"""``load_job_config``: the shipped CPU demo loads, and a bad job file fails before anything starts.

Each error names the file and the field or value at fault (an unknown field,
an isolation mode, a run that is not whole bursts, a value the policy core
refuses, a malformed TOML file).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.real.runtime.job import JobConfig, load_job_config

DEMO = Path(__file__).resolve().parents[2] / "configs" / "cpu_demo.toml"


def test_the_shipped_demo_loads_with_overrides():
    job = load_job_config(DEMO, steps=4, workdir="elsewhere")
    assert (job.K, job.N, job.B, job.mu, job.steps, job.workdir) == (2, 8, 2, 2, 4, "elsewhere")
    assert job.scheduler().predicted_staleness == pytest.approx(0.5)


@pytest.mark.parametrize("text, message", [
    ("[job]\nstepz = 4\n", "unknown field(s) ['stepz']"),
    ("[job]\nisolate = 'sometimes'\n", "isolate must be one of"),
    ("[job]\nsteps = 5\nmu = 2\n", "steps must be a positive multiple of mu = 2"),
    ("[job]\nK = 0\n", "K must be >= 1"),
    ("[job\nK = 2\n", "job configuration"),
    ("[job]\nharness_timeout_s = 100.0\noverall_timeout_s = 50.0\n", "harness_timeout_s <= overall_timeout_s"),
])
def test_a_bad_job_file_is_named(tmp_path, text, message):
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_job_config(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="no-such.toml"):
        load_job_config(tmp_path / "no-such.toml")


def test_defaults_are_a_valid_job():
    assert JobConfig().scheduler().K == 2


def test_gyre_run_refuses_a_bad_override_before_starting_anything(capsys):
    from gyre.cli import main

    assert main(["run", "--config", str(DEMO), "--set", "steps=3"]) == 2
    assert "steps must be a positive multiple of mu = 2" in capsys.readouterr().err
    assert main(["run", "--config", str(DEMO), "--set", "steps=="]) == 2
