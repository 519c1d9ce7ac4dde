"""``load_job_config``: the shipped CPU demo loads, and a bad job file fails before anything starts.

Each error names the file and the field or value at fault (an unknown field,
an isolation mode, a run that is not whole bursts, a value the policy core
refuses, a malformed TOML file). ``tp`` (tensor-parallel ranks per training
cell) is a positive integer the toy model must split over: its heads, query
groups, FFN and vocabulary (the tiny tokenizer's), as ``CellConfig`` checks,
named with the job file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.real.runtime.job import JobConfig, load_job_config
from gyre.real.runtime.job_file import job_from_table

DEMO = Path(__file__).resolve().parents[3] / "configs" / "cpu_demo.toml"


def test_the_shipped_demo_loads_with_overrides():
    job = load_job_config(DEMO, steps=4, workdir="elsewhere")
    cfg = job.scheduler()
    assert (cfg.K, cfg.N, cfg.B, cfg.mu, job.steps, job.workdir) == (3, 4, 2, 2, 4, "elsewhere")
    assert (job.schedule.preset, cfg.granularity, cfg.streaming, cfg.tau, cfg.phi) == ("gyre-1", "fine", True, 0.0, 1.0)
    assert cfg.predicted_staleness == pytest.approx(1.5)


@pytest.mark.parametrize("preset, expected", [
    ("gyre-1.5", {"K": 4, "C_s": 0, "granularity": "fine", "streaming": True, "phi": 0.5, "mu": 3}),
    ("async-1", {"K": 4, "static_train_cells": 2, "granularity": "none", "phi": 1.0, "mu": 1}),
    ("colocate-1", {"K": 4, "granularity": "global", "phi": 0.0, "mu": 3}),
    ("C1", {"K": 3, "C_s": 8, "granularity": "coarse", "streaming": False}),
])
def test_a_preset_scales_to_the_jobs_cells(preset, expected):
    cfg = job_from_table(dict(preset=preset, nodes=4, C_e=8, N=2, B=2, steps=6)).scheduler()
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_schedule_overrides_apply_on_top_of_the_preset(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[job]\npreset = 'gyre-1'\nsteps = 2\n[job.schedule]\ntau = 2.5\nrho_min = 1.0\n")
    cfg = load_job_config(path).scheduler()
    assert (cfg.tau, cfg.rho_min, cfg.mu) == (2.5, 1.0, 2)


@pytest.mark.parametrize("text, message", [
    ("[job]\nstepz = 4\n", "unknown field(s) ['stepz']"),
    ("[job]\nisolate = 'sometimes'\n", "isolate must be one of"),
    ("[job]\nsteps = 5\n", "steps must be a positive multiple of mu = 2"),
    ("[job]\nnodes = 0\n", "job field nodes must be an integer >= 1, not 0"),
    ("[job]\npreset = 'gyre-9'\n", "unknown preset 'gyre-9'"),
    ("[job.schedule]\nwarp = 9\n", "schedule: "),
    ("[job.schedule]\nphi = -1.0\n", "phi must be >= 0"),
    ("[job]\nschedule = 3\n", "schedule must be a table"),
    ("[job\nK = 2\n", "job configuration"),
    ("[job]\nharness_timeout_s = 100.0\noverall_timeout_s = 50.0\n", "harness_timeout_s <= overall_timeout_s"),
    ("[job]\ncell_restarts = -1\n", "job field cell_restarts must be an integer >= 0, not -1"),
    ("[job]\ncell_restarts = true\n", "job field cell_restarts must be an integer >= 0, not True"),
    ("[job]\nsupervisor_grace_s = -5\n", "job field supervisor_grace_s must be a number >= 0, not -5"),
    ("[job]\nsupervisor_grace_s = \"long\"\n", "job field supervisor_grace_s must be a number >= 0, not 'long'"),
    ("[job]\nsupervisor_grace_s = nan\n", "job field supervisor_grace_s must be a finite number"),
    ("[job]\nsupervisor_grace_s = inf\n", "job field supervisor_grace_s must be a finite number"),
    ("[job]\nwandb = \"online\"\n", "wandb must be \"offline\" or"),
    ("[job]\nwandb = true\n", "wandb must be \"offline\" or"),
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
    assert JobConfig().scheduler().K == 2 and JobConfig().schedule.preset == "gyre-1"


def test_gyre_run_refuses_a_bad_override_before_starting_anything(capsys):
    from gyre.cli import main

    assert main(["run", "--config", str(DEMO), "--set", "steps=3"]) == 2
    assert "steps must be a positive multiple of mu = 2" in capsys.readouterr().err
    assert main(["run", "--config", str(DEMO), "--set", "steps=="]) == 2


def test_tp_reaches_the_job_and_a_default_job_has_one_rank_cells(model, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(f"[job]\nmodel_dir = '{model}'\ntp = 2\n")
    job = load_job_config(path)
    assert (job.training.tp, job.cell_tp(), JobConfig().cell_tp()) == (2, 2, 1)
    assert job.model.toy_config(job.seed).vocab_size % 2 == 0


@pytest.mark.parametrize("value, message", [
    ("0", "job field tp must be an integer >= 1, not 0"),
    ("'2'", "job field tp must be an integer >= 1, not '2'"),
    ("true", "job field tp must be an integer >= 1, not True"),
    ("4", "training cells of tp = 4 ranks: model num_query_groups = 2 is not divisible by tp = 4"),
    ("3", "training cells of tp = 3 ranks: model num_attention_heads = 4 is not divisible by tp = 3"),
])
def test_a_tp_the_toy_model_cannot_split_is_named_with_the_file(model, tmp_path, value, message):
    path = tmp_path / "job.toml"
    path.write_text(f"[job]\nmodel_dir = '{model}'\ntp = {value}\n")
    with pytest.raises(ValueError) as info:
        load_job_config(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_tp_the_vocabulary_cannot_split_is_named(model, tmp_path):
    """An odd vocabulary cannot split over two ranks (heads, query groups and FFN of the toy model can)."""
    from gyre.real.train.model import ModelConfig

    odd = job_from_table(dict(model_dir=str(model))).model.toy_config(0).vocab_size | 1
    job = job_from_table(dict(model_dir=str(model), tp=2))
    with pytest.raises(ValueError, match=f"model vocab_size = {odd} is not divisible by tp = 2"):
        job.check_cells(ModelConfig(vocab_size=odd))
    job.check_cells(ModelConfig(vocab_size=odd + 1))  # an even one can


def test_gyre_run_set_takes_the_dotted_syntax_gyre_sim_takes():
    """``--set section.field=value`` (section optional): whole job fields, or entries merged into a table."""
    from gyre.real.runtime.cli import job_overrides

    fields, tables = job_overrides(["workdir=runs/x", "job.steps=6", "phi=0.5", "schedule.mu=3",
                                    "model.dtype=bfloat16", "cluster.address=auto"])
    assert fields == {"workdir": "runs/x", "steps": 6}  # a bare word is text (once "Invalid value ...")
    assert tables == {"schedule": {"phi": 0.5, "mu": 3}, "model": {"dtype": "bfloat16"},
                      "cluster": {"address": "auto"}}
    job = load_job_config(DEMO, tables={"schedule": {"mu": 3}}, steps=6)
    cfg = job.scheduler()
    assert (cfg.mu, cfg.phi, cfg.tau, job.steps) == (3, 1.0, 0.0, 6)  # the file's [job.schedule] is kept


def test_gyre_run_names_the_flag_and_the_field(capsys):
    from gyre.cli import main

    assert main(["run", "--config", str(DEMO), "--set", "steps=abc"]) == 2
    assert "--set steps=abc: job.steps takes an integer, not 'abc'" in capsys.readouterr().err
    assert main(["run", "--config", str(DEMO), "--set", "schedule.warp=1"]) == 2
    assert "--set schedule.warp=1: unknown field 'warp' in schedule" in capsys.readouterr().err
    assert main(["run", "--config", str(DEMO), "--set", "phi=-1"]) == 2
    assert "phi must be >= 0" in (err := capsys.readouterr().err) and "--set phi=-1" in err


def test_a_job_is_built_without_io_and_checked_against_what_it_names(tmp_path):
    """The constructor reads no file: a task set that is not there fails at ``check_environment``
    (which ``load_job_config`` runs), naming it."""
    missing = tmp_path / "no-tasks.jsonl"
    job = job_from_table(dict(tasks=str(missing), evaluator="gyre.real.toy.tasks:EmitCharTask"))
    with pytest.raises(ValueError, match="no-tasks.jsonl"):
        job.check_environment()
    path = tmp_path / "job.toml"
    path.write_text(f"[job]\ntasks = '{missing}'\nevaluator = 'gyre.real.toy.tasks:EmitCharTask'\n")
    with pytest.raises(ValueError, match="no-tasks.jsonl"):
        load_job_config(path)


def test_running_or_summarising_parts_that_were_never_built_is_named(tmp_path):
    from gyre.real.runtime.job_parts import JobParts

    parts = JobParts(JobConfig(workdir=str(tmp_path / "run")), say=lambda line: None)
    for use in (parts.wired, parts.run):
        with pytest.raises(RuntimeError, match="build\\(\\) has not finished"):
            use()
    parts.close()  # nothing started: nothing to stop
    assert not (tmp_path / "run").exists()
