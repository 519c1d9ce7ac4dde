"""Live metrics (issue 16 item 4): the per-step record, its sinks and the run display, without the real stack.

The event logs are the simulator's (the same core, the same ``EventLog``), so
the breakdown rebuilt from a log alone (``runtime.metrics.Timeline``) is checked
against the simulator's own interval-based breakdown (``sim/breakdown.py``) at
every step. The backend's ``Metrics`` is stood in for by the simulator's group
records (v_d, v_t) plus made-up step reports: the record is a pure function of them.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import threading
from types import SimpleNamespace

import pytest

from gyre import roles as R
from gyre.actions import SEPARATE
from gyre.real.runtime.metrics import (CATEGORIES, LiveMetrics, MetricsWriter, Timeline, category, scalars,
                                       step_record)
from gyre.real.runtime.progress import RunDisplay, describe
from gyre.sim.breakdown import time_breakdown
from gyre.sim.runner import run_simulation


@pytest.fixture(scope="module", params=["colocate", "gyre-1"])
def sim(request):
    return run_simulation(request.param, steps=4)


def sim_breakdown(result, end_s: float) -> dict[str, float]:
    rec, cfg = result.record, result.cfg
    return time_breakdown(end_s=end_s, executions=[rec.slot_interval(x) for x in rec.executions],
                          roles=[(r["cell"], r["role"], r["start_s"], r["end_s"]) for r in rec.roles],
                          steps=[(s["start_s"], s["end_s"]) for s in rec.steps.values()],
                          publications=[tuple(p) for p in rec.publications], C_e=cfg.C_e, C_s=cfg.C_s)


def fake_metrics(result, loss=lambda v: 1.0 / (v + 1)):
    groups = result.record.groups
    return SimpleNamespace(
        v_d={g: row["v_d"] for g, row in groups.items()},
        v_t={g: row["v_t"] for g, row in groups.items() if row["v_t"] is not None},
        rewards={v: [0.25 * (v + 1), 0.5] for v in range(4)},
        steps={v: {"loss": loss(v), "participants": [0], "wall_s": 2.0} for v in range(4)},
        publishes=[{"version": 0, "engines": 1, "wall_s": 3.5}], transitions=[{"total_s": 1.0}, {"total_s": 3.0}])


def step_points(rows):
    """(index of the StepDone row, its version, its time): where the backend writes a step's record."""
    return [(i, row["version"], row["now"]) for i, row in enumerate(rows) if row["kind"] == "step_done"]


def records_of(result, metrics):
    rows, timeline = result.record.log.rows, Timeline(result.cfg)
    names = {c: f"e{c}" for c in range(result.cfg.K)} | ({SEPARATE: "sep"} if result.cfg.C_s else {})
    return [step_record(timeline, metrics, v, rows=rows[:i], now=now, engine_names=names)
            for i, v, now in step_points(rows)]


def test_the_breakdown_so_far_equals_the_simulators_at_every_step(sim):
    rows = sim.record.log.rows
    begin = rows[0]["now"]
    records = records_of(sim, fake_metrics(sim))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record, (_, _, now) in zip(records, step_points(rows)):
        expected = sim_breakdown(sim, now)
        assert list(record["breakdown_s"]) == list(CATEGORIES)
        for k in CATEGORIES:
            assert record["breakdown_s"][k] == pytest.approx(expected[k], abs=1e-6), (k, record["breakdown_s"])
        assert sum(record["breakdown_s"].values()) == pytest.approx(now - begin)
    whole = Timeline(sim.cfg).advance(rows, now=sim.record.end_s)
    assert whole == pytest.approx(sim_breakdown(sim, sim.record.end_s))


def test_staleness_is_that_of_exactly_the_groups_fed_to_the_step(sim):
    records = records_of(sim, fake_metrics(sim))
    consumed = sim.record.consumed_groups()
    for record in records:
        mine = [row["staleness"] for row in consumed if row["v_t"] == record["version"]]
        assert record["groups"] == len(mine) == sim.cfg.B
        assert record["staleness_mean"] == pytest.approx(sum(mine) / len(mine))
        assert record["staleness_max"] == max(mine)


def test_a_record_holds_the_step_transitions_publication_burst_and_engine_load(sim):
    records = records_of(sim, fake_metrics(sim))
    for record in records:
        v = record["version"]
        assert record["loss"] == pytest.approx(1.0 / (v + 1)) and record["rewards"] == 2
        assert record["reward_mean"] == pytest.approx((0.25 * (v + 1) + 0.5) / 2)
        assert (record["transitions"], record["transition_mean_s"]) == (2, 2.0)
        assert (record["publications"], record["publication_s"]) == (1, 3.5)
        assert sum(record["engine_load"].values()) == record["running"]
        assert set(record["roles"].values()) <= set(R.ROLES) and len(record["roles"]) == sim.cfg.K
        assert record["problems"] == []
        json.dumps(record, allow_nan=False)
    assert [r["burst"] for r in records] == [1 + v // sim.cfg.mu for v in range(4)]


def test_a_malformed_or_missing_value_becomes_null_and_is_named(sim):
    metrics = fake_metrics(sim, loss=lambda v: float("nan") if v == 1 else "n/a" if v == 2 else 0.5)
    metrics.rewards[0] = [float("inf"), 1.0]
    del metrics.steps[3]
    metrics.publishes = [{"version": 0}]                 # no wall time
    metrics.transitions.append({"total_s": None})
    records = records_of(sim, metrics)
    assert records[0]["reward_mean"] == 1.0 and "reward" in records[0]["problems"]
    assert records[1]["loss"] is None and "loss" in records[1]["problems"]
    assert records[2]["loss"] is None and "loss" in records[2]["problems"]
    assert records[3]["loss"] is None and records[3]["step_wall_s"] is None and "step report" in records[3]["problems"]
    assert all(r["publication_s"] is None and "publication_s" in r["problems"] for r in records)
    assert all(r["transition_mean_s"] == 2.0 for r in records)  # the broken one is left out
    for record in records:
        json.dumps(record, allow_nan=False)  # no NaN or inf reaches the file


@pytest.mark.parametrize("state, expected", [
    (dict(holding=4, capacity=4, batch_open=True, awaiting_publish=True), "rollout_full"),
    (dict(holding=3, capacity=4, batch_open=True, awaiting_publish=False), "rollout_tail"),
    (dict(holding=0, capacity=4, batch_open=True, awaiting_publish=True), "training_exposed"),
    (dict(holding=0, capacity=4, batch_open=False, awaiting_publish=True), "publication"),
    (dict(holding=0, capacity=4, batch_open=False, awaiting_publish=False, roles=[R.ROLLOUT, R.TO_ROLLOUT]),
     "transitions"),
    (dict(holding=0, capacity=0, batch_open=False, awaiting_publish=False), "waiting"),
])
def test_the_categories_take_the_first_match_in_the_simulators_order(state, expected):
    assert category(SimpleNamespace(**{"roles": [R.ROLLOUT, R.TRAINING], **state})) == expected


def record(step: int, **extra) -> dict:
    return {"step": step, "version": step - 1, "burst": 1, "loss": 0.5 / step, "reward_mean": 0.1 * step,
            "breakdown_s": {"waiting": 1.0, "rollout_full": None}, "engine_load": {"e0": 2}, "problems": [],
            "roles": {"0": "training", "1": "rollout"}, **extra}


def test_the_writer_appends_one_flushed_line_per_record(tmp_path):
    said: list[str] = []
    writer = MetricsWriter(tmp_path, log=said.append, tensorboard=False)
    for step in (1, 2, 3):
        writer.write(record(step))
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # before close: what tail -f sees
        assert len(lines) == step and json.loads(lines[-1])["step"] == step
    assert said == [] and not (tmp_path / "tb").exists()


def test_a_failing_sink_is_said_once_and_never_raised(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()          # the file cannot be opened
    (tmp_path / "tb").write_text("not a folder")  # nor the TensorBoard folder made
    said = []
    writer = MetricsWriter(tmp_path, log=said.append)
    writer.write(record(1))
    writer.write(record(2, loss=float("nan")))    # refused by allow_nan=False: still no raise
    writer.close()
    assert len(said) == 2 and {s.split()[1] for s in said} == {"metrics.jsonl", "tensorboard"}, said


def test_on_step_never_raises_and_says_why():
    said = []
    live = LiveMetrics(run_simulation("gyre-1", steps=1).cfg, "/nonexistent", {0: "e0"}, log=said.append,
                       tensorboard=False)
    live.bind(SimpleNamespace(log=None, clock=lambda: 0.0), SimpleNamespace(metrics=None))
    live.on_step(0)
    assert live.records == [] and said and "step 1 not recorded" in said[0]


def test_a_stalled_metrics_disk_holds_the_step_not_the_loop(tmp_path):
    """``metrics.jsonl`` is a FIFO nobody reads yet, so opening it blocks, as on a stalled disk. While the
    step's record waits, a ticker on the loop must keep turning: the reader is let in only once it turned
    ``TURNS`` times (a timer thread lets it in after ``HANG_S`` anyway: a write on the loop holds every turn,
    and the ticker is found at zero)."""
    turns_needed, hang_s = 5, 5.0
    os.mkfifo(tmp_path / "metrics.jsonl")
    result = run_simulation("gyre-1", steps=1)
    live = LiveMetrics(result.cfg, tmp_path, {0: "e0"}, log=pytest.fail, tensorboard=False)
    live.bind(SimpleNamespace(log=result.record.log, clock=lambda: 1.0), SimpleNamespace(metrics=fake_metrics(result)))
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append((tmp_path / "metrics.jsonl").read_text()), daemon=True)
    let_in = threading.Lock()

    def let_the_reader_in() -> None:
        with let_in:
            if not reader.is_alive() and not read:
                reader.start()

    timer = threading.Timer(hang_s, let_the_reader_in)
    timer.daemon = True
    timer.start()

    async def main() -> int:
        step = asyncio.ensure_future(live.on_step_off_loop(0))
        turns = 0
        while not step.done():
            turns += 1
            if turns == turns_needed:
                let_the_reader_in()
            await asyncio.sleep(0.005)
        return turns

    turns = asyncio.run(main())
    timer.cancel()
    reader.join(hang_s)
    assert turns >= turns_needed, f"the loop turned {turns} times while the record waited for the disk"
    assert [json.loads(line)["step"] for line in read[0].splitlines()] == [1] and len(live.records) == 1


def test_scalars_flatten_the_numbers_and_leave_out_nulls():
    out = scalars(record(2, staleness_mean=0.5, participants=[0, 1], flag=True, time_s=math.inf))
    assert out == {"burst": 1.0, "loss": 0.25, "reward_mean": 0.2, "breakdown_s/waiting": 1.0,
                   "engine_load/e0": 2.0, "staleness_mean": 0.5}


def test_tensorboard_holds_the_records_values_before_close(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = MetricsWriter(tmp_path, log=pytest.fail)
    for step in (1, 2):
        writer.write(record(step))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
    assert [e.value for e in acc.Scalars("engine_load/e0")] == [2.0, 2.0]
    assert "breakdown_s/rollout_full" not in acc.Tags()["scalars"]
    writer.close()


def test_a_resumed_runs_tensorboard_shows_each_step_once_with_the_redone_values(tmp_path):
    """An attempt logged steps 1-4 and was killed; the resumed one (checkpoint after step 2) redoes 3 and 4:
    TensorBoard shows steps 1-4 once each, 3 and 4 with the redone values."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricsWriter(tmp_path, log=pytest.fail)
    for step in (1, 2, 3, 4):
        first.write(record(step))
    first.close()
    resumed = MetricsWriter(tmp_path, log=pytest.fail, purge_step=3)
    for step in (3, 4):
        resumed.write(record(step, loss=10.0 * step))
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5), (2, 0.25), (3, 30.0), (4, 40.0)]


def test_the_display_prints_plain_lines_off_a_terminal():
    out = io.StringIO()
    display = RunDisplay(4, out)
    display.line("starting")
    display.record(record(1, staleness_mean=0.5))
    display.close()
    assert out.getvalue().splitlines() == [
        "[gyre run] starting",
        "[gyre run] progress: step 1/4, burst 1, roles 0:T 1:R, loss 0.500, reward 0.100, staleness 0.500"]


def test_the_display_draws_a_bar_on_a_terminal():
    out = io.StringIO()
    display = RunDisplay(4, out, tty=True)
    display.record(record(1))
    display.line("a phase line")
    display.record(record(2))
    assert display.bar.n == 2
    display.close()
    text = out.getvalue()
    assert "2/4" in text and "burst 1, roles 0:T 1:R" in text and "[gyre run] a phase line" in text
    assert "progress:" not in text
    assert describe(record(3), 4).startswith("step 3/4, burst 1")


def test_an_offline_wandb_run_holds_the_records_values(tmp_path):
    """The real wandb package, offline: nothing leaves the machine, the run lands in RUN_DIR/wandb."""
    pytest.importorskip("wandb")
    writer = MetricsWriter(tmp_path, log=pytest.fail, tensorboard=False, wandb="offline", config={"N": 4})
    for step in (1, 2):
        writer.write(record(step, reward_mean=0.125 * step))
    writer.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list((tmp_path / "wandb").rglob("*"))
    data = runs[0].read_bytes()  # protobuf records: the history's keys and JSON values are stored as text
    for text in (b"engine_load/e0", b"breakdown_s/waiting", b"reward_mean", b"0.125", b"0.25"):
        assert text in data, text
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


def test_every_attempt_of_a_resumed_run_logs_to_the_same_wandb_run(tmp_path):
    """A resumed run's writer finds the W&B run id the first attempt kept: two offline folders, one run id;
    a fresh run folder gets a new id."""
    pytest.importorskip("wandb")
    (tmp_path / "run").mkdir()
    (tmp_path / "other").mkdir()
    for attempt in range(2):
        writer = MetricsWriter(tmp_path / "run", log=pytest.fail, tensorboard=False, wandb="offline")
        writer.write(record(attempt + 1))
        writer.close()
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    run_id = (tmp_path / "run" / "wandb" / "gyre-run-id").read_text().strip()
    assert len(runs) == 2 and all(f"-{run_id}" in r.name for r in runs), runs  # (same second: "-1" added)
    for run in runs:  # the run's id inside each attempt's records, which is what ``wandb sync`` resumes by
        [data] = [f.read_bytes() for f in run.glob("run-*.wandb")]
        assert run_id.encode() in data, run
    other = MetricsWriter(tmp_path / "other", log=pytest.fail, tensorboard=False, wandb="offline")
    assert other.wandb_run_id() != run_id and other.wandb_run_id() == other.wandb_run_id()


def test_a_wandb_mode_other_than_offline_is_refused(tmp_path):
    with pytest.raises(ValueError, match="wandb must be one of"):
        MetricsWriter(tmp_path, wandb="online")
