"""``gyre calibrate``: cost constants computed from a run folder's measurements, errors naming what is missing."""

from __future__ import annotations

import json
import struct

import pytest

from gyre.analysis.calibrate import CalibrationError, calibrate, model_parameters, write_cost_file
from gyre.sim.cost_file import load_cost_file
from gyre.sim.costs import CostModel


def _safetensors(path, shapes):
    header = {name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()}
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


PUBLISH_S = 7.5  # the simulated run's publication wait, which calibration must read back off its event log
# ... and its transition costs, distinct for the core unit and the satellites (read back the same way)
TRANSITIONS = {"to_training_s": 3.25, "to_rollout_s": 2.5, "satellite_to_training_s": 0.75,
               "satellite_to_rollout_s": 1.25}


def _event_log(run, **transitions):
    """A simulated run's event log and schedule: publication waits are exactly PUBLISH_S."""
    import dataclasses

    from gyre.sim.costs import CostModel as Costs
    from gyre.sim.runner import run_simulation

    result = run_simulation("gyre-1", steps=6, costs=Costs(publish_s=PUBLISH_S, publish_node_gbps=1e9,
                                                           **(transitions or TRANSITIONS)))
    (run / "log").mkdir(parents=True)
    result.record.log.write_csv(run / "log" / "events.csv")
    (run / "log" / "summary.json").write_text(json.dumps({"config": dataclasses.asdict(result.cfg)}))


def _run_folder(tmp_path, *, joins=True, **transitions):
    run = tmp_path / "run"
    _event_log(run, **transitions)
    (run / "engine-model").mkdir(parents=True)
    _safetensors(run / "engine-model" / "model.safetensors", {"a": [10, 20], "b": [5]})  # 205 parameters
    rows = ["query_id,execution_index,duration_s,outcome,input_tokens,output_tokens,call_count"]
    for q in range(4):
        for i in range(2):
            rows.append(f"{q},{i},10.0,completed,{100 + q},{20},2")
    (run / "trace.csv").write_text("\n".join(rows) + "\n")
    summary = {  # the backend's own transition timers: not used (the core cell's miss the publication export)
        "transitions": [{"cell": 0, "role": "training", "total_s": 100.0},
                        {"cell": 0, "role": "rollout", "total_s": 100.0, "publish_wait_s": 4.0}],
        "publishes": [{"version": 2, "wall_s": 2.5}, {"version": 4, "wall_s": 3.5}],  # narrower: not used
        "groups_fed": {"0": [0, 1], "1": [2, 3]},
        "step_reports": [
            {"version": 0, "microsteps": 3, "compute_s_by_cell": {"0": 0.5, "1": 0.25}, "update_s": 0.1,
             "joins": {"1": {"pull_s": 0.2}} if joins else {}},
            {"version": 1, "microsteps": 5, "compute_s_by_cell": {"0": 0.25}, "update_s": 0.3, "joins": {}},
        ],
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "job.json").write_text(json.dumps({"token_budget": 512, "seed": 0}))
    return run


def test_each_constant_is_the_documented_measure(tmp_path):
    run = _run_folder(tmp_path)
    costs = calibrate(run)
    assert model_parameters(run) == 205
    for name, value in TRANSITIONS.items():  # off the event log, the publication wait left out of to_rollout
        assert costs[name] == pytest.approx(value, abs=1e-5), name
    assert costs["publish_s"] == pytest.approx(PUBLISH_S, abs=1e-5)  # off the event log, not "publishes"
    assert costs["optimizer_s"] == pytest.approx(0.2)
    assert costs["weight_pull_s"] == pytest.approx(0.2)
    assert costs["micro_step_tokens"] == 512  # the run's packer budget (job.json)
    tokens = sum(2 * (100 + q + 20) for q in range(4))
    assert costs["node_peak_tflops"] == pytest.approx(6 * 205 * tokens / 1.0 / 1e12)
    CostModel(**costs)


def test_no_join_means_no_pull_cost(tmp_path):
    assert calibrate(_run_folder(tmp_path, joins=False))["weight_pull_s"] == 0.0


def test_without_satellite_moves_the_satellite_costs_are_left_to_the_core_values(tmp_path):
    """A static split moves no cell: no transition is measured at all, and that is named."""
    costs = calibrate(_run_folder(tmp_path, to_training_s=2.0, to_rollout_s=1.0, satellite_to_training_s=2.0,
                                  satellite_to_rollout_s=1.0))
    assert costs["to_training_s"] == pytest.approx(2.0, abs=1e-5)
    assert costs.get("satellite_to_training_s", 2.0) == pytest.approx(2.0, abs=1e-5)


def test_a_core_that_never_left_training_takes_the_satellites_rollout_cost(tmp_path):
    """A core unit that stays in training all run has no training -> rollout sample (seen in a 16-step run):
    here the run's log ends just before the core's first return to rollout, the satellites' already done."""
    run = _run_folder(tmp_path)
    log = run / "log" / "events.csv"
    rows = log.read_text().splitlines()
    cut = next(i for i, row in enumerate(rows) if row.split(",")[1] == "transition_done"
               and row.split(",")[6:8] == ["0", "rollout"])
    assert any(row.split(",")[1] == "transition_done" and row.endswith(",rollout,") for row in rows[:cut])
    log.write_text("\n".join(rows[:cut]) + "\n")
    costs = calibrate(run)
    assert costs["to_rollout_s"] == pytest.approx(TRANSITIONS["satellite_to_rollout_s"], abs=1e-5)
    assert costs["to_training_s"] == pytest.approx(TRANSITIONS["to_training_s"], abs=1e-5)


def test_the_cost_file_round_trips_through_the_simulators_loader(tmp_path):
    run = _run_folder(tmp_path)
    path = write_cost_file(run)
    assert load_cost_file(path) == pytest.approx(calibrate(run))


@pytest.mark.parametrize("breakage, words", [
    (lambda run: (run / "summary.json").unlink(), ["summary.json", "missing"]),
    (lambda run: (run / "log" / "events.csv").unlink(), ["events.csv", "missing"]),
    (lambda run: (run / "trace.csv").unlink(), ["trace.csv"]),
    (lambda run: (run / "summary.json").write_text("{"), ["not JSON"]),
    (lambda run: (run / "summary.json").write_text("{}"), ["step_reports"]),
    (lambda run: (run / "engine-model" / "model.safetensors").unlink(), ["safetensors"]),
    (lambda run: (run / "trace.csv").write_text("query_id,execution_index,duration_s\n0,0,1\n"), ["line 2"]),
])
def test_a_broken_run_folder_names_what_is_missing(tmp_path, breakage, words):
    run = _run_folder(tmp_path)
    breakage(run)
    with pytest.raises(CalibrationError) as info:
        calibrate(run)
    for word in words:
        assert word in str(info.value)


def test_a_span_across_a_resume_point_is_measured_from_it():
    """The resumed attempt applied an outstanding transition or publication again at the resume point, its
    clock going on from there (``runtime.controller``): a span crossing a point is the redone one, measured
    from the latest point it crosses; a span that begins at a point, or ends before it, is whole."""
    from types import SimpleNamespace

    from gyre.analysis.calibrate import _redone_from, _transition_times
    from gyre.analysis.role_timeline import Span, Timeline
    from gyre.roles import DESTINATION, TO_ROLLOUT, TO_TRAINING

    assert DESTINATION[TO_TRAINING] == "training" and DESTINATION[TO_ROLLOUT] == "rollout"
    cuts = [10.0, 20.0]
    tl = Timeline()
    tl.roles = {0: [Span(0.0, 4.0, "rollout"), Span(4.0, 7.0, TO_TRAINING), Span(7.0, 10.0, "training"),
                    Span(10.0, 14.0, TO_ROLLOUT), Span(14.0, 30.0, "rollout")],  # begins at a point: whole
                1: [Span(0.0, 8.0, "rollout"), Span(8.0, 22.5, TO_TRAINING),  # crosses 10 and 20: from 20
                    Span(22.5, 30.0, "training")]}
    tl.publications = {2: Span(9.0, 12.0, "publish")}  # crosses 10: from 10; ends after the core's from-time
    cfg = SimpleNamespace(core_unit=(0,))
    assert _transition_times(cfg, tl, cuts) == {(False, "training"): [3.0], (False, "rollout"): [2.0],
                                                (True, "training"): [2.5]}
    assert _transition_times(cfg, tl) == {(False, "training"): [3.0], (False, "rollout"): [2.0],
                                          (True, "training"): [14.5]}
    assert [_redone_from(s.start_s, s.end_s, cuts) for s in (tl.publications[2], *tl.roles[1])] == [
        10.0, 0.0, 20.0, 22.5]


def test_resume_points_are_the_last_events_each_attempt_kept(tmp_path):
    """A point is the ``now`` of an attempt's last kept event; a later resume that kept fewer events discarded
    an earlier attempt's later point; one that kept none started over; a record without the count is named."""
    import csv

    from gyre.analysis.calibrate import resume_times

    run = _run_folder(tmp_path)
    with open(run / "log" / "events.csv", newline="") as fh:
        now = [float(row["now"]) for row in csv.DictReader(fh)]
    cut = len(now) // 2
    for attempt, kept in ((1, 0), (2, len(now) - 1), (3, cut)):  # attempt 2's point lies in a discarded lineage
        (run / "attempts" / str(attempt)).mkdir(parents=True)
        (run / "attempts" / str(attempt) / "resume.json").write_text(json.dumps({"events_kept": kept}))
    assert resume_times(run, now) == [now[cut - 1]]
    (run / "attempts" / "4").mkdir()
    (run / "attempts" / "4" / "resume.json").write_text(json.dumps({"version": 2}))
    with pytest.raises(CalibrationError, match="attempts/4/resume.json: no events_kept"):
        calibrate(run)


def test_the_publication_cost_is_split_into_a_fixed_part_and_a_part_per_engine():
    from gyre.analysis.calibrate import publication_fit

    # 2 s fixed + 0.5 s per engine, measured at 1, 2 and 3 engines
    fixed, per_engine = publication_fit([1, 2, 3, 3], [2.5, 3.0, 3.5, 3.5])
    assert fixed == pytest.approx(2.0) and per_engine == pytest.approx(0.5)
    assert publication_fit([2, 2], [3.0, 5.0]) == (4.0, 0.0)  # one engine count: all fixed
    assert publication_fit([1, 2], [5.0, 4.0]) == (4.5, 0.0)  # no engine makes it faster
    assert publication_fit([], []) == (0.0, 0.0)


def test_the_simulated_publication_grows_with_the_engines_loading_it():
    from gyre.sim.costs import CostModel
    from gyre.sim.runner import run_simulation

    def spans(per_engine):
        record = run_simulation("E0", steps=4, seed=0, costs=CostModel(publish_engine_s=per_engine)).record
        return [end - start for start, end in record.publications]

    base, grown = spans(0.0), spans(10.0)
    assert len(base) == len(grown) >= 1
    assert all(g - b >= 10.0 - 1e-6 for b, g in zip(base, grown))  # at least one engine each time
