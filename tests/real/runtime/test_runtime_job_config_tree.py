"""The job's configuration tree (``runtime.job_config``): its invariants, on generated job files.

- constructors do no I/O: a job naming files that do not exist and a harness
  that cannot be imported still builds (``check_environment`` looks);
- a value of the wrong type, or below a field's least value, raises one
  ValueError naming the field as the job file spells it;
- ``job_to_table`` then ``job_from_table`` gives back an equal job;
- ``gyre run --set`` reaches every field under the file's name and the tree's
  (``section.field``), and names the flag and the field when a value has the
  wrong type; the ways to configure a run are counted (tools/count_config_ways.py)
  and every counted job-file key is one ``--set`` takes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.overrides import OverrideError, parse_assignments
from gyre.real.runtime.cli import job_overrides, set_sections
from gyre.real.runtime.job_config import JobConfig
from gyre.real.runtime.job_file import SECTIONS, field_default, job_from_table, job_to_table

ROOT = Path(__file__).resolve().parents[3]
SCALARS = {key: value for key, value in job_to_table(JobConfig()).items() if not isinstance(value, dict)}
CHOICES = {"isolate", "device", "wandb"}  # text fields that take only named values
FREE = {"preset", "workdir", "model_dir", "harness", "tasks", "evaluator", "target"}  # any text (checked later)

VALID = {
    "preset": st.sampled_from(["gyre-1", "gyre-1.5", "async-1", "colocate-1", "C1"]),
    "nodes": st.integers(2, 6), "C_e": st.integers(2, 16), "N": st.integers(1, 4), "B": st.integers(1, 4),
    "seed": st.integers(0, 2**31), "lr": st.floats(0, 1), "max_tokens": st.integers(1, 4096),
    "calls": st.integers(0, 8), "cell_restarts": st.integers(0, 5), "token_budget": st.integers(1, 10**6),
    "workdir": st.text("abc/-_", min_size=1, max_size=12), "target": st.sampled_from("abcde"),
    "isolate": st.sampled_from(["auto", "always", "never"]), "wandb": st.sampled_from(["", "offline"]),
    "schedule": st.fixed_dictionaries({}, optional={"tau": st.floats(0, 10), "phi": st.sampled_from([0.0, 1.0])}),
    "harness_options": st.dictionaries(st.sampled_from(["calls", "compact_every"]), st.integers(0, 3)),
}


def wrong_values(default):
    """Values a field whose default is ``default`` must refuse: another type (an int passes for a float)."""
    others = st.one_of(st.text(max_size=4), st.booleans(), st.lists(st.integers(), max_size=2))
    if isinstance(default, str):
        return st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.text(), max_size=2))
    if isinstance(default, bool):
        return st.one_of(st.integers(), st.text(max_size=4))
    if isinstance(default, int):
        return st.one_of(others, st.floats(allow_nan=False).filter(lambda v: v != int(v) if abs(v) < 1e15 else True))
    return others


def test_constructors_do_no_io(tmp_path):
    missing = str(tmp_path / "nowhere")
    job = job_from_table({"model_dir": missing, "model": {"checkpoint": missing}, "tasks": missing + ".jsonl",
                          "evaluator": "no_such_module:Nope", "harness": "no_such_module:Harness"})
    assert job.model.checkpoint == missing and not (tmp_path / "nowhere").exists()
    with pytest.raises(ValueError, match="nowhere"):
        job.check_environment()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_value_of_the_wrong_type_is_refused_naming_its_field(data):
    key = data.draw(st.sampled_from(sorted(SCALARS)), label="key")
    value = data.draw(wrong_values(SCALARS[key]), label="value")
    with pytest.raises(ValueError) as info:
        job_from_table({key: value})
    assert f"job field {key} " in str(info.value)


@pytest.mark.parametrize("key", sorted(k for k, v in SCALARS.items() if isinstance(v, (int, float))
                                       and not isinstance(v, bool) and k != "seed"))
def test_a_number_below_its_least_value_is_refused_naming_its_field(key):
    with pytest.raises(ValueError) as info:
        job_from_table({key: -1})
    assert key in str(info.value)


@pytest.mark.parametrize("key, value", [("lr", float("nan")), ("timeout_s", float("inf")),
                                        ("harness_timeout_s", float("nan"))])
def test_a_number_that_is_not_finite_is_refused_naming_its_field(key, value):
    with pytest.raises(ValueError, match=f"job field {key} must be a finite number"):
        job_from_table({key: value})


@settings(max_examples=40, deadline=None)
@given(table=st.fixed_dictionaries({}, optional=VALID))
def test_a_job_file_round_trips_through_the_tree(table):
    try:
        job = job_from_table(table)
    except ValueError as exc:  # only the schedule's own rules may refuse a generated shape (whole bursts)
        assert "steps must be a positive multiple of mu" in str(exc) or str(exc).startswith("schedule:"), exc
        return
    written = job_to_table(job)
    assert job_from_table(written) == job
    assert {k: written[k] for k in table} == {k: (dict(v) if isinstance(v, dict) else v) for k, v in table.items()}


@pytest.mark.parametrize("table", [
    {"cluster": {"address": "10.0.0.1:6379", "rank_cpus": 2.0}},
    {"device": "cuda", "model": {"checkpoint": "ckpt", "dtype": "bfloat16"}, "nodes": 2,
     "layout": {"gpus_per_node": 8, "tensor_parallel": 4, "engine_tensor_parallel": 4}},
])
def test_a_job_file_with_tables_round_trips_through_the_tree(table):
    job = job_from_table(table)
    assert job.cluster is not None or job.layout.gpus is not None
    assert job_from_table(job_to_table(job)) == job


def test_a_job_json_written_before_the_tree_still_loads():
    """The flat ``JobConfig`` of before wrote every field, its tables empty when unused (a resume reads it)."""
    before = {"workdir": "runs/x", "model_dir": "tok", "preset": "gyre-1", "nodes": 2, "C_e": 2, "N": 2, "B": 2,
              "schedule": {"tau": 0.0}, "steps": 4, "calls": 2, "max_tokens": 12, "target": "e", "lr": 0.001,
              "seed": 0, "token_budget": 4096, "timeout_s": 900.0, "harness_timeout_s": 600.0,
              "overall_timeout_s": 900.0, "isolate": "auto", "model": {}, "harness": "scripted",
              "harness_options": {}, "tasks": "", "evaluator": "", "device": "cpu", "layout": {}, "tp": 1,
              "cluster": {}, "cell_restarts": 2, "wandb": ""}
    job = job_from_table(before)
    assert job.cluster is None and job.layout.gpus is None and job.model.checkpoint == ""
    assert job == job_from_table(job_to_table(job)) and job.schedule.overrides == {"tau": 0.0}


def test_every_field_of_the_tree_has_one_place_in_the_file():
    owners = [JobConfig, *SECTIONS.values()]
    keys = [f.metadata.get("key") or f.name for owner in owners for f in dataclasses.fields(owner)
            if f.name not in SECTIONS]
    assert len(keys) == len(set(keys)), "two fields read the same key of the job file"
    assert set(job_to_table(JobConfig())) == {k.split(".")[0] for k in keys} - {"layout", "cluster"}  # None: left out


@pytest.mark.parametrize("given, key, value", [
    ("training.lr=0.5", ("lr",), 0.5), ("lr=0.5", ("lr",), 0.5), ("job.lr=0.5", ("lr",), 0.5),
    ("harness.name=codex", ("harness",), "codex"), ("tasks.path=x.jsonl", ("tasks",), "x.jsonl"),
    ("model.checkpoint=DIR", ("model", "checkpoint"), "DIR"), ("model.model_dir=D", ("model_dir",), "D"),
    ("schedule.preset=C1", ("preset",), "C1"), ("schedule.phi=1", ("schedule", "phi"), 1.0),
    ("layout.device=cuda", ("device",), "cuda"), ("layout.tensor_parallel=2", ("layout", "tensor_parallel"), 2),
    ("metrics.wandb=offline", ("wandb",), "offline"), ("proxy.max_tokens=8", ("max_tokens",), 8),
    ("harness_options.turbo=true", ("harness_options", "turbo"), True),
])
def test_set_names_a_field_by_the_tree_or_by_the_file(given, key, value):
    fields, tables = job_overrides([given])
    assert (fields[key[0]] if len(key) == 1 else tables[key[0]][key[1]]) == value


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_set_names_the_flag_and_the_field_of_a_value_of_the_wrong_type(data):
    typed = sorted(k for k, v in SCALARS.items() if isinstance(v, (bool, int, float)))
    key = data.draw(st.sampled_from(typed), label="key")
    text = data.draw(st.sampled_from(["abc", "[1]", '"7"', "{a = 1}"]), label="text")
    with pytest.raises(OverrideError) as info:
        job_overrides([f"{key}={text}"])
    assert str(info.value).startswith(f"--set {key}={text}: job.{key} takes")
    assert field_default((key,)) == SCALARS[key]


def test_the_ways_to_configure_a_run_are_counted_and_each_job_file_key_is_one_set_takes():
    spec = importlib.util.spec_from_file_location("count_config_ways", ROOT / "tools" / "count_config_ways.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    ways = tool.count()
    flags, keys, env = ways["cli_flags"], ways["job_file_keys"], ways["environment"]
    assert ways["total"] == sum(map(len, flags.values())) + len(keys) + len(env)
    assert "--set" in flags["run"] and "--set" in flags["sim"] and "GYRE_FAULT_PAUSE" in env
    sections = set_sections()
    for key in keys:
        name = key.replace(".*", ".anything") if "." in key else f"job.{key}"
        assert parse_assignments("--set", [f"{name}=1"], sections), key
