"""End to end: ``gyre run`` SIGKILLed at three points, its core cell once and its supervisor once; it resumes
and finishes (issues 16, 29).

One small job (2 cells, N = B = 2, phi = 0.5, mu = 2, 6 steps: 3 bursts; the
scripted harness sleeps 1 s after each of its 2 calls so executions are
caught between calls) runs as a subprocess of the real CLI in its own
process group. The test watches the durable event journal (``log/events.jsonl``,
replayed through a fresh core) and kills, with SIGKILL:

1. the whole job (its process group and every engine group named in
   ``engines.json``), mid-rollout: after checkpoint v2 and publication 2, while
   an execution that is running has exactly one recorded call (a partial
   record); then ``gyre run --resume`` with ``GYRE_FAULT_PAUSE=step=120@3``;
2. the core training cell alone (its pid from ``cells.json``), mid-step: once
   the batch of version 3 is open (``StartBatch(3)`` issued, its ``StepDone``
   held back). The job stops with ``CellFailed`` naming the cell and its exit
   code and resumes *itself* (same ``gyre run``, no operator) from checkpoint
   v2 with a new cell 0 (issue 16 item 3);
3. the whole job, mid-step: once that self-resumed attempt has the batch of
   version 3 open again; then ``gyre run --resume`` with
   ``GYRE_FAULT_PAUSE=publish=120@4``;
4. the whole job, during publication: once checkpoint v4 is complete and
   publication 4 is pending (and, if an execution was running at the
   checkpoint, once one such has finished, for up to 20 s: the last resume
   then re-admits it from its record);

After each kill of the job, only the run's supervisor and what it owns
(harnesses, bridge, proxy) are alive. Then ``gyre run --resume`` runs until
harnesses run under its supervisor, the supervisor is SIGKILLed (its node
"rebooted"): the job stops (``SupervisorLost``), resumes itself, re-runs those
executions with the reason, and finishes. (The cell's death once had a run
of this job of its own; sharing this one saves ~2 min of the suite.)
Checked after the last resume: exit 0, 6 steps and 6 published,
``replay_identical``; the final event log replays (``replay_run`` on
events.csv and ``replay_journal`` on events.jsonl give the same actions);
every group fed to training exactly once (B per step); ``StepDone`` versions
0..5 once each in order, ``PublishDone`` 2, 4, 6; each resume took the
checkpoint it should (v2, v2, v2, v4), the partially recorded execution was
re-attached (same harness pid, started once; its second call went into the same
record after the resume, the proxy holding it until the engines were back); no
harness was started twice except after a driver cut it or its supervisor was
lost, and each re-run is named with its reason; the clean end stopped the
supervisor and left no process of the run; metrics.jsonl, the
summary's step reports, TensorBoard's scalars and trace.csv cover every step and trained group once
(the run calibrates); the measured staleness (from the final log) equals the
summary's and stays within 0.25 of phi + (mu - 1)/2, as a normal run's does;
and no recorded call is lost: every record file seen at a kill is still there,
in ``records/`` or under ``attempts/``, with the same calls in the same order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.formats.eventlog import replay_run, run_config
from gyre.formats.journal import read_journal, replay_journal
from gyre.real.engines.manager import sglang_python
from gyre.real.store.tito_log import read_records
from gyre.real.supervisor.ledger import read_ledger
from gyre.scheduler import Scheduler

NO_VENV = f"SGLang CPU venv not found at {sglang_python()} (run tools/setup_sglang_cpu.sh)"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(not sglang_python().exists(), reason=NO_VENV)]

STEPS, B = 6, 2
JOB = """[job]
workdir = "{work}"
model_dir = "{tok}"
preset = "gyre-1"
nodes = 2
C_e = 4
N = 2
B = 2
steps = 6
calls = 2
max_tokens = 8
lr = 1e-2
seed = 0
timeout_s = 600.0
harness_options = {{sleep_s = 1.0}}
[job.schedule]
tau = 0.0
"""


def start(argv: list[str], tmp: Path, name: str, pause: str = "") -> subprocess.Popen:
    env = dict(os.environ, GYRE_FAULT_PAUSE=pause)
    with open(tmp / f"{name}.stderr", "w") as stderr, open(tmp / f"{name}.stdout", "w") as stdout:
        return subprocess.Popen([sys.executable, "-m", "gyre.cli", "run", *argv], cwd=tmp, env=env,
                                stdout=stdout, stderr=stderr, start_new_session=True)


def core_now(work: Path) -> Scheduler | None:
    """The core as the durable journal leaves it (a torn last line is left out)."""
    if not (work / "log" / "summary.json").is_file():
        return None
    core = Scheduler(run_config(work / "log"))
    for event in read_journal(work / "log" / "events.jsonl").events:
        core.handle(event)
    return core


def complete(work: Path, version: int) -> bool:
    return (work / "checkpoints" / f"resume-v{version:06d}" / "manifest.json").is_file()


def calls_of(path: Path) -> list[str]:
    return [c.request_id for c in read_records(path)]


def wait_for(proc: subprocess.Popen, work: Path, ready, what: str, stderr: Path | None = None,
             timeout: float = 400.0, resumes: int = 1):
    """Poll the journal until ``ready(core)`` is true; a resumed job only once it says it resumed ``resumes``
    times (before, the journal still holds the killed attempt's events)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job exited ({proc.returncode}) before {what}"
        if stderr is not None and stderr.read_text().count("resumed at version") < resumes:
            time.sleep(0.2)
            continue
        try:
            core = core_now(work)
            found = ready(core) if core is not None else None
        except (OSError, ValueError):  # a file being renamed into place: look again
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def supervisor_pid(work: Path) -> int:
    return int(json.loads((work / "supervisor" / "supervisor.json").read_text())["pid"])


def _stat(pid: str) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0]


def strays(tmp: Path, supervisor: int | None) -> list[str]:
    """Live processes of the run (cmdline or working folder under ``tmp``) that the supervisor does not own."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), supervisor):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        stat = _stat(entry.name)
        if stat is None or stat[1] == "Z" or (str(tmp) not in cmdline and not cwd.startswith(str(tmp))):
            continue
        pid, owned = int(entry.name), False
        while pid > 1 and not owned:
            parent = _stat(str(pid))
            pid = parent[0] if parent else 1
            owned = pid == supervisor
        if not owned:
            found.append(f"{entry.name}: {cmdline[:160]}")
    return found


def only_the_supervisor_remains(tmp: Path, work: Path) -> None:
    """After a kill of the driver: only the supervisor and what it owns are alive (issue 29)."""
    deadline = time.monotonic() + 30.0
    while strays(tmp, supervisor_pid(work)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert strays(tmp, supervisor_pid(work)) == []


def kill_job(proc: subprocess.Popen, work: Path) -> dict[str, list[str]]:
    """SIGKILL the job's process group and its engines' groups; what the record store held then."""
    engines = json.loads((work / "engines.json").read_text()) if (work / "engines.json").is_file() else {}
    for pgid in [proc.pid] + [e["pid"] for e in engines.values()]:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    time.sleep(1.0)  # harnesses and cells get their parent-death signal
    return {p.name: calls_of(p) for p in sorted((work / "records").glob("*.tito"))}


def partial_execution(work: Path):
    def ready(core: Scheduler):
        if not (complete(work, 2) and core.published >= 2):
            return None
        for x in core.placements():
            path = work / "records" / f"x{x}.tito"
            if path.is_file() and len(calls_of(path)) == 1:
                return x
        return None
    return ready


def finished_since_checkpoint(proc: subprocess.Popen, work: Path, version: int, within: float) -> set[int]:
    """Wait up to ``within`` s for an execution running at checkpoint ``version`` to finish in the journal."""
    manifest = json.loads((work / "checkpoints" / f"resume-v{version:06d}" / "manifest.json").read_text())
    events = read_journal(work / "log" / "events.jsonl").events
    core = Scheduler(run_config(work / "log"))
    for event in events[:manifest["events"]]:
        core.handle(event)
    running = set(core.placements())
    deadline = time.monotonic() + within
    while running and time.monotonic() < deadline and proc.poll() is None:
        later = read_journal(work / "log" / "events.jsonl").events[manifest["events"]:]
        done = {e.execution for e in later if isinstance(e, ev.ExecutionFinished)} & running
        if done:
            return done
        time.sleep(0.1)
    return set()


def running_harnesses(work: Path) -> list[int]:
    """Executions whose harness the supervisor runs now (from its ledger)."""
    path = work / "supervisor" / "ledger.jsonl"
    return [int(k[1:]) for k, e in read_ledger(path).items() if k.startswith("x") and e.state == "running"] \
        if path.is_file() else []


def restarted_without_cause(work: Path) -> list[str]:
    """Harnesses started again though their last run was neither cut by a driver (a cancellation of the
    discarded attempt) nor lost with its supervisor: no harness process is restarted otherwise."""
    from gyre.real.supervisor.ledger import read_records as ledger_records

    last: dict[str, dict] = {}
    found = []
    for record in ledger_records(work / "supervisor" / "ledger.jsonl"):
        before = last.get(record["key"])
        if record["kind"] == "started" and before is not None \
                and not (before["kind"] == "lost" or before.get("killed")):
            found.append(record["key"])
        last[record["key"]] = record
    return found


def harness_runs_at(work: Path, instant: float) -> tuple[dict[str, float], list[str]]:
    """Executions whose harness was alive at ``instant`` (monotonic): those that went on (with the seconds
    they had run by then) and those lost with their supervisor (a lost run's end: the key's next start)."""
    from gyre.real.supervisor.ledger import read_records as ledger_records

    runs: list[list] = []  # [key, start, end, lost]
    for record in ledger_records(work / "supervisor" / "ledger.jsonl"):
        if not record["key"].startswith("x"):
            continue
        if record["kind"] == "started":
            for run in runs:
                if run[0] == record["key"] and run[3] and run[2] == float("inf"):
                    run[2] = record["started_mono_s"]
            runs.append([record["key"], record["started_mono_s"], float("inf"), False])
        else:
            run = [r for r in runs if r[0] == record["key"]][-1]
            run[2], run[3] = record.get("ended_mono_s", float("inf")), record["kind"] == "lost"
    alive = [r for r in runs if r[1] < instant < r[2]]
    return {r[0]: instant - r[1] for r in alive if not r[3]}, [r[0] for r in alive if r[3]]


def resume_record(work: Path, attempt: int) -> dict:
    return json.loads((work / "attempts" / str(attempt) / "resume.json").read_text())


def test_a_run_killed_three_times_and_its_cell_once_resumes_and_finishes(tmp_path):
    work = tmp_path / "run"
    (tmp_path / "job.toml").write_text(JOB.format(work=work, tok=tmp_path / "tok"))
    t0 = time.monotonic()
    snapshots = []
    kills: list[float] = []  # when each kill came (monotonic, as the supervisor's ledger)

    proc = start(["--config", str(tmp_path / "job.toml")], tmp_path, "run0")
    partial = wait_for(proc, work, partial_execution(work), "a partially recorded execution after publication 2")
    snapshots.append(kill_job(proc, work))
    kills.append(time.monotonic())
    only_the_supervisor_remains(tmp_path, work)
    partial_harness = read_ledger(work / "supervisor" / "ledger.jsonl")[f"x{partial}"]
    assert partial_harness.state == "running"  # the driver is gone, its harness is not (issue 29)

    proc = start(["--resume", str(work)], tmp_path, "run1", pause="step=120@3")
    wait_for(proc, work, lambda core: core.batch_open and core.version == 3, "the batch of version 3 to open",
             tmp_path / "run1.stderr")
    cell = int(json.loads((work / "cells.json").read_text())["0"]["pid"])
    os.kill(cell, signal.SIGKILL)  # the core cell alone, inside step 3: the job resumes itself
    kills.append(time.monotonic())
    time.sleep(1.0)
    snapshots.append({p.name: calls_of(p) for p in sorted((work / "records").glob("*.tito"))})
    wait_for(proc, work, lambda core: core.batch_open and core.version == 3,
             "the batch of version 3 to open again after the job resumed itself", tmp_path / "run1.stderr", resumes=2)
    err = (tmp_path / "run1.stderr").read_text()
    assert "training cell 0 (exit code -9) died" in err and "resuming at version 2" in err, err[-4000:]
    assert int(json.loads((work / "cells.json").read_text())["0"]["pid"]) != cell  # a new cell 0
    snapshots.append(kill_job(proc, work))
    kills.append(time.monotonic())
    only_the_supervisor_remains(tmp_path, work)

    proc = start(["--resume", str(work)], tmp_path, "run2", pause="publish=120@4")
    wait_for(proc, work, lambda core: complete(work, 4) and core.awaiting_publish and core.version == 4,
             "checkpoint v4 and publication 4 pending", tmp_path / "run2.stderr")
    finished_since_checkpoint(proc, work, 4, within=20.0)  # so the next resume re-admits it, when there is one
    snapshots.append(kill_job(proc, work))
    kills.append(time.monotonic())
    only_the_supervisor_remains(tmp_path, work)

    proc = start(["--resume", str(work)], tmp_path, "run3")
    # the supervisor SIGKILLed (its node "rebooted") while it runs harnesses: they are re-run, the run finishes
    lost = wait_for(proc, work, lambda core: core.version >= 4 and running_harnesses(work),
                    "harnesses running under the resumed run's supervisor", tmp_path / "run3.stderr")
    os.kill(supervisor_pid(work), signal.SIGKILL)
    kills.append(time.monotonic())
    assert proc.wait(timeout=500) == 0, (tmp_path / "run3.stderr").read_text()[-3000:]
    assert "supervisor" in (tmp_path / "run3.stderr").read_text() and "died" in (tmp_path / "run3.stderr").read_text()
    print(f"killed four times and finished in {time.monotonic() - t0:.0f} s")

    # each resume went on from the checkpoint it should, with the outstanding work named
    first, second, third, fourth, fifth = (resume_record(work, n) for n in (1, 2, 3, 4, 5))
    assert (first["version"], second["version"], third["version"], fourth["version"]) == (2, 2, 2, 4)
    assert fifth["version"] >= 4 and fifth["supervisor"] is None
    # the partially recorded execution was attached to, not run again: same harness, its record went on in place
    assert partial not in first["readmitted"] and partial not in first["rerun"]
    ledger = read_ledger(work / "supervisor" / "ledger.jsonl")
    assert (ledger[f"x{partial}"].pid, ledger[f"x{partial}"].starts) == (partial_harness.pid, 1)
    assert calls_of(work / "records" / f"x{partial}.tito")[:1] == snapshots[0][f"x{partial}.tito"]
    assert len(calls_of(work / "records" / f"x{partial}.tito")) == 2  # its second call, after the resume
    assert {"kind": "publish", "version": 4} in fourth["outstanding"]
    # only the supervisor's loss re-ran harnesses, each named with its reason; every other one started once
    rerun = {int(x): r for record in (first, second, third, fourth, fifth) for x, r in record["rerun_reasons"].items()}
    assert all("supervisor is gone" in r for r in rerun.values())
    restarted = json.loads((work / "summary.json").read_text())["supervisor"]["restarted"]  # dispatched after P too
    assert all(f"x{x}" in restarted and "supervisor is gone" in restarted[f"x{x}"][-1] for x in lost
               if x not in fifth["readmitted"])
    assert restarted_without_cause(work) == []
    # a clean end stops the supervisor and everything it owned
    assert not (work / "supervisor" / "supervisor.json").exists()
    deadline = time.monotonic() + 30.0  # the forkserver exits once the job's end closed its pipe
    while strays(tmp_path, None) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert strays(tmp_path, None) == []
    assert first["events_discarded"] > 0 and second["events_discarded"] > 0  # (a kill at once may discard none)
    # the closing note's numbers: per kill, the harnesses alive then that went on (re-attached, by the plan or
    # when dispatched again) or were lost with their supervisor (re-run), and the harness work kept
    for n, killed_at in enumerate(kills, 1):
        went_on, lost_then = harness_runs_at(work, killed_at)
        print(f"kill {n}: {len(went_on)} harnesses went on (re-attached), {len(lost_then)} re-run; "
              f"{sum(went_on.values()):.1f} execution-seconds of harness work kept")
    print("resumes:", [{k: r[k] for k in ("version", "events_discarded", "rerun", "readmitted", "cancelled")}
                       for r in (first, second, third, fourth)])

    # the run finished, and its final event log replays
    s = json.loads((work / "summary.json").read_text())
    assert (s["steps"], s["published"], s["replay_identical"], s["backend_errors"]) == (STEPS, STEPS, True, [])
    actions = replay_run(work / "log")
    journal_actions, journal = replay_journal(work / "log")
    assert journal.torn is None and journal_actions == actions
    events = journal.events
    assert [e.version for e in events if isinstance(e, ev.StepDone)] == list(range(STEPS))
    assert [e.version for e in events if isinstance(e, ev.PublishDone)] == [2, 4, 6]

    # every group trained exactly once, and the staleness identity holds as in a normal run
    fed = Counter(g for a in actions if a["kind"] == "feed_groups" for g in a["groups"])
    assert set(fed.values()) == {1} and len(fed) == STEPS * B
    v_d = {g: a["version"] for a in actions if a["kind"] == "dispatch_groups" for g in a["groups"]}
    v_t = {g: a["version"] for a in actions if a["kind"] == "feed_groups" for g in a["groups"]}
    staleness = [v_t[g] - v_d[g] for g in sorted(v_t)]
    cfg = SchedulerConfig(**json.loads((work / "log" / "summary.json").read_text())["config"])
    assert sum(staleness) / len(staleness) == pytest.approx(s["staleness_mean"])
    assert abs(s["staleness_mean"] - cfg.predicted_staleness) <= 0.25
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records] == list(range(STEPS))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(work / "tb"))  # each step once, with the lineage's values (redone steps purged)
    board.Reload()
    losses = board.Scalars("loss")
    assert [e.step for e in losses] == [r["step"] for r in records]
    assert [e.value for e in losses] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    # the summary covers the whole lineage (measurements up to each checkpoint came back with it)
    assert sorted(r["version"] for r in s["step_reports"]) == list(range(STEPS))
    traced = {int(row.split(",")[0]) for row in (work / "trace.csv").read_text().splitlines()[1:]}
    assert set(fed) <= traced and "error" not in s["prediction"], s["prediction"]

    # no recorded call lost: every log seen at a kill is kept whole, in records/ or moved under attempts/
    for snapshot in snapshots:
        for name, calls in snapshot.items():
            homes = [work / "records" / name, *sorted((work / "attempts").glob(f"*/records/{name}"))]
            assert any(h.is_file() and calls_of(h)[:len(calls)] == calls for h in homes), name
    for n in (1, 2, 3, 4, 5):
        assert len(read_journal(work / "attempts" / str(n) / "events.jsonl").events) > 0
