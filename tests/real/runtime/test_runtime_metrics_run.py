"""Live metrics of a real run (issue 16 item 4): ``gyre run`` writes ``metrics.jsonl`` and ``tb/`` while it runs.

A small real job (preset gyre-1 on one node: one SGLang CPU engine, one
Megatron-core training cell, the proxy and scripted harnesses; N = B = 2,
4 steps = 2 bursts) runs as a subprocess of the real CLI. Checked:
- a metrics line is on disk while the job still runs (before its summary exists);
- every step has exactly one line, with finite numbers and no problems named;
- each line's staleness (mean, max) is v_t - v_d of the groups fed to that step,
  with v_d and v_t read independently from the event log's DispatchGroups and
  FeedGroups actions; the backend's per-group staleness (summary) agrees;
- loss and reward equal the run summary's; transitions and publications only grow;
  the time breakdown sums to at most the record's time; engine load names the engine;
- TensorBoard's own event reader reads back the same loss, reward and staleness;
- off a terminal, stderr has one plain ``progress:`` line per step naming step, burst and roles;
- nothing died, so nothing was restarted, on the way out either (the ordered stop once ended the proxy
  under its watcher, which relaunched it).
Skipped, with the reason, when the SGLang virtualenv is absent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gyre.formats.eventlog import replay_run
from gyre.real.engines.manager import sglang_python

try:
    from jobs import small_job, write_job
except ImportError:
    from ..jobs import small_job, write_job

NO_VENV = f"SGLang CPU venv not found at {sglang_python()} (run tools/setup_sglang_cpu.sh)"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(not sglang_python().exists(), reason=NO_VENV)]



def numbers(value):
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics-run")
    work = tmp / "run"
    write_job(tmp, small_job(work, model_dir=tmp / "tok", steps=4, timeout_s=400.0))
    proc = subprocess.Popen([sys.executable, "-m", "gyre.cli", "run", "--config", str(tmp / "job.toml")],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=(tmp / "stderr.txt").open("w"), text=True)
    live_lines = 0
    while proc.poll() is None:  # watch the file the way tail -f does
        path = work / "metrics.jsonl"
        if not live_lines and path.exists() and not (work / "summary.json").exists():
            live_lines = len(path.read_text().splitlines())
        time.sleep(0.2)
    stdout = proc.stdout.read()
    stderr = (tmp / "stderr.txt").read_text()
    assert proc.returncode == 0, stderr[-4000:]
    return {"work": work, "stdout": stdout, "stderr": stderr, "live_lines": live_lines,
            "summary": json.loads((work / "summary.json").read_text()),
            "records": [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]}


def test_every_step_has_one_finite_line_written_during_the_run(run):
    records, s = run["records"], run["summary"]
    print("records:", json.dumps(records[-1]))
    assert run["live_lines"] >= 1, "no metrics line appeared while the job ran"
    assert s["steps"] == 4 and [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert r["problems"] == [] and all(math.isfinite(n) for n in numbers(r)), r
        for key in ("loss", "reward_mean", "staleness_mean", "staleness_max", "step_wall_s", "time_s"):
            assert isinstance(r[key], (int, float)), (key, r)
        assert 0 < sum(r["breakdown_s"].values()) <= r["time_s"] + 1e-6
        assert set(r["engine_load"]) == {"e0"} and sum(r["engine_load"].values()) == r["running"]
    assert [r["loss"] for r in records] == pytest.approx(s["losses"])
    assert [r["reward_mean"] for r in records] == pytest.approx(s["reward_curve"])
    assert [r["burst"] for r in records] == [1, 1, 2, 2]
    for key in ("transitions", "publications", "time_s"):
        assert all(a[key] <= b[key] for a, b in zip(records, records[1:])), key
    assert records[-1]["transitions"] > 0 and records[-1]["publications"] >= 1


def test_staleness_per_step_is_v_t_minus_v_d_of_the_groups_fed_to_it(run):
    v_d, v_t = {}, {}
    for a in replay_run(Path(run["summary"]["log"])):
        if a["kind"] in ("dispatch_groups", "feed_groups"):
            for g in a["groups"]:
                (v_d if a["kind"] == "dispatch_groups" else v_t)[g] = a["version"]
    assert run["summary"]["staleness_per_group"] == [v_t[g] - v_d[g] for g in sorted(v_t)]
    for r in run["records"]:
        fed = [v_t[g] - v_d[g] for g in v_t if v_t[g] == r["version"]]
        assert r["groups"] == len(fed) == 2
        assert (r["staleness_mean"], r["staleness_max"]) == (pytest.approx(sum(fed) / len(fed)), max(fed))


def test_tensorboard_reads_back_the_same_values(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run["work"] / "tb"))
    acc.Reload()
    for tag in ("loss", "reward_mean", "staleness_mean", "transitions", "breakdown_s/waiting", "engine_load/e0"):
        field, _, sub = tag.partition("/")
        expected = [(r["step"], r[field][sub] if sub else r[field]) for r in run["records"]]
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in expected], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6, abs=1e-6), tag


def test_off_a_terminal_each_step_prints_one_plain_progress_line(run):
    lines = [line for line in run["stderr"].splitlines() if line.startswith("[gyre run] progress: ")]
    assert len(lines) == 4, run["stderr"][-2000:]
    assert lines[0].startswith("[gyre run] progress: step 1/4, burst 1, roles 0:")
    assert lines[-1].startswith("[gyre run] progress: step 4/4, burst 2, roles 0:")


def test_a_clean_run_restarts_nothing_on_its_way_out(run):
    said = [line for line in run["stderr"].splitlines() if "exited" in line or "restarting" in line]
    assert said == [], said
    assert run["summary"]["proxy_restarts"] == [] and run["summary"]["engine_restarts"] == []
