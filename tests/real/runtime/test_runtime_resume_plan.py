"""``gyre run --resume``'s plan, without engines or cells (``runtime.resume``, ``train.checkpoint``).

A run folder is built as a real job leaves it: ``job.json``, the durable
journal of a legal event sequence (a fresh core driven by an instant world:
every action's completion comes back as the next events), resume checkpoints,
published folders, records and workspaces. Checked: the newest *complete*
checkpoint is taken (a folder without its manifest, or a temporary one, is
an interrupted write and is skipped and moved aside); the replayed core sits
at the burst's end with the publication outstanding; executions running at P
are sorted into re-admitted (exited after P), re-run (still running at the
kill) and cancelled; the folder's moves keep every record (moved, never
deleted); a folder that is not a run, a finished run, a damaged journal and a
folder held by a live job are refused with the problem named, and the CLI
exits 2 saying it.
"""

from __future__ import annotations

import heapq
import json
import os
from pathlib import Path

import pytest

from gyre import actions as act
from gyre import events as ev
from gyre.cli import main
from gyre.formats.journal import JournalLog
from gyre.real.runtime.job import JobConfig
from gyre.real.runtime.job_file import job_from_table
from gyre.real.runtime.resume import (ResumeError, hold_run_lock, open_run_folder, plan_resume, prepare_folder,
                                      save_job)
from gyre.real.train.checkpoint import MANIFEST, complete_checkpoints
from gyre.scheduler import Scheduler


def instant_world(cfg, stop):
    """Events of a run in a world where every action completes in 1 s and an execution in 3 s, except x6
    (60 s: still running at the kill) and x7 (10 s: it ends between checkpoint v2 and the kill), until
    ``stop(core)``; also the executions still running then (the kill)."""
    core, events, pending, seq = Scheduler(cfg), [], [], iter(range(10**9))

    def later(now, delay, *item):
        heapq.heappush(pending, (now + delay, next(seq), item))

    def feed(event):
        events.append(event)
        for a in core.handle(event):
            if isinstance(a, act.StartExecutions):
                for x, _ in a.placements:
                    later(event.now, {7: 11.0, 6: 60.0}.get(x, 3.0), "finish", x)
            elif isinstance(a, act.CancelExecutions):
                for x in a.executions:
                    later(event.now, 1.0, "cancelled", x)
            elif isinstance(a, act.BeginTransition):
                later(event.now, 1.0, "transition", a.cell, a.role)
            elif isinstance(a, act.StartBatch) or (isinstance(a, act.FeedGroups) and core.fed < cfg.B):
                later(event.now, 0.1, "want")
            elif isinstance(a, act.Publish):
                later(event.now, 1.0, "publish", a.version)
            if isinstance(a, act.FeedGroups) and core.fed == cfg.B:
                later(event.now, 1.0, "step", a.version)

    feed(ev.Begin(0.0))
    while pending and not stop(core):
        now, _, (kind, *args) = heapq.heappop(pending)
        if kind in ("finish", "cancelled"):
            if kind == "finish" and args[0] in core.placements() or kind == "cancelled":
                feed(ev.ExecutionFinished(now, args[0], "completed" if kind == "finish" else "cancelled"))
            g = core.group_of(args[0])
            group = core.snapshot().groups[g]
            if group.closed >= cfg.N and not group.ready and not group.dropped:
                feed(ev.GroupReady(now, g))
        elif kind == "transition":
            feed(ev.TransitionDone(now, *args))
        elif kind == "want":
            feed(ev.GroupWanted(now))
        elif kind == "step":
            feed(ev.StepDone(now, args[0]))
        else:
            feed(ev.PublishDone(now, args[0]))
    return core, events, {item[1] for _, _, item in pending if item[0] == "finish"}


def job(work: Path) -> JobConfig:
    return job_from_table(dict(workdir=str(work), model_dir=str(work.parent / "tok"), preset="gyre-1", nodes=2,
                               C_e=4, N=2, B=2, steps=6, schedule={"tau": 0.0}))


def checkpoint(work: Path, version: int, events: int, manifest: bool = True) -> Path:
    folder = work / "checkpoints" / f"resume-v{version:06d}"
    folder.mkdir(parents=True)
    (folder / "rank0.pt").write_bytes(b"weights")
    if manifest:
        (folder / MANIFEST).write_text(json.dumps({"version": version, "events": events}))
    return folder


@pytest.fixture
def killed_run(tmp_path):
    """A run killed in burst 2 after step 3 opened: checkpoint v2 complete, v4 half-written."""
    work = tmp_path / "run"
    work.mkdir()
    cfg = job(work).scheduler()
    save_job(job(work), work)
    core, events, running_at_kill = instant_world(cfg, lambda core: core.version >= 3 and core.batch_open)
    at_p = next(i + 1 for i, e in enumerate(events) if isinstance(e, ev.StepDone) and e.version == 1)
    log = JournalLog(work / "log" / "events.jsonl")
    for event in events:
        log.record_event(event)
    (work / "log" / "summary.json").write_text(json.dumps({"config": cfg.__dict__}))
    checkpoint(work, 2, at_p)
    checkpoint(work, 4, len(events), manifest=False)  # the kill came while it was written
    (work / "checkpoints" / ".resume-v000004.tmp").mkdir()
    for v in (0, 2, 4):
        (work / "checkpoints" / f"v{v:06d}").mkdir()
    (work / "engine-model").mkdir()
    for x in range(len(core.snapshot().groups) * cfg.N):
        (work / "records").mkdir(exist_ok=True)
        (work / "records" / f"x{x}.tito").write_bytes(f"calls of {x}".encode())
        (work / "executions" / f"exec-{x}" / "workspace").mkdir(parents=True)
    (work / "metrics.jsonl").write_text("".join(json.dumps({"version": v}) + "\n" for v in range(3)))
    return work, events, at_p, running_at_kill


def test_the_newest_complete_checkpoint_is_taken_and_the_core_replayed_to_it(killed_run):
    work, events, at_p, _ = killed_run
    assert [v for v, _, _ in complete_checkpoints(work / "checkpoints")] == [2]
    plan = plan_resume(work)
    assert plan.checkpoint.name == "resume-v000002" and plan.position == at_p
    assert (plan.version, plan.published, plan.core.awaiting_publish) == (2, 0, True)
    assert plan.discarded == len(events) - at_p
    assert act.Publish(2) in plan.outstanding()
    replayed = Scheduler(plan.core.cfg)
    for event in events[:at_p]:
        replayed.handle(event)
    assert replayed.snapshot() == plan.core.snapshot()


def test_executions_running_at_the_checkpoint_are_readmitted_rerun_or_cancelled(killed_run):
    work, events, at_p, running_at_kill = killed_run
    plan = plan_resume(work)
    running_at_p = set(plan.core.placements()) | set(plan.core.stopped_executions())
    later = {e.execution for e in events[at_p:] if isinstance(e, ev.ExecutionFinished)}
    assert (plan.readmit, plan.rerun) == ({7: "completed"}, [6])  # the world's slow ones
    assert set(plan.readmit) | set(plan.rerun) | set(plan.cancelled) == running_at_p
    assert set(plan.readmit) == running_at_p & later - set(plan.cancelled)
    assert set(plan.rerun) == running_at_p - later - set(plan.cancelled)
    assert set(plan.rerun) <= running_at_kill | running_at_p


def test_the_folder_is_prepared_by_moving_never_deleting(killed_run):
    work, _, _, _ = killed_run
    plan = plan_resume(work)
    before = {p.name: p.read_bytes() for p in (work / "records").glob("*.tito")}
    aside = prepare_folder(plan)
    kept = {p.name for p in (work / "records").glob("*.tito")}
    moved = {p.name for p in (aside / "records").glob("*.tito")}
    assert kept | moved == set(before) and not kept & moved
    assert kept == {f"x{x}.tito" for x in set(plan.finished) | set(plan.readmit)}
    assert all((aside / "records" / n).read_bytes() == before[n] for n in moved)
    assert {p.name for p in (work / "executions").iterdir()} == {f"exec-{n[1:-5]}" for n in kept}
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["resume-v000002", "v000000"]
    assert {p.name for p in (aside / "checkpoints").iterdir()} == {".resume-v000004.tmp", "resume-v000004",
                                                                   "v000002", "v000004"}
    assert [json.loads(x)["version"] for x in (work / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert [json.loads(x)["version"] for x in (aside / "metrics.jsonl").read_text().splitlines()] == [2]
    assert json.loads((aside / "resume.json").read_text())["rerun"] == plan.rerun


def test_without_a_complete_checkpoint_the_run_starts_over_keeping_what_it_recorded(killed_run):
    work, events, _, _ = killed_run
    (work / "checkpoints" / "resume-v000002" / MANIFEST).unlink()
    plan = plan_resume(work)
    assert (plan.checkpoint, plan.position, plan.discarded, plan.core.now) == (None, 0, len(events), None)
    aside = prepare_folder(plan)
    assert list((work / "records").glob("*.tito")) == [] and len(list((aside / "records").iterdir())) > 0


@pytest.mark.parametrize("damage, message", [
    (lambda work: None, "no such run folder"),
    (lambda work: (work / "job.json").unlink(), "is not a gyre run folder"),
    (lambda work: (work / "summary.json").write_text("{}"), "is a finished run"),
    (lambda work: (work / "log" / "events.jsonl").write_text("{garbage\n" * 3), "event journal is damaged"),
    (lambda work: (work / "supervisor").mkdir() or (work / "supervisor" / "ledger.jsonl").write_text(
        '{"kind": "ended", "key": "x6"}\n'), "is damaged: ledger record 1: x6 ended"),
])
def test_a_folder_that_cannot_be_resumed_is_refused_naming_the_problem(killed_run, tmp_path, damage, message,
                                                                        capsys):
    work, _, _, _ = killed_run
    target = tmp_path / "nowhere" if message == "no such run folder" else work
    damage(target)
    listing = sorted(p.relative_to(work) for p in work.rglob("*"))
    with pytest.raises(ResumeError, match=message):
        plan_resume(target)
    assert main(["run", "--resume", str(target)]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == listing  # nothing touched


def test_a_folder_held_by_a_live_job_is_refused(killed_run):
    work, _, _, _ = killed_run
    held = hold_run_lock(work)
    listing = sorted(work.rglob("*"))
    try:
        with pytest.raises(ResumeError, match="in use by a running job"):
            hold_run_lock(work)
        with pytest.raises(ResumeError, match="in use by a running job"):  # a fresh run does not wipe it
            open_run_folder(job(work), None)
        assert sorted(work.rglob("*")) == listing
    finally:
        os.close(held)
    os.close(hold_run_lock(work))  # released: a kill -9 frees it the same way


STARTING_JOB = """
import sys, time
from pathlib import Path
from gyre.real.runtime.job_file import job_from_table
from gyre.real.runtime.resume import open_run_folder
work = Path(sys.argv[1])
job = job_from_table(dict(workdir=str(work), model_dir=str(work.parent / "tok"), preset="gyre-1", nodes=2, C_e=4,
                          N=2, B=2, steps=6, schedule={"tau": 0.0}))
lock = open_run_folder(job, None)  # the first thing JobParts.build does: no journal yet
print("holding", flush=True)
time.sleep(120)
"""


def test_a_folder_whose_job_is_still_starting_is_refused_as_in_use_naming_its_pid(tmp_path, capsys):
    import subprocess
    import sys

    work = tmp_path / "run"
    starting = subprocess.Popen([sys.executable, "-c", STARTING_JOB, str(work)], stdout=subprocess.PIPE, text=True)
    try:
        assert starting.stdout.readline().strip() == "holding"
        assert not (work / "log").exists()  # the stage where a resume used to say "not a gyre run folder"
        listing = sorted(work.rglob("*"))
        with pytest.raises(ResumeError, match=f"in use by a running job \\(process {starting.pid} holds"):
            plan_resume(work)
        assert main(["run", "--resume", str(work)]) == 2
        assert f"in use by a running job (process {starting.pid} holds" in capsys.readouterr().err
        assert sorted(work.rglob("*")) == listing
    finally:
        starting.kill()
        starting.wait(10)
    with pytest.raises(ResumeError, match="not a gyre run folder"):  # released by the kill: the folder's own problem
        plan_resume(work)


def test_a_resume_takes_no_overrides(killed_run, capsys):
    work, _, _, _ = killed_run
    assert main(["run", "--resume", str(work), "--set", "steps=8"]) == 2
    assert "--set and --cluster do not apply" in capsys.readouterr().err
    assert not (work / "attempts").exists()


def ledger_of(work: Path):
    from gyre.real.supervisor.ledger import Ledger

    return Ledger(work / "supervisor" / "ledger.jsonl")


@pytest.mark.parametrize("end, sorted_as", [
    ({"kind": "ended", "exit_code": 0}, ("readmit", "completed")),  # it ended while the driver was down
    ({"kind": "ended", "exit_code": 1}, ("readmit", "failed")),
    ({"kind": "ended", "exit_code": -15, "killed": True}, ("rerun", "a driver of the discarded attempt cut it")),
    ({"kind": "lost", "reason": "its supervisor is gone (pid 9)"}, ("rerun", "its supervisor is gone (pid 9)")),
    (None, ("rerun", "its supervisor is gone (no supervisor answers")),  # running, but nobody answers for it
])
def test_the_supervisor_ledger_sorts_what_the_journal_cannot(killed_run, end, sorted_as):
    work, _, _, _ = killed_run
    ledger = ledger_of(work)
    ledger.append({"kind": "started", "key": "x6", "pid": 4242, "started_unix_s": 1.0, "started_mono_s": 5.0})
    if end is not None:
        ledger.append({"key": "x6", "ended_unix_s": 2.0, "ended_mono_s": 9.0, **end})
    ledger.close()
    plan = plan_resume(work)
    kind, detail = sorted_as
    if kind == "readmit":
        assert plan.readmit == {7: "completed", 6: detail} and plan.rerun == []
    else:
        assert (plan.readmit, plan.rerun, plan.reattach) == ({7: "completed"}, [6], [])
        assert plan.reasons[6].startswith(detail)
    aside = prepare_folder(plan)
    assert (work / "records" / "x6.tito").is_file() == (kind == "readmit")  # a re-run's partial record goes aside
    assert json.loads((aside / "resume.json").read_text())["rerun_reasons"] == {str(x): r for x, r in
                                                                             plan.reasons.items()}


def test_a_live_supervisor_re_attaches_what_it_still_runs_and_keeps_its_records(killed_run):
    import asyncio
    import sys

    from gyre.real.supervisor.client import start_or_reuse

    work, _, _, running_at_kill = killed_run
    client, _ = start_or_reuse(work / "supervisor", grace_s=60)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    after_p = sorted(running_at_kill - {6, 7})[0]  # dispatched after P: the resumed core dispatches it again

    async def spawn(x: int) -> None:
        await client.spawn(f"x{x}", sleeper, {}, work, work / f"x{x}.log")

    try:
        asyncio.run(spawn(6))
        asyncio.run(spawn(after_p))
        plan = plan_resume(work)
        assert (plan.reattach, plan.rerun, plan.supervisor) == ([6], [], client.pid)
        aside = prepare_folder(plan)
        for x in (6, after_p):  # their records go on in the same log: nothing moved aside
            assert (work / "records" / f"x{x}.tito").is_file() and not (aside / "records" / f"x{x}.tito").exists()
            assert (work / "executions" / f"exec-{x}").is_dir()
        assert json.loads((aside / "resume.json").read_text())["reattached"] == [6]
    finally:
        client.stop()
