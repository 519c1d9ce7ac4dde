"""``gyre run --resume DIR``: what a killed run's folder says, and the plan to go on from it.

What a run keeps on disk as it goes (``runtime.job``): ``job.json`` (the job
configuration, paths absolute), ``log/events.jsonl`` (every event the core
accepted, one flushed line each: ``gyre.formats.journal``) with
``log/summary.json`` (the schedule), the proxy's record store ``records/``
(durable per call), the executions' preserved workspaces ``executions/``,
the published Hugging Face folders ``checkpoints/v{n:06d}`` and, at every
burst boundary, a resume checkpoint ``checkpoints/resume-v{v:06d}``
(``train.checkpoint``; written by ``runtime.restore.Checkpointer``).

The checkpoint is taken at the burst's final ``StepDone``: the core cell then
holds version v (the next batch opens only after the publication), no batch is
open, and every group fed so far was trained into v. Its manifest names the
event-log position P (the number of events up to and including that
``StepDone``), fsynced before the manifest is written. Model and optimizer
are the core cell's; satellites hold nothing that is not re-pulled; the task
choice and the packer's per-execution admission are pure functions of
(seed, id) (``harness.taskset``, ``trajectory.packing``), so the job's seed is
the whole "task cursor" and "sampler RNG" state; the cells' own RNG states
are in the checkpoint.

``plan_resume(DIR)`` reads the newest *complete* checkpoint (a folder
without a manifest is an interrupted write and is skipped; with none, P = 0
and the run starts over from version 0), replays ``events[0:P]`` through a
fresh ``Scheduler`` (so the core is exactly in its state at P) and sorts the
executions still running at P:

- its harness exited and its ``ExecutionFinished`` reached the log after P
  (or its ``HarnessStopped`` reached it before P): **re-admitted** from its
  record: its recorded calls (the proxy's store) go to the trajectory buffer,
  its preserved workspace is scored again by the evaluator, and it is
  reported finished in the resumed run; the harness is not run again (an
  execution whose harness had stopped before P but whose outcome was not
  logged is reported ``completed``: the harness's exit code is not durable);
- its group was ready or dropped at P (the core had cancelled it): reported
  ``cancelled``;
- otherwise the run's supervisor ledger (``real.supervisor``, read through
  ``client.executions_view``) decides: its harness still running under a
  live supervisor: **re-attached** (the resumed runner attaches to the same
  process; its records and workspace stay in place); ended by itself while
  no driver ran: **re-admitted** with its true exit code and times; lost with
  its supervisor, cut by a driver of the discarded attempt, or never run
  under a supervisor: **re-run** under its own id from the start, the reason
  in ``reasons``. A re-run's partial records and workspace are *kept*, moved
  to ``attempts/{n}/records`` and ``attempts/{n}/executions``; they are not
  trained on (the re-run's records are the execution's trajectory).

Events after P are discarded from the resumed log (they stay, with the whole
journal of the killed attempt, in ``attempts/{n}/events.jsonl``) and their
steps are redone from the checkpoint, so no group is trained twice in the
model's lineage. Executions dispatched after P (new group ids) are dispatched
again by the resumed core under the same ids; what they left is moved aside
the same way, unless a live supervisor runs their harness or saw it end by
itself (the resumed runner attaches to it: ``_kept``). ``prepare_folder``
does those moves (and moves aside the discarded lineage's published folders,
its half-written checkpoints, the stale micro-step queue and the
``metrics.jsonl`` lines of redone steps) and writes
``attempts/{n}/resume.json`` with the plan.

Refused with ``ResumeError`` naming the problem, touching nothing: a folder
that does not exist or is not a run (no ``job.json`` / journal), a finished
run (``summary.json`` written), a folder a live job holds (``.gyre-run.lock``,
an ``flock`` a kill -9 releases, taken before anything else is written; the
refusal says "in use" and names the holder's pid whatever stage the job is
in, starting included; a fresh ``gyre run`` also refuses to wipe such a
folder), a journal damaged before its last line, a checkpoint past the
journal's end or whose published weights are gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre import actions as act
from gyre import events as ev
from gyre import roles as R
from gyre.formats.journal import JOURNAL_NAME, read_journal
from gyre.ids import execution_id
from gyre.real.train.checkpoint import PREFIX, complete_checkpoints
from gyre.real.train.fence import write_attempt
from gyre.real.train.publish import checkpoint_folder
from gyre.scheduler import Scheduler

JOB_FILE = "job.json"
PLANE_DIR = "plane"  # the training plane's folder (``runtime.job_parts``), fenced by attempt
LOCK_FILE = ".gyre-run.lock"
LOG_DIR = "log"


class ResumeError(ValueError):
    """A folder that cannot be resumed; the message names the folder and the problem."""


def save_job(job, work: Path) -> Path:
    """Write ``work/job.json``: the job's fields, with its paths made absolute (a resume may run elsewhere)."""
    from gyre.real.runtime.job_file import job_to_table

    data = job_to_table(job)  # the job file's own keys: job_from_table reads it back
    for name in ("workdir", "model_dir", "tasks"):
        if data[name]:
            data[name] = str(Path(data[name]).resolve())
    if data["model"]["checkpoint"]:
        data["model"] = dict(data["model"], checkpoint=str(Path(data["model"]["checkpoint"]).resolve()))
    path = work / JOB_FILE
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def hold_run_lock(work: Path) -> int:
    """Take the run folder's lock for this process's life (a kill -9 releases it); ResumeError if held."""
    fd = os.open(work / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ResumeError(_in_use(work)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _in_use(work: Path) -> str:
    text = (work / LOCK_FILE).read_text().strip() if (work / LOCK_FILE).is_file() else ""
    holder = f"process {text}" if text.isdigit() else "a process that is still starting"
    return f"{work} is in use by a running job ({holder} holds {work / LOCK_FILE})"


def refuse_if_held(work: Path) -> None:
    """ResumeError naming the holder's pid when a live job holds ``work`` (at any stage: the lock is the
    first thing a job takes); nothing changes either way."""
    try:
        fd = os.open(work / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ResumeError(_in_use(work)) from None
    finally:
        os.close(fd)


@dataclass
class ResumePlan:
    work: Path
    job: Any                                   # runtime.job.JobConfig
    checkpoint: Path | None                    # the newest complete resume checkpoint (None: start over)
    manifest: dict | None
    position: int                              # P: events[0:P] are kept
    events: list[ev.Event]                     # events[0:P]
    discarded: int                             # events of the killed attempt after P
    torn: str | None                           # the journal's torn last line, if any
    core: Scheduler                            # a fresh core fed events[0:P]
    actions: list[act.Action]                  # what it returned, in order
    finished: dict[int, str] = field(default_factory=dict)        # ExecutionFinished before P: outcome
    readmit: dict[int, str] = field(default_factory=dict)         # running at P, exited since: outcome
    rerun: list[int] = field(default_factory=list)                # running at P, re-run under its id
    cancelled: list[int] = field(default_factory=list)            # running at P, already cancelled by the core
    stopped: set[int] = field(default_factory=set)                # HarnessStopped before P, not finished
    attempt: int = 1                                              # attempts/{attempt}
    reattach: list[int] = field(default_factory=list)             # running at P, its harness still running
    reasons: dict[int, str] = field(default_factory=dict)         # why each re-run one is not re-attached
    supervised: dict[int, Any] = field(default_factory=dict)      # the supervisor ledger's entry per execution
    supervisor: int | None = None                                 # the live supervisor's pid (None: none)

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def published(self) -> int:
        return self.core.published

    def published_folder(self) -> Path | None:
        """The Hugging Face folder the engines must serve (None: the initial model)."""
        return checkpoint_folder(self.work / "checkpoints", self.published) if self.published else None

    def outstanding(self) -> list[act.Action]:
        """Publish and BeginTransition actions issued before P whose completion is not in events[0:P],
        in the order the core issued them."""
        pending: dict[Any, tuple[int, act.Action]] = {}
        core = self.core.snapshot()
        for index, a in enumerate(self.actions):
            if isinstance(a, act.Publish):
                pending["publish"] = (index, a)
            elif isinstance(a, act.BeginTransition):
                pending[a.cell] = (index, a)
        keep = [item for key, item in pending.items()
                if (key == "publish" and core.awaiting_publish)
                or (key != "publish" and core.roles[key] in (R.TO_TRAINING, R.TO_ROLLOUT))]
        return [a for _, a in sorted(keep, key=lambda item: item[0])]

    def work_kept(self, now: float) -> dict[int, float]:
        """Harness work this resume keeps, execution-seconds per execution at monotonic ``now``: a harness the
        live supervisor still runs (re-attached at once, or when the resumed core dispatches its id again) has
        run ``now - start``; one that ended by itself and whose end the kept journal does not hold (re-admitted
        if it ran at P, else taken from the ledger when the resumed core dispatches its id again: the runner
        attaches to an ended entry, it never starts it twice), ``end - start``."""
        kept = {}
        for x, entry in self.supervised.items():
            if x in self.rerun:
                continue
            if entry.state == "running":
                kept[x] = max(0.0, now - entry.started_mono_s)
            elif entry.state == "ended" and not entry.killed and entry.ended_mono_s and x not in self.finished:
                kept[x] = max(0.0, entry.ended_mono_s - entry.started_mono_s)
        return kept

    def summary(self) -> dict[str, Any]:
        kept = self.work_kept(time.monotonic())
        return {"attempt": self.attempt, "checkpoint": str(self.checkpoint) if self.checkpoint else None,
                "version": self.version, "published": self.published, "events_kept": self.position,
                "events_discarded": self.discarded, "torn": self.torn, "readmitted": self.readmit,
                "rerun": self.rerun, "rerun_reasons": {str(x): r for x, r in sorted(self.reasons.items())},
                "reattached": self.reattach, "supervisor": self.supervisor, "cancelled": self.cancelled,
                "outstanding": [a.as_dict() for a in self.outstanding()],
                "work_kept_s": {str(x): round(t, 3) for x, t in sorted(kept.items())},
                "saved_execution_s": round(sum(kept.values()), 3)}


def plan_resume(run_dir: str | os.PathLike) -> ResumePlan:
    """The plan to resume the run in ``run_dir`` (module docstring); ResumeError names what is wrong."""
    from gyre.real.runtime.job_file import job_from_table

    work = Path(run_dir).resolve()
    if not work.is_dir():
        raise ResumeError(f"{run_dir}: no such run folder")
    refuse_if_held(work)  # before anything else: a job still starting has no journal yet
    journal_path = work / LOG_DIR / JOURNAL_NAME
    if not (work / JOB_FILE).is_file() or not journal_path.is_file():
        raise ResumeError(f"{run_dir} is not a gyre run folder: it has no {JOB_FILE} and {LOG_DIR}/{JOURNAL_NAME} "
                          f"(gyre run writes them when it starts)")
    if (work / "summary.json").is_file():
        raise ResumeError(f"{run_dir} is a finished run (summary.json is written): nothing to resume")
    try:
        job = job_from_table(dict(json.loads((work / JOB_FILE).read_text()), workdir=str(work))).check_environment()
    except (ValueError, TypeError) as exc:
        raise ResumeError(f"{run_dir}/{JOB_FILE}: {exc}") from None
    try:
        journal = read_journal(journal_path)
    except ValueError as exc:
        raise ResumeError(f"{run_dir}: the event journal is damaged: {exc}") from None
    found = complete_checkpoints(work / "checkpoints")
    checkpoint, manifest = (found[-1][1], found[-1][2]) if found else (None, None)
    position = manifest["events"] if manifest else 0
    if position > len(journal.events):
        raise ResumeError(f"{checkpoint}: names event {position}, but the journal holds only {len(journal.events)}")
    cfg = job.scheduler()
    core, actions = Scheduler(cfg), []
    for event in journal.events[:position]:
        actions += core.handle(event)
    if manifest and (core.version != manifest["version"] or not core.awaiting_publish):
        raise ResumeError(f"{checkpoint}: the journal's first {position} events leave the core at version "
                          f"{core.version}, not at the end of the burst of version {manifest['version']}")
    if core.version >= job.steps and not core.awaiting_publish:
        raise ResumeError(f"{run_dir} is a finished run ({core.version} of {job.steps} steps): nothing to resume")
    if core.published and not checkpoint_folder(work / "checkpoints", core.published).is_dir():
        raise ResumeError(f"{run_dir}: the weights published at the checkpoint "
                          f"({checkpoint_folder(work / 'checkpoints', core.published)}) are missing")
    plan = ResumePlan(work, job, checkpoint, manifest, position, journal.events[:position],
                      len(journal.events) - position, journal.torn, core, actions,
                      attempt=len(list((work / "attempts").glob("*"))) + 1 if (work / "attempts").is_dir() else 1)
    from gyre.real.supervisor.client import SUPERVISOR_DIR, executions_view
    from gyre.real.supervisor.ledger import LedgerError

    try:
        plan.supervised, plan.supervisor = executions_view(work / SUPERVISOR_DIR)
    except LedgerError as exc:
        raise ResumeError(f"{run_dir}: the supervisor's ledger ({SUPERVISOR_DIR}/ledger.jsonl) is damaged: {exc}") \
            from None
    _sort_executions(plan, journal.events[position:])
    return plan


def _sort_executions(plan: ResumePlan, later: list[ev.Event]) -> None:
    core = plan.core.snapshot()
    for event in plan.events:
        if isinstance(event, ev.ExecutionFinished):
            plan.finished[event.execution] = event.outcome
    plan.stopped = set(core.stopped)
    exited = {e.execution: e.outcome for e in later if isinstance(e, ev.ExecutionFinished)}
    for x in sorted(set(core.placements) | plan.stopped):
        group = core.groups[plan.core.group_of(x)]
        if group.ready or group.dropped:
            plan.cancelled.append(x)
        elif exited.get(x, "cancelled") != "cancelled":
            plan.readmit[x] = exited[x]
        elif x in plan.stopped:
            plan.readmit[x] = "completed"
        else:
            _sort_by_supervisor(plan, x)


def _sort_by_supervisor(plan: ResumePlan, x: int) -> None:
    """An execution running at P whose end the journal does not hold: what its supervisor saw decides."""
    entry = plan.supervised.get(x)
    if entry is not None and entry.state == "running":
        plan.reattach.append(x)
    elif entry is not None and entry.state == "ended" and not entry.killed:
        plan.readmit[x] = "completed" if entry.exit_code == 0 else "failed"  # its true exit, while the driver was down
    else:
        plan.rerun.append(x)
        plan.reasons[x] = ("no supervisor ran it" if entry is None else entry.reason if entry.state == "lost"
                           else "a driver of the discarded attempt cut it (cancelled or timed out)")


def _kept(plan: ResumePlan) -> set[int]:
    """Executions whose records and workspace stay in place: finished or re-admitted, or (re-attached, or
    dispatched after P) run by a live supervisor, which a resumed run attaches to under the same id."""
    supervised = {x for x, e in plan.supervised.items()
                  if e.state == "running" or (e.state == "ended" and not e.killed)}
    return set(plan.finished) | set(plan.readmit) | set(plan.reattach) | (supervised - set(plan.rerun))


def _move(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(source), str(dest))


def prepare_folder(plan: ResumePlan) -> Path:
    """Move aside what the resumed run must not see (module docstring); returns ``attempts/{n}``."""
    work, keep = plan.work, {execution_id(x) for x in _kept(plan)}
    aside = work / "attempts" / str(plan.attempt)
    aside.mkdir(parents=True)
    shutil.copy2(work / LOG_DIR / JOURNAL_NAME, aside / JOURNAL_NAME)
    for folder, pattern, name_of in (("records", "x*.tito", lambda p: p.name[:-len(".tito")]),
                                     ("executions", "exec-*", lambda p: "x" + p.name[len("exec-"):])):
        for path in sorted((work / folder).glob(pattern)) if (work / folder).is_dir() else ():
            if name_of(path) not in keep:
                _move(path, aside / folder / path.name)
    checkpoints = work / "checkpoints"
    no_engine_model = not (work / "engine-model").is_dir()  # killed before it was exported: version 0 is redone
    for path in sorted(checkpoints.iterdir()) if checkpoints.is_dir() else ():
        if path.name.startswith(".") or _newer(path.name, plan) or (no_engine_model and path.name == "v000000"):
            _move(path, aside / "checkpoints" / path.name)
    if (work / "plane" / "queue").exists():
        _move(work / "plane" / "queue", aside / "plane-queue")
    _split_metrics(work / "metrics.jsonl", aside / "metrics.jsonl", plan.version)
    (aside / "resume.json").write_text(json.dumps(plan.summary(), indent=2, default=str) + "\n")
    return aside


def _newer(name: str, plan: ResumePlan) -> bool:
    """A published folder past the version published at P, or a resume checkpoint past P's."""
    if name.startswith(PREFIX):
        digits = name[len(PREFIX):]
        return not digits.isdigit() or int(digits) > plan.version
    if name.startswith("v") and name[1:].isdigit():
        return int(name[1:]) > plan.published
    return False


def _split_metrics(path: Path, aside: Path, version: int) -> None:
    """Keep the records of steps trained into the checkpoint; the redone steps' go to ``aside``."""
    if not path.is_file():
        return
    kept: list[str] = []
    moved: list[str] = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            trained = json.loads(line).get("version", 0) < version
        except ValueError:  # a torn last line
            trained = False
        (kept if trained else moved).append(line)
    aside.write_text("".join(moved))
    path.write_text("".join(kept))


def running_attempt(plan: ResumePlan | None) -> int:
    """The number of the attempt that runs on the folder: 1 fresh, one past the killed attempt resumed."""
    return 1 if plan is None else plan.attempt + 1


def open_run_folder(job, plan: ResumePlan | None) -> int:
    """A fresh run's folder (wiped, ``job.json`` written) or a resumed one (its plan's moves made); either
    way held by this process (``hold_run_lock``) and fenced for its attempt (``train.fence``: a cell of
    the killed attempt still alive steps back before anything is moved). Returns the lock's descriptor."""
    work = Path(job.workdir)
    if plan is None:
        if work.exists():
            if (work / LOCK_FILE).exists():
                os.close(hold_run_lock(work))  # never wipe a folder a live job holds
            shutil.rmtree(work)
        work.mkdir(parents=True)
        lock = hold_run_lock(work)
        write_attempt(work / PLANE_DIR, running_attempt(plan))
        save_job(job, work)
        return lock
    lock = hold_run_lock(work)
    try:
        write_attempt(work / PLANE_DIR, running_attempt(plan))
        prepare_folder(plan)
    except BaseException:
        os.close(lock)
        raise
    return lock
