"""The SimPy driver: conservation, capacity, Colocate's barrier, Theorem A.1, replay, errors."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from gyre import events as ev
from gyre.cli import main as gyre_main
from gyre.presets import ABLATION_NAMES
from gyre.scheduler import Scheduler
from gyre.formats.eventlog import load_events, replay, replay_run
from gyre.sim.runner import run_simulation
from gyre.formats.trace import Trace
from gyre.sim.traces.presets import generate_trace


@pytest.fixture(scope="module")
def small_trace() -> Trace:
    return generate_trace("nl2repo-122b", 200, np.random.default_rng(3), N=16)


@pytest.mark.parametrize("preset", ABLATION_NAMES)
def test_every_execution_ends_once_and_capacity_holds(preset, small_trace):
    result = run_simulation(preset, small_trace, steps=6, seed=1)
    finished = Counter(row["execution"] for row in result.record.log.rows if row["kind"] == "execution_finished")
    assert max(finished.values()) == 1
    started = set(result.record.executions)
    assert set(finished) <= started
    still_running = {x for x, row in result.record.executions.items() if row["end_s"] is None}
    assert started == set(finished) | still_running
    # replaying the log through a fresh core reproduces every action and, after
    # every event, running executions fit in the rollout capacity of that moment
    core = Scheduler(result.cfg)
    replayed = []
    for row in result.record.log.rows:
        event = ev.event_from_dict({k: v for k, v in row.items() if k != "seq"})
        replayed += [a.as_dict() for a in core.handle(event)]
        assert core.holding <= core.capacity  # executions holding a slot; stopped harnesses hold none
    assert replayed == result.record.log.actions
    assert result.summary["groups_consumed"] == 6 * result.cfg.B


def test_colocate_never_trains_while_its_rollouts_run(small_trace):
    result = run_simulation("C0", small_trace, steps=8, seed=1)
    execs = pd.DataFrame(result.record.executions.values())
    for step in result.record.step_rows():
        overlap = execs[(execs.start_s < step["end_s"]) & (execs.end_s.fillna(np.inf) > step["start_s"])]
        assert overlap.empty, f"step {step['step']} overlaps {len(overlap)} executions"


@pytest.mark.slow
@pytest.mark.parametrize("preset, overrides", [
    ("E0", {}), ("A0", {}), ("C0", {}), ("E1", {}), ("C2", {}), ("E0", {"phi": 1.0, "mu": 2}),
])
def test_long_runs_reproduce_theorem_a1(preset, overrides, small_trace):
    """Group-weighted mean staleness after a warm-up of 2 bursts, within 0.1 of phi + (mu-1)/2."""
    result = run_simulation(preset, small_trace, steps=60, seed=2, overrides=overrides)
    groups = pd.DataFrame(result.record.consumed_groups())
    warmup = 2 * result.cfg.mu
    steady = groups[groups.v_t >= warmup]
    assert abs(steady.staleness.mean() - result.cfg.predicted_staleness) < 0.1


def test_same_seed_gives_identical_outputs(tmp_path):
    a = run_simulation("E0", "nl2repo-122b", steps=3, seed=5).write(tmp_path / "a")
    b = run_simulation("E0", "nl2repo-122b", steps=3, seed=5).write(tmp_path / "b")
    for name in ("events.csv", "steps.csv", "groups.csv", "roles.csv", "executions.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    sa.pop("wall_seconds"), sb.pop("wall_seconds")
    assert sa == sb
    c = run_simulation("E0", "nl2repo-122b", steps=3, seed=6).write(tmp_path / "c")
    assert (a / "events.csv").read_bytes() != (c / "events.csv").read_bytes()


def test_written_run_replays_to_the_same_actions(tmp_path):
    result = run_simulation("C2", "nl2repo-122b", steps=3, seed=0)
    out = result.write(tmp_path / "run")
    assert replay_run(out) == result.record.log.actions
    events = load_events(out / "events.csv")
    assert replay(result.cfg, events[:-1]) != result.record.log.actions  # a shorter log differs


def test_cli_writes_the_documented_tables(tmp_path, capsys):
    assert gyre_main(["sim", "--preset", "E0", "--steps", "2", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("preset", "trace", "steps", "seed", "total_hours", "mean_step_hours", "staleness_mean",
                "staleness_token_weighted_mean", "staleness_max", "staleness_predicted", "transitions",
                "events", "wall_seconds"):
        assert key in summary
    assert list(pd.read_csv(tmp_path / "steps.csv").columns) == [
        "step", "start_s", "end_s", "duration_s", "training_cells_max", "published"]
    assert list(pd.read_csv(tmp_path / "groups.csv").columns)[:9] == [
        "group_id", "query_id", "v_d", "v_t", "staleness", "dispatched_at_s", "ready_at_s",
        "consumed_at_s", "consumed_step"]
    assert list(pd.read_csv(tmp_path / "roles.csv").columns) == ["cell", "role", "start_s", "end_s"]
    assert "staleness, steady-state group mean" in capsys.readouterr().out


def test_ablation_grid_writes_ratios_against_e0(tmp_path, capsys):
    assert gyre_main(["sim", "--grid", "ablation", "--steps", "2", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "ablation.csv")
    assert list(table.preset) == list(ABLATION_NAMES)
    e0 = table.set_index("preset").loc["E0"]
    assert e0.vs_E0 == 1.0
    assert np.allclose(table.vs_E0, table.total_hours / e0.total_hours, atol=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["--set", "K=0"], "K must be >= 1"),
    (["--set", "phi=-1"], "phi must be >= 0"),
    (["--set", "warp=9"], "unknown field 'warp'"),
    (["--cost", "publish_s=-3"], "publish_s must be >= 0"),
    (["--preset", "Z9"], "unknown preset 'Z9'"),
    (["--steps", "0"], "steps must be >= 1"),
])
def test_bad_config_fails_with_a_clear_message(argv, message, capsys):
    assert gyre_main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre sim: error:") and message in err


def test_bad_trace_fails_naming_row_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    rows = [{"query_id": 0, "execution_index": i, "duration_s": 100.0, "outcome": "completed"} for i in range(16)]
    rows[5]["duration_s"] = -4
    pd.DataFrame(rows).to_csv(bad, index=False)
    assert gyre_main(["sim", "--trace", str(bad), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "duration_s" in err and "row" in err
    wrong_n = tmp_path / "n8.csv"
    pd.DataFrame(rows[:8]).assign(duration_s=10.0).to_csv(wrong_n, index=False)
    assert gyre_main(["sim", "--trace", str(wrong_n), "--steps", "1"]) == 2
    assert "16" in capsys.readouterr().err


def test_methods_grid_reports_gyre_speedups(tmp_path):
    assert gyre_main(["sim", "--grid", "methods", "--trace", "deepswe", "--steps", "2",
                      "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "methods.csv")
    assert list(table.workload) == ["deepswe", "deepswe"] and list(table["E[d]"]) == [1.0, 1.5]
    assert np.allclose(table.speedup_vs_async, table.async_hours / table.gyre_hours, atol=1e-5)
    assert np.allclose(table.speedup_vs_colocate, table.colocate_hours / table.gyre_hours, atol=1e-5)
    gyre_run = json.loads((tmp_path / "deepswe" / "gyre-1.5" / "summary.json").read_text())
    assert gyre_run["preset"] == "gyre-1.5" and gyre_run["steps"] == 2
    assert gyre_run["total_hours"] == pytest.approx(table.set_index("E[d]").loc[1.5, "gyre_hours"], abs=1e-5)
    assert gyre_run["staleness_predicted"] == 1.5


def test_a_run_that_runs_out_of_events_names_the_core_state(small_trace):
    from gyre.presets import build_preset
    from gyre.sim.costs import CostModel
    from gyre.sim.driver import Simulation, SimulationStalled

    class NoTraining(Simulation):
        def on_start_batch(self, a) -> None:
            """Batches open but never train, so no StepDone ever comes."""

    sim = NoTraining(build_preset("E0"), small_trace, CostModel(), steps=2)
    with pytest.raises(SimulationStalled, match=r"stalled at t=.* after 0 of 2 steps: d=\d+"):
        sim.run()
    with pytest.raises(ValueError, match="steps must be >= 1"):
        Simulation(build_preset("E0"), small_trace, CostModel(), steps=0)


def test_the_cyclic_collector_is_paused_during_a_run_and_resumed_however_it_ends(small_trace):
    import gc

    from gyre.presets import build_preset
    from gyre.sim.costs import CostModel
    from gyre.sim.driver import Simulation, SimulationStalled

    seen: list[bool] = []

    class Watching(Simulation):
        def on_start_batch(self, a) -> None:
            seen.append(gc.isenabled())
            super().on_start_batch(a)

    class NoTraining(Simulation):
        def on_start_batch(self, a) -> None:
            """Batches open but never train: the run stalls."""

    assert gc.isenabled()
    Watching(build_preset("E0"), small_trace, CostModel(), steps=1).run()
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(SimulationStalled):
        NoTraining(build_preset("E0"), small_trace, CostModel(), steps=1).run()
    assert gc.isenabled()
    gc.disable()  # a caller that runs without the collector keeps it off
    try:
        Watching(build_preset("E0"), small_trace, CostModel(), steps=1).run()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_dropped_result_frees_its_record_without_the_collector(small_trace):
    import gc
    import weakref

    gc.disable()
    try:
        result = run_simulation("E0", small_trace, steps=1, seed=0)
        record, log = weakref.ref(result.record), weakref.ref(result.record.log)
        del result
        assert record() is None and log() is None  # reference counting alone: no cycle holds them
    finally:
        gc.enable()
