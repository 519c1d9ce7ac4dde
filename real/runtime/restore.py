"""Taking resume checkpoints during a run, and putting a resumed run's live parts where its plan says.

``Checkpointer`` is the backend's ``on_burst_end`` hook: at a burst's final
``StepDone`` (called from ``on_publish``, before the ``publish`` command is
sent, so the core cell answers it with exactly version v) it sends
``save_checkpoint`` into ``checkpoints/.resume-v{v:06d}.tmp`` and, once the
cell answered, fsyncs the event journal, renames the folder into place and
writes the manifest last (``train.checkpoint.finalize``); then only the newest
``KEEP`` complete checkpoints are kept. A version whose checkpoint is already
complete (a resumed run re-applying the outstanding ``Publish`` of its
checkpoint) is not written again.

A resumed run (``runtime.resume.ResumePlan``), in order:

1. ``restore_parts`` (after engines, proxy and backend are up; nothing is
   reported yet): every engine loads the version published at P and the
   proxy records it; the core cell loads the checkpoint; each cell that
   the core holds in training, or leaving it, at P enters training again
   (its engine drained in the proxy, quiesced and its memory released, as
   ``CellSwitches.to_training`` leaves it), so a re-applied transition back
   to rollout finds what it expects; the backend's parts are set through
   their ``restore()`` from the replayed core (roles, latest publication,
   dropped groups, the packer's next batch), each group's v_d / v_t too,
   and its measurements up to P (step reports, rewards,
   publications, trace rows: ``metrics.json``, which the checkpointer writes
   into the checkpoint at P) from the checkpoint, so the summary, trace and
   calibration cover the whole lineage.
2. ``rebuild_buffer`` (awaited before the controller runs): every group
   dispatched and not yet fed at P is opened in the trajectory buffer again
   and each of its executions finished before P gets its recorded calls and
   a fresh evaluation of its preserved workspace, silently (the core already
   counted them); a group the core had seen ready must come out ready, or
   the resume stops with ``ResumeError``.
3. ``resume_actions(plan, backend)`` (the controller's ``resume`` callback,
   once reports can be queued): the outstanding ``Publish`` and
   ``BeginTransition`` actions are applied again in their original order;
   executions already cancelled at P report ``cancelled`` (a harness of
   theirs the supervisor still runs is stopped); re-admitted ones run the
   backend's own finish path from their record (``Executions.readmit``; with
   the true exit code and times the supervisor's ledger holds, when it does);
   re-attached and re-run ones start again on the engine the core placed them
   on (``on_start_executions``): the harness runner asks the supervisor first
   and attaches to a harness it still runs under that id (same pid, sandbox
   and proxy key; its records go on in the same log).

Only the parts' public methods are used here (``snapshot`` / ``restore``, and
``Executions``' resume methods); the actions go through the backend's own
``on_<action>`` table.

Invariants: nothing here reports an event the replayed core would refuse
(each report is one the core expects at P); no recorded call is dropped
(re-run executions' partial records were moved aside by ``prepare_folder``,
not deleted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from gyre import actions as act
from gyre import events as ev
from gyre import roles as R
from gyre.driver_rules import is_satellite
from gyre.ids import group_id
from gyre.real.harness.runner import ExecutionResult
from gyre.real.runtime.resume import ResumeError, ResumePlan
from gyre.real.train.checkpoint import checkpoint_name, complete_checkpoints, finalize

METRICS = "metrics.json"  # the backend's measurements at P, beside the cell's rank files


class Checkpointer:
    """The backend's ``on_burst_end``: a resume checkpoint of the core at every burst boundary."""

    KEEP = 2  # complete checkpoints kept (the newest is the one a resume takes; one before it, in reserve)

    def __init__(self, root: Path, plane, controller, backend, *, tp: int, seed: int) -> None:
        self.root, self.plane, self.controller, self.backend = Path(root), plane, controller, backend
        self.tp, self.seed = tp, seed
        self.written: list[int] = []
        # listed here, before the run: the loop never waits on the disk (a resumed run's own checkpoints)
        self.complete = {v for v, _, _ in complete_checkpoints(self.root)}

    def __call__(self, version: int) -> None:
        """Checkpoint the core cell at ``version``'s burst end: the command is numbered now (before the
        Publish that follows it); the folder is made, and the command written, off the loop."""
        if version in self.complete:
            return  # a resumed run re-applying its checkpoint's outstanding Publish
        core = self.controller.core.snapshot()
        manifest = {"format": 1, "version": version, "events": len(self.controller.log),
                    "published": core.published, "burst": core.burst, "now": core.now, "tp": self.tp,
                    "cells": self.controller.cfg.K, "seed": self.seed, "written_unix_s": time.time()}
        tmp = self.root / f".{checkpoint_name(version)}.tmp"
        measured = json.dumps(dataclasses.asdict(self.backend.metrics))  # as of P exactly; written off the loop
        ticket, send = self.plane.prepare(0, "save_checkpoint", folder=str(tmp))
        self.complete.add(version)
        self.backend.ctx.spawn(self._finish(ticket, send, tmp, manifest, measured))

    async def _finish(self, ticket, send: Callable[[], None], tmp: Path, manifest: dict, measured: str) -> None:
        await asyncio.to_thread(_fresh_folder, tmp, send)
        await asyncio.to_thread((tmp / METRICS).write_text, measured)
        await asyncio.to_thread(ticket.result, 600.0)
        await asyncio.to_thread(self.controller.log.sync)  # events[0:P] are on disk before the manifest names P
        final = await asyncio.to_thread(finalize, tmp, manifest)
        self.written.append(manifest["version"])
        for _, older, _ in complete_checkpoints(self.root)[:-self.KEEP]:  # superseded: a resume takes the newest
            await asyncio.to_thread(shutil.rmtree, older)
        self.backend.progress(f"checkpoint {final.name}: version {manifest['version']}, "
                              f"events[0:{manifest['events']}]")


def _fresh_folder(folder: Path, then: Callable[[], None]) -> None:
    """An empty ``folder`` (whatever a killed attempt left there removed), then ``then()``."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    then()


def restore_parts(plan: ResumePlan, backend) -> None:
    """Step 1 of the module docstring: engines, core cell, cell roles and the backend's parts at P."""
    parts, core, cfg = backend.parts, plan.core.snapshot(), plan.core.cfg
    folder = plan.published_folder()
    if folder is not None:
        backend.publisher.restore({"latest": [plan.published, str(folder)]})
        for name in parts.engine_names.values():
            parts.engines.update_weights_from_disk(name, str(folder), weight_version=str(plan.published))
        backend.proxy.call_blocking("POST", "/admin/policy_version", {"version": plan.published})
    if plan.checkpoint is not None:
        parts.plane.call(0, "load_checkpoint", folder=str(plan.checkpoint), timeout=600.0)
    cells = backend.cells.snapshot()
    for cell, role in enumerate(core.roles):
        if role not in (R.TRAINING, R.TO_ROLLOUT) or cell < cfg.static_train_cells:
            continue  # static trainers already entered training with the job
        _enter_training(backend, cell)
        cells["rollout_ready"] = [c for c in cells["rollout_ready"] if c != cell]
        if role == R.TRAINING:
            cells["members"] = sorted({*cells["members"], cell})
    backend.cells.restore(cells)
    for g, group in core.groups.items():
        backend.metrics.v_d[g] = group.v_d
        if group.v_t is not None:
            backend.metrics.v_t[g] = group.v_t
    backend.executions.restore(dict(backend.executions.snapshot(), harness_stopped_before=sorted(plan.stopped),
                                    dropped=sorted(g for g, group in core.groups.items() if group.dropped)))
    if plan.checkpoint is not None and (plan.checkpoint / METRICS).is_file():
        _load_metrics(backend.metrics, json.loads((plan.checkpoint / METRICS).read_text()))
    # no batch is open at P: the next one the packer fills is v
    backend.batches.restore(dict(backend.batches.snapshot(), next_batch=plan.version))


def _enter_training(backend, cell: int) -> None:
    """Cell ``cell`` back in training as the core holds it at P (its engine drained, quiesced, released)."""
    parts = backend.parts
    name = parts.engine_names.get(cell)
    if name is not None:
        backend.proxy.call_blocking("POST", f"/admin/engines/{name}/drain", {"evacuate": False})
        parts.engines.quiesce(name)
        parts.engines.release_memory(name)
    satellite = is_satellite(backend.cfg, cell)
    parts.plane.call(cell, "enter_training", **({"hold": True} if satellite else {}), timeout=600.0)


def _open_groups(plan: ResumePlan, backend) -> list[int]:
    """Open every unfed, undropped group of P in the buffer; the groups whose task is gone now."""
    gone = []
    for g, group in plan.core.snapshot().groups.items():
        if group.v_t is not None or group.dropped:
            continue
        if not backend.executions.reopen_group(g, group.v_d, ready=group.ready):
            gone.append(g)
    return gone


def workspace_of(backend, x: int) -> Path:
    return backend.parts.runner.root / f"exec-{x}" / "workspace"


async def rebuild_buffer(plan: ResumePlan, backend) -> list[int]:
    """Step 2 of the module docstring; returns the groups whose task could not be set up again."""
    gone = _open_groups(plan, backend)
    for event in plan.events:  # in the order they finished: the first N to resolve are a group's designated
        if isinstance(event, ev.ExecutionFinished):
            await backend.executions.replay_finished(event.execution, event.outcome,
                                                     workspace_of(backend, event.execution))
    for g, group in plan.core.snapshot().groups.items():
        if group.ready and group.v_t is None and g not in gone and not backend.executions.mark_ready(g):
            raise ResumeError(f"group {group_id(g)} was ready at event {plan.position}, but its executions' "
                              f"records and workspaces in {plan.work} no longer make it ready")
    return gone


def resume_actions(plan: ResumePlan, backend, gone: list[int]):
    """Step 3 of the module docstring, as the controller's ``resume`` callback."""

    def apply() -> None:
        for g in gone:
            backend.ctx.report(ev.GroupDropped, group=g)
        for a in plan.outstanding():
            backend.apply(a)
        for x in plan.cancelled:
            backend.executions.cancelled_before(x)
        for x, outcome in sorted(plan.readmit.items()):
            backend.executions.readmit(x, _exited(plan, backend, x, outcome))
        placements = plan.core.placements()
        # re-run and re-attached alike: the runner asks the supervisor first, and attaches to what it runs
        again = tuple((x, placements[x]) for x in sorted([*plan.rerun, *plan.reattach]))
        if again:
            backend.on_start_executions(act.StartExecutions(again))
        backend.progress(f"resumed at version {plan.version} (event {plan.position}): "
                         f"{len(plan.reattach)} executions re-attached, {len(plan.rerun)} re-run, "
                         f"{len(plan.readmit)} re-admitted from their records, {len(plan.cancelled)} cancelled; "
                         f"{plan.discarded} later events discarded")

    return apply


def _exited(plan: ResumePlan, backend, x: int, outcome: str) -> ExecutionResult:
    """A re-admitted execution's harness result: its true exit and times where its supervisor saw them."""
    entry, now = plan.supervised.get(x), time.monotonic()
    if entry is not None and entry.state == "ended":
        return ExecutionResult(x, outcome, entry.exit_code, workspace_of(backend, x), entry.started_mono_s,
                               entry.ended_mono_s, backend.parts.runner.isolated)
    return ExecutionResult(x, outcome, 0, workspace_of(backend, x), now, now, backend.parts.runner.isolated)


def controller_parts(plan: ResumePlan | None, log_dir: Path) -> dict:
    """The controller's ``core`` and ``log``: the durable journal, holding the plan's ``events[0:P]``."""
    from gyre.formats.journal import JOURNAL_NAME, JournalLog

    path = Path(log_dir) / JOURNAL_NAME
    if plan is None or not plan.position:
        return {"log": JournalLog(path)}
    return {"core": plan.core, "log": JournalLog(path, plan.events, plan.actions)}


class ResumeWiring:
    """What ``runtime.job`` adds to a run for resumes: the checkpointer always; for a resumed run with a
    checkpoint, ``restore_parts`` now and ``before_run()`` (the buffer, then the controller's callback)."""

    def __init__(self, plan: ResumePlan | None, controller, backend, *, work: Path, tp: int, seed: int) -> None:
        self.plan, self.backend = plan if plan is not None and plan.position else None, backend
        self.checkpointer = Checkpointer(Path(work) / "checkpoints", backend.parts.plane, controller, backend,
                                         tp=tp, seed=seed)
        backend.set_hooks(on_burst_end=self.checkpointer)
        controller.write_summary(Path(work) / "log")  # log/ replays (replay_journal) even after a kill -9
        if self.plan is not None:
            restore_parts(self.plan, backend)

    async def before_run(self):
        """The controller's ``resume`` callback (None: a fresh start feeds ``Begin``)."""
        if self.plan is None:
            return None
        gone = await rebuild_buffer(self.plan, self.backend)
        return resume_actions(self.plan, self.backend, gone)


def _load_metrics(metrics, saved: dict) -> None:
    """The backend's measurements of the run up to P (steps, rewards, publications, finished executions'
    trace rows, ...), as the checkpoint saved them: the summary then covers the whole lineage."""
    from gyre.real.runtime.trace import ExecutionResult as TraceResult

    for name in ("rewards", "steps", "outcomes"):
        setattr(metrics, name, {int(k): v for k, v in saved[name].items()})
    for name in ("publishes", "transitions", "reroutes", "in_flight_at_transition", "move_stalls_ms", "excluded"):
        setattr(metrics, name, list(saved[name]))
    metrics.trace = [TraceResult(**row) for row in saved["trace"]]
