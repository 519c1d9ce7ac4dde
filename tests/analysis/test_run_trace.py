"""``gyre timeline``: a run folder's Perfetto trace, read back and checked against the run's own tables.

The trace is built by replaying the event log (``gyre.analysis.run_trace``);
the simulator writes its roles, steps, groups and executions tables by another
path (its driver, as it applies actions), so agreement checks both. Reading
back here is the JSON trace event format's own rules (``check_trace``) plus
this module's reader: Perfetto's trace processor needs its
``trace_processor_shell`` binary, which no package registry ships (the
``perfetto`` package downloads it on first use), so the test that queries the
trace with it runs only where that binary is present
(``GYRE_TRACE_PROCESSOR=/path/to/trace_processor_shell``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

from gyre.analysis.run_trace import build_trace, check_trace, load_run_log, read_trace, write_trace
from gyre.cli import main
from gyre.formats.eventlog import load_events
from gyre.sim.runner import run_simulation


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for preset in ("gyre-1", "async-1"):
        out[preset] = run_simulation(preset, "nl2repo-122b", steps=4).write(root / preset)
    return out


@pytest.fixture(scope="module")
def gyre_trace(runs, tmp_path_factory) -> dict[str, pd.DataFrame]:
    path = write_trace([runs["gyre-1"]], tmp_path_factory.mktemp("trace") / "run.trace.json")
    return read_trace(path)


def test_cell_tracks_hold_the_recorded_roles_and_transitions(runs, gyre_trace):
    recorded = pd.read_csv(runs["gyre-1"] / "roles.csv")
    recorded = recorded[(recorded["end_s"] > recorded["start_s"]) | (recorded["role"] != "rollout")]
    cells = gyre_trace["slices"][gyre_trace["slices"]["thread"].str.startswith("cell ")]
    cells = cells[(cells["end_s"] > cells["start_s"]) | (cells["name"] != "rollout")]
    read = sorted((int(t.split()[1]), s, e, n) for t, s, e, n in
                  zip(cells["thread"], cells["start_s"], cells["end_s"], cells["name"]))
    want = sorted(zip(recorded["cell"], recorded["start_s"], recorded["end_s"], recorded["role"]))
    assert [(c, n) for c, _, _, n in read] == [(c, n) for c, _, _, n in want]
    assert {"to_training", "to_rollout"} <= {n for *_, n in read}
    assert np.allclose([s for _, s, _, _ in read], [s for _, s, _, _ in want], atol=1e-5)
    assert np.allclose([e for _, _, e, _ in read], [e for _, _, e, _ in want], atol=1e-5)


def test_step_and_publication_tracks_match_the_run(runs, gyre_trace):
    steps = pd.read_csv(runs["gyre-1"] / "steps.csv")
    read = gyre_trace["slices"][gyre_trace["slices"]["thread"] == "steps"].sort_values("start_s")
    assert list(read["name"]) == [f"step {v}" for v in steps["step"]]
    assert np.allclose(read["end_s"], steps["end_s"], atol=1e-5)
    assert np.allclose(read["start_s"], steps["start_s"], atol=1e-5)
    publications = gyre_trace["slices"][gyre_trace["slices"]["thread"] == "publications"]
    done = [e.now for e in load_events(runs["gyre-1"] / "events.csv") if e.kind == "publish_done"]
    assert np.allclose(sorted(publications["end_s"]), done, atol=1e-5)


def test_reroutes_are_instants_one_per_reroute(runs, gyre_trace):
    summary = json.loads((runs["gyre-1"] / "summary.json").read_text())
    instants = gyre_trace["instants"]
    assert summary["reroutes"] > 0
    assert len(instants) == summary["reroutes"]
    assert all(a["source"] != a["dest"] for a in instants["args"])


def _series(trace: dict[str, pd.DataFrame], counter: str, series: str) -> pd.DataFrame:
    c = trace["counters"]
    return c[(c["counter"] == counter) & (c["series"] == series)].sort_values("time_s", kind="stable")


def _value_at(frame: pd.DataFrame, t: float) -> float:
    """The counter's value from time t on (the last sample at or before t)."""
    return float(frame[frame["time_s"] <= t + 1e-7]["value"].iloc[-1])


def test_waterlevel_counter_is_dispatched_minus_finished_from_the_tables(runs, gyre_trace):
    groups = pd.read_csv(runs["gyre-1"] / "groups.csv")
    execs = pd.read_csv(runs["gyre-1"] / "executions.csv")
    n = json.loads((runs["gyre-1"] / "summary.json").read_text())["config"]["N"]
    water = _series(gyre_trace, "waterlevel", "w")
    for t in np.linspace(0.0, float(water["time_s"].max()), 40):
        dispatched = n * int((groups["dispatched_at_s"] <= t + 1e-7).sum())
        finished = int((execs["end_s"] <= t + 1e-7).sum())
        assert _value_at(water, t) == dispatched - finished, t


def test_engine_counters_stay_within_capacity_and_empty_while_a_cell_trains(runs, gyre_trace):
    cfg = json.loads((runs["gyre-1"] / "summary.json").read_text())["config"]
    slices = gyre_trace["slices"]
    for cell in range(cfg["K"]):
        load = _series(gyre_trace, "executions running", f"cell {cell}")
        assert len(load) and load["value"].between(0, cfg["C_e"]).all()
        training = slices[(slices["thread"] == f"cell {cell}") & (slices["name"] == "training")]
        for start, end in zip(training["start_s"], training["end_s"]):
            assert _value_at(load, (start + end) / 2) == 0
    busy = sum(_value_at(_series(gyre_trace, "executions running", f"cell {c}"), 100.0) for c in range(cfg["K"]))
    assert busy > 0


def test_two_runs_load_together_as_two_processes(runs, tmp_path):
    path = write_trace([runs["gyre-1"], runs["async-1"]], tmp_path / "both.trace.json")
    trace = read_trace(path)
    assert set(trace["slices"]["process"]) == {"simulated: gyre-1", "simulated: async-1"}
    doc = json.loads(path.read_text())
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if "tid" in e}
    assert len({tid for _, tid in threads}) == len(threads)  # no track shared between runs
    for process in ("simulated: gyre-1", "simulated: async-1"):
        steps = trace["slices"][(trace["slices"]["process"] == process) & (trace["slices"]["thread"] == "steps")]
        assert len(steps) == 4


def test_a_real_run_folder_is_read_from_its_log_even_when_only_the_journal_survived(runs, tmp_path):
    """A ``gyre run`` folder killed before it wrote events.csv: log/events.jsonl (here the simulated run's
    events with the clock starting at 1000 s, as any epoch may) gives the same tracks from time 0."""
    run = tmp_path / "real-run"
    (run / "log").mkdir(parents=True)
    source = runs["gyre-1"]
    (run / "log" / "summary.json").write_text((source / "summary.json").read_text())
    lines = [json.dumps({"seq": i, **e.as_dict(), "now": e.now + 1000.0}) + "\n"
             for i, e in enumerate(load_events(source / "events.csv"))]
    (run / "log" / "events.jsonl").write_text("".join(lines))
    log = load_run_log(run)
    assert log.world == "real" and len(log.events) == len(lines)
    doc = build_trace([run])
    assert check_trace(doc) == []
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names == ["real: real-run"]
    real = sorted((e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X")
    sim = sorted((e["name"], e["ts"], e["dur"]) for e in build_trace([source])["traceEvents"] if e["ph"] == "X")
    assert [n for n, _, _ in real] == [n for n, _, _ in sim]
    assert np.allclose([t for _, t, _ in real], [t for _, t, _ in sim], atol=10.0)  # microseconds
    assert np.allclose([d for _, _, d in real], [d for _, _, d in sim], atol=10.0)


def test_cli_writes_the_trace_and_refuses_a_folder_that_is_not_a_run(runs, tmp_path, capsys):
    assert main(["timeline", str(runs["gyre-1"]), "-o", str(tmp_path / "t.json")]) == 0
    assert check_trace(json.loads((tmp_path / "t.json").read_text())) == []
    (tmp_path / "empty").mkdir()
    assert main(["timeline", str(tmp_path / "empty"), "-o", str(tmp_path / "u.json")]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    assert not (tmp_path / "u.json").exists()


BREAKAGES = {
    "negative duration": lambda e: e.update(ph="X", ts=1.0, tid=1, dur=-1.0),
    "no timestamp": lambda e: e.pop("ts", None) if e["ph"] != "M" else e.update(name="bogus"),
    "unknown phase": lambda e: e.update(ph="Z"),
    "counter of text": lambda e: e.update(ph="C", args={"x": "high"}, ts=1.0),
    "instant without scope": lambda e: e.update(ph="i", ts=1.0, tid=1, s="q"),
}


@settings(max_examples=examples(60), deadline=None)
@given(index=st.integers(min_value=0), breakage=st.sampled_from(sorted(BREAKAGES)))
def test_check_trace_names_the_broken_event(runs, index, breakage):
    doc = build_trace([runs["gyre-1"]])
    i = index % len(doc["traceEvents"])
    BREAKAGES[breakage](doc["traceEvents"][i])
    problems = check_trace(doc)
    assert problems and problems[0].startswith(f"traceEvents[{i}]")


def _trace_processor_shell() -> str | None:
    path = os.environ.get("GYRE_TRACE_PROCESSOR")
    return path if path and Path(path).is_file() else None


@pytest.mark.skipif(_trace_processor_shell() is None,
                    reason="Perfetto's trace_processor_shell is not installed: no package registry ships it "
                           "(set GYRE_TRACE_PROCESSOR to its path to run this read-back)")
def test_perfetto_trace_processor_reads_the_spans(runs, tmp_path):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    path = write_trace([runs["gyre-1"], runs["async-1"]], tmp_path / "both.trace.json")
    steps = pd.read_csv(runs["gyre-1"] / "steps.csv")
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=_trace_processor_shell()))
    try:
        rows = tp.query("select s.name, s.ts, s.dur, t.name as thread, p.name as process from slice s "
                        "join thread_track tt on s.track_id = tt.id join thread t using(utid) "
                        "join process p using(upid) where t.name = 'steps'").as_pandas_dataframe()
    finally:
        tp.close()
    mine = rows[rows["process"] == "simulated: gyre-1"].sort_values("ts")
    assert list(mine["name"]) == [f"step {v}" for v in steps["step"]]
    assert np.allclose((mine["ts"] + mine["dur"]) / 1e9, steps["end_s"], atol=1e-5)
    assert set(rows["process"]) == {"simulated: gyre-1", "simulated: async-1"}


def test_the_slices_of_one_track_never_overlap(runs, tmp_path):
    trace = read_trace(write_trace([runs["gyre-1"], runs["async-1"]], tmp_path / "t.json"))
    for _, spans in trace["slices"].groupby(["process", "thread"]):
        spans = spans.sort_values(["start_s", "end_s"])
        assert (spans["end_s"].to_numpy()[:-1] <= spans["start_s"].to_numpy()[1:] + 1e-9).all()
        assert (spans["end_s"] >= spans["start_s"]).all()
