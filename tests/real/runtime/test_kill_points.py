"""The resume test's kill-point selection and reporting, without processes (``kill_points``), the
``transition`` pause of ``GYRE_FAULT_PAUSE`` (``runtime.faults``) and a resume plan's kept harness work
(``runtime.resume.ResumePlan.work_kept``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.real.runtime.faults import ANY, fault_pause, parse_pauses
from gyre.real.runtime.resume import ResumePlan
from gyre.real.supervisor.ledger import Entry

try:
    import kill_points as kp
except ImportError:
    from . import kill_points as kp


@given(st.integers(0, 2**32), st.integers(4, 9))
def test_a_seed_gives_one_schedule_covering_every_kind(seed, kills):
    schedule = kp.draw_schedule(seed, kills, max_delay_s=1.5)
    assert schedule == kp.draw_schedule(seed, kills, max_delay_s=1.5)
    assert len(schedule) == kills and set(kp.KINDS) <= {p.kind for p in schedule}
    assert all(isinstance(p, kp.KillPoint) and 0.0 <= p.delay_s < 1.5 for p in schedule)


def test_seeds_draw_different_orders_and_too_few_kills_are_refused():
    orders = {tuple(p.kind for p in kp.draw_schedule(seed)) for seed in range(20)}
    assert len(orders) > 5
    with pytest.raises(ValueError, match="cannot cover"):
        kp.draw_schedule(0, kills=3)


def seen(**changes) -> kp.Observed:
    base = dict(version=2, batch_open=False, transitioning=False, awaiting_publish=False,
                checkpoint_complete=False, open_calls=0)
    return kp.Observed(**{**base, **changes})


@pytest.mark.parametrize("kind, moment, holds", [
    ("mid-step", seen(batch_open=True), True),
    ("mid-step", seen(), False),
    ("mid-transition", seen(transitioning=True), True),
    ("mid-transition", seen(batch_open=True), False),
    ("mid-publication", seen(awaiting_publish=True, checkpoint_complete=True), True),
    ("mid-publication", seen(awaiting_publish=True), False),  # its checkpoint not written yet
    ("mid-publication", seen(version=0, awaiting_publish=True, checkpoint_complete=True), False),  # resumed at
    ("mid-model-call", seen(open_calls=1), True),
    ("mid-model-call", seen(batch_open=True, transitioning=True), False),
])
def test_each_kind_is_recognised_from_what_the_run_shows(kind, moment, holds):
    assert kp.situation(kind, moment, resumed_at=0) is holds


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="mid-nap"):
        kp.situation("mid-nap", seen())
    with pytest.raises(ValueError, match="mid-nap"):
        kp.pause_for("mid-nap", 0)


def test_pauses_hold_the_window_of_the_attempt_and_parse():
    assert parse_pauses(kp.pause_for("mid-step", 2)) == {("step", 3): 120.0}
    assert parse_pauses(kp.pause_for("mid-publication", 2)) == {("publish", 4): 120.0}
    assert parse_pauses(kp.pause_for("mid-transition", 2)) == {("transition", ANY): 4.0}
    assert kp.pause_for("mid-model-call", 2) == ""


def test_a_wildcard_pause_holds_every_number_and_an_exact_one_wins(monkeypatch):
    slept = []
    monkeypatch.setenv("GYRE_FAULT_PAUSE", "transition=4@*,transition=9@2")
    assert [fault_pause("transition", n, sleep=slept.append) for n in (1, 2, 3)] == [4.0, 9.0, 4.0]
    assert fault_pause("step", 1, sleep=slept.append) == 0.0 and slept == [4.0, 9.0, 4.0]
    monkeypatch.setenv("GYRE_FAULT_PAUSE", "transition=4@x")
    with pytest.raises(ValueError, match="transition=4@x"):
        fault_pause("transition", 1)


def test_open_calls_and_saved_seconds_add_up():
    assert kp.open_calls([{"in_flight": 2}, {"in_flight": 0}, {}]) == 2
    assert kp.saved_seconds({"x1": 10.0, "x2": 12.5, "x3": 30.0}, now=20.0) == pytest.approx(17.5)


def test_the_table_has_a_line_per_kill_with_every_column():
    rows = [{"kill": 1, "what": "job", "moment": "mid-step", "at P": 5, "re-attached": 3, "kept": 4, "re-run": 0,
             "saved exec-s": 4.25, "processes": 6}, {"kill": 2, "what": "cell"}]
    lines = kp.kill_table(rows).splitlines()
    assert len(lines) == 3 and all(c in lines[0] for c in kp.COLUMNS)
    assert lines[1].split() == ["1", "job", "mid-step", "5", "3", "4", "0", "4.2", "6"]
    assert lines[2].split() == ["2", "cell", "-", "-", "-", "-", "-", "-", "-"]


def test_a_kills_columns_come_from_its_resume_record():
    """At P: x6 re-attached, x7 re-admitted, x8 re-run, x9 cancelled; x20 (dispatched after P) kept; x21 ran
    at the kill but its work was not kept (the resumed core did not dispatch it again): re-run."""
    resume = {"reattached": [6], "readmitted": {"7": "completed"}, "rerun": [8], "cancelled": [9],
              "work_kept_s": {"6": 2.0, "7": 1.5, "20": 3.25}, "saved_execution_s": 6.75}
    assert kp.resume_columns(resume, running=[6, 8, 20, 21]) == {
        "at P": 4, "re-attached": 1, "kept": 3, "re-run": 2, "saved exec-s": 6.75}
    nothing_at_p = dict(resume, reattached=[], readmitted={}, rerun=[], cancelled=[])
    assert kp.resume_columns(nothing_at_p, running=[20])["at P"] == 0


def entry(key: str, state: str, started: float, ended: float | None = None, killed: bool = False) -> Entry:
    return Entry(key, 100, state, 0.0, started, ended_mono_s=ended, killed=killed,
                 exit_code=None if ended is None else 0)


def test_a_resume_keeps_the_work_of_running_and_self_ended_harnesses_only():
    """x6's end is in the kept journal (no work of this resume); x7 ended by itself after P while no
    driver ran: the resumed core dispatches it again and the runner takes its end from the ledger."""
    plan = ResumePlan.__new__(ResumePlan)
    plan.supervised = {1: entry("x1", "running", 100.0), 2: entry("x2", "ended", 90.0, 95.0),
                       3: entry("x3", "ended", 80.0, 99.0, killed=True), 4: entry("x4", "lost", 50.0),
                       5: entry("x5", "running", 105.0), 6: entry("x6", "ended", 70.0, 75.0),
                       7: entry("x7", "ended", 96.0, 104.0)}
    plan.rerun, plan.readmit, plan.finished = [5], {2: "completed", 3: "failed"}, {6: "completed"}
    assert plan.work_kept(now=110.0) == {1: pytest.approx(10.0), 2: pytest.approx(5.0), 7: pytest.approx(8.0)}
