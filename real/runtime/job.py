"""A whole real run from one TOML file: ``run_job(JobConfig) -> summary``.

``JobConfig`` (``runtime.job_config``: a tree of frozen sections read from the
job file by ``load_job_config``; docs/real-backend.md#the-jobs-configuration) names a schedule preset
of ``gyre.presets`` (Gyre, Async, Colocate or any ablation) scaled to the
job's cluster (``nodes`` single-node cells of ``C_e`` concurrent executions,
groups of ``N``, batches of ``B``), per-field overrides of that schedule (the
``[job.schedule]`` table), the task source (the toy task, or a JSONL task set
with its ``"module:Class"`` evaluator: ``harness.taskset``), the harness (a
built-in name or ``"module:Class"``: ``harness.plugins``), the device (a CUDA
job places cells and engines by its ``[job.layout]``: ``runtime.layout``) and
the run length, and each training cell's tensor-parallel ranks (``tp``; on
CUDA the layout's ``tensor_parallel``: one process, and there one GPU, per
rank, ``train.ranks``); all of it is checked when the configuration loads
(a ``tp`` the model's heads, query groups, FFN or vocabulary cannot split is
named by ``train.context.CellConfig``'s own check).
A preset that keeps a separate rollout pool (``C_s > 0``) gets one extra
SGLang engine for it; cells that train for the whole run (a static split)
get no engine and enter training before the first event. ``run_job`` is build, run, close
(``runtime.job_parts.JobParts``); the build starts, in order: the tiny tokenizer (trained
locally if missing), the training plane (K cells, Megatron-core on CPU), the
initial Qwen2 checkpoint *exported from the plane's version-0 weights* (so the
engines' behaviour policy and the trainer start identical), one SGLang CPU
engine per cell, the proxy (its own process on 127.0.0.1, restarted on its port if it
dies: ``runtime.proxy_process``; the summary's ``proxy_restarts``), the harness runner
and the ``RealBackend``; then runs the ``Controller`` for ``steps`` steps and
writes, under ``workdir``: ``metrics.jsonl`` and ``tb/`` (one record per step, during the
run: ``runtime.metrics``), ``log/`` (events.csv + summary.json, replayable by
``gyre.formats.eventlog.replay_run``), ``trace.csv`` (complete groups, simulator
format, with ``trace.json`` naming the preset, cluster and schedule it ran
under), ``summary.json`` and ``run.png``/``run.svg`` (reward and staleness per
step, ``gyre.analysis.real_run``).
Resumable (``gyre run --resume DIR``): the job also writes ``job.json``, appends
every accepted event to ``log/events.jsonl`` as it is fed (``gyre.formats.journal``)
and checkpoints the core cell at every burst boundary
(``checkpoints/resume-v{v:06d}``; ``runtime.restore.Checkpointer``); ``run_job(...,
resume=plan)`` goes on from a ``runtime.resume.ResumePlan`` instead of wiping the
folder (what is kept, redone and moved aside: ``runtime.resume``).
An engine that dies during the run is restarted with the newest published
weights by ``runtime.engine_watch`` (meanwhile the proxy moves its calls to a
live engine in the rollout role, or, with none, holds them until one is back:
``ENGINE_HOLD_S``); ``engines.json`` names each engine's process
group, and the summary's ``engine_restarts`` lists every restart (a failed one
is in ``backend_errors`` and the run goes on without that engine).
With a ``[cluster]`` table (``real.cluster``; ``gyre run --cluster ADDRESS``) the
run is placed on a Ray cluster: one placement group per cell holds its ranks and
its engine on one node, while this process (controller, proxy, harnesses, the
plane's control store) runs on the head; the summary's ``placement`` says which
node holds what. Without it nothing imports Ray.

Invariants: everything binds 127.0.0.1 on ports chosen at run time (placed on a
cluster: cells, engines and the control store bind their node's address on the
configured interface, the proxy still 127.0.0.1 on the head); every
process started here is stopped in ``finally`` (harnesses, engines, cells,
proxy); the summary's ``replay_identical`` is the differential check (the
simulator's driver regenerates the controller's action sequence exactly);
every harness runs with the proxy's record store (and its ``keys.json``)
hidden where its sandbox can make a private mount namespace
(``harness.sandbox``; the summary's ``harness_paths_hidden`` says whether).
"""

from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gyre.formats.trace_meta import TraceMeta, write_trace_meta
from gyre.real.runtime.job_config import JobConfig
from gyre.real.runtime.job_file import job_from_table, job_to_table
from gyre.real.runtime.job_parts import ADMIN_TOKEN, ENGINE_HOLD_S, SMALL_ENGINE, CellFailed, JobParts  # noqa: F401

__all__ = ["JobConfig", "CellFailed", "load_job_config", "run_job"]

if TYPE_CHECKING:
    from gyre.real.runtime.trace import ExecutionResult


def load_job_config(path: str | Path, tables: dict[str, dict[str, Any]] | None = None,
                    **overrides: Any) -> JobConfig:
    """The ``[job]`` table of a TOML file (``runtime.job_file.job_from_table``), with ``overrides`` (whole
    ``[job]`` keys) and ``tables`` (entries merged into a table: ``gyre run --set schedule.phi=0.5``),
    checked with ``check_environment``; errors name the file and the field."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"job configuration {path}: {exc}") from None
    table = dict(data.get("job", data))
    for beside in ("model", "cluster"):  # top-level [model] and [cluster] tables beside [job]
        if beside in data and "job" in data:
            table[beside] = data[beside]
    if isinstance(overrides.get("cluster"), dict) and isinstance(table.get("cluster", {}), dict):
        overrides["cluster"] = {**table.get("cluster", {}), **overrides["cluster"]}  # --cluster ADDRESS
    table.update(overrides)
    for name, entries in (tables or {}).items():
        if not isinstance(table.get(name, {}), dict):
            raise ValueError(f"job configuration {path}: {name} is not a table, so {name}.KEY cannot be set")
        table[name] = {**table.get(name, {}), **entries}
    try:
        return job_from_table(table).check_environment()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job configuration {path}: {exc}") from None


def run_job(job: JobConfig, progress: Callable[[str], None] | None = None,
            watch: Callable[[dict], None] | None = None, resume=None) -> dict[str, Any]:
    """Run ``job`` to its last step: build its parts, run, close (``runtime.job_parts``). ``progress`` gets
    one line per phase and per trained step, ``watch`` each step's metrics record (``runtime.metrics``) as
    it is written; ``resume``: a ``runtime.resume.ResumePlan`` to go on from instead of starting afresh."""
    run = JobParts(job, progress or (lambda line: None), resume)
    try:
        log_dir = run.build(watch).run()
        return _summarise(job, run, log_dir)
    except Exception:  # a crash or a dead cell: the harnesses stay with the supervisor for a resume to attach to
        run.keep_supervisor = True
        raise
    finally:
        run.close()


def _summarise(job: JobConfig, run: JobParts, log_dir: Path) -> dict[str, Any]:
    """The run's summary (``summary.json``), its trace (``trace.csv`` + ``trace.json``) and figures."""
    from gyre.formats.eventlog import replay_run
    from gyre.real.runtime.trace import write_trace

    wired, cfg, work = run.wired(), run.cfg, run.work
    controller, backend, supervisor, proxy = wired.controller, wired.backend, wired.watch, wired.proxy
    cells, placement, timings, replayed = run.cells, run.placement, run.timings, replay_run(log_dir)
    m = backend.metrics
    complete: dict[int | str, list[ExecutionResult]] = {}
    for r in m.trace:
        complete.setdefault(r.query_id, []).append(r)
    kept = [r for rs in complete.values() if len([x for x in rs if x.outcome != "cancelled"]) == cfg.N for r in rs]
    trace_path = write_trace(kept, work / "trace.csv", N=cfg.N) if kept else None
    if trace_path is not None:  # self-describing: gyre sim --trace RUN/trace.csv needs no --set
        schedule = job.schedule
        write_trace_meta(trace_path, TraceMeta(schedule.preset, schedule.shape(), dict(schedule.overrides), "gyre run"))
    staleness = m.staleness()
    curve = [statistics.fmean(m.rewards[v]) for v in sorted(m.rewards)]
    finished = [o for x, o in m.outcomes.items()]
    summary: dict[str, Any] = {
        "steps": controller.core.version, "published": controller.core.published, "bursts": controller.core.burst,
        "replay_identical": replayed == controller.log.actions, "actions": len(controller.log.actions),
        "events": len(controller.log.rows),
        "staleness_mean": statistics.fmean(staleness) if staleness else None,
        "staleness_predicted": cfg.predicted_staleness, "staleness_per_group": staleness,
        "reward_curve": curve, "reward_trend": None, "losses": [m.steps[v]["loss"] for v in sorted(m.steps)],
        "step_wall_s": [m.steps[v]["wall_s"] for v in sorted(m.steps)],
        "participants": [m.steps[v]["participants"] for v in sorted(m.steps)],
        "step_reports": [dict(m.steps[v], version=v) for v in sorted(m.steps)],  # gyre calibrate reads these
        "groups_fed": {v: sorted(g for g, t in m.v_t.items() if t == v) for v in sorted(set(m.v_t.values()))},
        "publishes": m.publishes, "transitions": m.transitions, "reroutes": len(m.reroutes),
        "move_stalls_ms": m.move_stalls_ms, "excluded_executions": m.excluded,
        "harnesses_isolated": backend.parts.runner.isolated,
        "harness_paths_hidden": backend.parts.runner.hiding, "cell_tp": job.cell_tp(),
        "cells": list(cells), "placement": placement.describe() if placement is not None else None,
        "executions_in_flight_at_transitions": m.in_flight_at_transition,
        "outcomes": {o: finished.count(o) for o in sorted(set(finished))},
        "backend_errors": backend.errors + (supervisor.errors if supervisor else []),
        "engine_restarts": supervisor.restarts if supervisor else [],
        "proxy_restarts": proxy.restarts if proxy is not None else [], "trace": str(trace_path) if trace_path else None,
        "resumes": _resumes(work), "supervisor": _supervision(work, backend.parts.runner, run.adoptions),
        "log": str(log_dir), "timings": timings, "config": job_to_table(job),
    }
    if summary["reward_curve"]:
        from gyre.analysis.real_run import plot_real_run, real_run_data

        summary["reward_trend"] = real_run_data(summary).trend  # (slope per step, t), as run.png's title
        summary["figures"] = [str(p) for p in plot_real_run(summary, work)]
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    summary["prediction"] = _predict(work)
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _resumes(work: Path) -> list[dict[str, Any]]:
    """Per resume of this run, every one (``attempts/{n}/resume.json``): the checkpoint, executions
    re-attached, re-run (and why) and re-admitted, and the harness work kept (execution-seconds)."""
    keys = ("attempt", "checkpoint", "version", "reattached", "rerun", "rerun_reasons", "readmitted", "cancelled",
            "supervisor", "work_kept_s", "saved_execution_s")
    found = sorted((work / "attempts").glob("*/resume.json"), key=lambda p: int(p.parent.name)) \
        if (work / "attempts").is_dir() else []
    return [{k: v for k, v in json.loads(p.read_text()).items() if k in keys} for p in found]


def _supervision(work: Path, runner, adoptions: dict[str, str]) -> dict[str, Any]:
    """What the run's supervisor ledger says was started again and why (``supervisor.ledger.restarts``), the
    harnesses this attempt attached to (execution: pid), and on a resume each engine's adoption: "adopted
    (pid, url)", or why it was started again ("not running", "pid N stopped: its memory state is unknown ...")."""
    from gyre.real.supervisor.ledger import read_records, restarts

    return {"restarted": restarts(read_records(work / "supervisor" / "ledger.jsonl")),
            "attached": {str(x): pid for x, pid in sorted(getattr(runner, "attached", {}).items())},
            "engines": dict(sorted(adoptions.items()))}


def _predict(work: Path) -> dict[str, Any]:
    """Calibrate the simulator on this run and simulate it (``gyre calibrate``); never fails the run."""
    from gyre.analysis.sim_vs_real import write_comparison

    try:
        result = write_comparison(work)
    except Exception as exc:  # the run's own records are already written; say why there is no prediction
        return {"error": f"{type(exc).__name__}: {exc}"}
    result.pop("table")
    return result
