"""A whole real run from one TOML file: ``run_job(JobConfig) -> summary``.

``JobConfig`` (frozen, loaded by ``load_job_config``) names a schedule preset
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

import dataclasses
import json
import statistics
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gyre.config import ConfigError, SchedulerConfig
from gyre.formats.trace_meta import TraceMeta, write_trace_meta
from gyre.presets import ClusterShape, build_preset
from gyre.real.harness.plugins import resolve_harness
from gyre.real.harness.runner import Budgets
from gyre.real.harness.sandbox import ISOLATE_MODES
from gyre.real.harness.taskset import load_taskset
from gyre.real.runtime.job_parts import ADMIN_TOKEN, ENGINE_HOLD_S, SMALL_ENGINE, CellFailed, JobParts  # noqa: F401
from gyre.real.runtime.layout import layout_from_table
from gyre.real.runtime.metrics import WANDB_MODES
from gyre.real.toy.tasks import EmitCharTask
from gyre.real.toy.tiny_model import build_tiny_tokenizer

if TYPE_CHECKING:
    from gyre.real.runtime.trace import ExecutionResult


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    workdir: str = "runs/cpu-demo"
    model_dir: str = "runs/tiny-tokenizer"
    preset: str = "gyre-1"           # any name of gyre.presets.PRESETS
    nodes: int = 2                   # single-node cells (each: one SGLang engine + one training cell)
    C_e: int = 2                     # concurrent executions per node
    N: int = 2
    B: int = 2
    schedule: dict[str, Any] = dataclasses.field(default_factory=dict)  # SchedulerConfig field overrides
    steps: int = 4
    calls: int = 2
    max_tokens: int = 12
    target: str = "e"
    lr: float = 1e-3
    seed: int = 0
    token_budget: int = 4096
    timeout_s: float = 900.0
    harness_timeout_s: float = 600.0   # a harness is killed here; its work is still scored
    overall_timeout_s: float = 900.0   # harness + evaluation retries; past it the execution is excluded
    isolate: str = "auto"  # each harness in its own loopback-only network namespace: auto | always | never
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # the [model] table: checkpoint, dtype
    harness: str = "scripted"  # scripted | mini-swe-agent | claude-code | codex | "module:Class"
    harness_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # the adapter's keyword arguments
    tasks: str = ""            # a task set (JSONL, harness.taskset); empty: the toy task on `target`
    evaluator: str = ""        # "module:Class" scoring the task set (with `tasks`)
    device: str = "cpu"        # cpu | cuda (cuda needs the [job.layout] table)
    layout: dict[str, Any] = dataclasses.field(default_factory=dict)  # runtime.layout.GpuLayout fields
    tp: int = 1                # tensor-parallel ranks per training cell (cuda: layout.tensor_parallel instead)
    cluster: dict[str, Any] = dataclasses.field(default_factory=dict)  # the [cluster] table: real.cluster.config
    cell_restarts: int = 2     # a run whose training cell died resumes itself this often (gyre run: CellFailed)
    supervisor_grace_s: float = 300.0  # the supervisor stops the harnesses this long after its lease expired
    wandb: str = ""            # "offline": metrics also to an offline W&B run in WORKDIR/wandb (runtime.metrics)

    def __post_init__(self) -> None:
        """Checks that need nothing but the fields (no file read, no import, no tokenizer): a job can be
        built and compared cheaply; ``check_environment`` looks at what the fields name."""
        if self.isolate not in ISOLATE_MODES:
            raise ValueError(f"job field isolate must be one of {ISOLATE_MODES}, not {self.isolate!r}")
        if not isinstance(self.schedule, dict):
            raise ValueError(f"job field schedule must be a table of schedule fields, not {self.schedule!r}")
        try:
            cfg = self.scheduler()  # the presets' and the policy core's own checks name any impossible value
        except (ConfigError, TypeError) as exc:
            raise ValueError(f"schedule: {exc}") from None
        if isinstance(self.cell_restarts, bool) or not isinstance(self.cell_restarts, int) or self.cell_restarts < 0:
            raise ValueError(f"job field cell_restarts must be an integer >= 0, not {self.cell_restarts!r}")
        if isinstance(self.supervisor_grace_s, bool) or not isinstance(self.supervisor_grace_s, (int, float)) \
                or not 0 <= self.supervisor_grace_s < float("inf"):
            raise ValueError(f"job field supervisor_grace_s must be a number of seconds >= 0 (finite: the supervisor "
                             f"must stop a run no driver comes back to), not {self.supervisor_grace_s!r}")
        if self.wandb not in WANDB_MODES:
            raise ValueError(f"job field wandb must be \"offline\" or \"\" (off), not {self.wandb!r}: a run never "
                             "sends metrics over the network itself (wandb sync uploads an offline run)")
        if self.steps < 1 or self.steps % cfg.mu:
            raise ValueError(f"job field steps must be a positive multiple of mu = {cfg.mu} (whole bursts), "
                             f"not {self.steps}")
        Budgets(harness_timeout_s=self.harness_timeout_s, overall_timeout_s=self.overall_timeout_s)
        if bool(self.tasks) != bool(self.evaluator):
            raise ValueError("job fields tasks and evaluator go together: a task set needs its evaluator "
                             f"(\"module:Class\"), got tasks={self.tasks!r}, evaluator={self.evaluator!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"job field device must be cpu or cuda, not {self.device!r}")
        if self.device == "cuda":
            self.gpu_layout()
        elif self.layout:
            raise ValueError("job field layout applies to device = \"cuda\" only")
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or self.tp < 1:
            raise ValueError(f"job field tp must be a positive integer, not {self.tp!r}")
        if self.device == "cuda" and self.tp not in (1, self.cell_tp()):
            raise ValueError(f"job field tp = {self.tp} disagrees with layout.tensor_parallel = {self.cell_tp()}: "
                             f"on device = \"cuda\" a cell's ranks are the layout's; leave tp out")
        if self.cluster and self.device == "cuda":
            raise ValueError("[cluster] places CPU jobs only so far: a CUDA job's [job.layout] numbers the GPUs "
                             "of one node; run it without [cluster]")

    def check_environment(self) -> JobConfig:
        """What the fields name, looked at before anything starts (files read, classes imported, the tiny
        tokenizer trained when a split needs its vocabulary): ValueError names the field; ``self`` when all
        is well. ``load_job_config`` and a resume run it."""
        if self.model:
            self.model_config()  # a checkpoint the bridge cannot load fails here, before anything starts
        self.harness_adapter()  # an unknown harness or unimportable class fails here
        self.task_source()  # every line of the task set and every evaluator's arguments are checked here
        if self.cluster:
            self.cluster_config()  # a bad address, unknown key or missing interface fails here, naming the field
        if self.cell_tp() > 1:  # the model must split over the cell's ranks; CellConfig's check names what cannot
            self.check_cells(self.model_config() or self.toy_model_config())
        return self

    def cluster_config(self):
        """The checked ``ClusterConfig`` of the ``[cluster]`` table (None: a single-machine run)."""
        if not self.cluster:
            return None
        from gyre.real.cluster.config import cluster_from_table

        return cluster_from_table(self.cluster)

    def cell_tp(self) -> int:
        """Tensor-parallel ranks (processes) per training cell: ``tp``, or the layout's on CUDA."""
        return self.gpu_layout().tensor_parallel if self.device == "cuda" else self.tp

    def check_cells(self, model) -> None:
        """Raise ValueError unless the training cells can hold ``model`` over ``cell_tp()`` ranks."""
        from gyre.real.train.context import CellConfig

        try:
            CellConfig(cells=self.scheduler().K, store_port=0, queue_root="", workdir="", device=self.device,
                       model=model, tp=self.cell_tp())
        except ValueError as exc:
            raise ValueError(f"training cells of tp = {self.cell_tp()} ranks: {exc}") from None

    def toy_model_config(self):
        """The tiny toy model's ``ModelConfig`` (vocabulary: the tiny tokenizer's, trained under
        ``model_dir`` if missing)."""
        from transformers import AutoTokenizer

        from gyre.real.train.model import ModelConfig

        folder = build_tiny_tokenizer(Path(self.model_dir))
        vocab = len(AutoTokenizer.from_pretrained(str(folder)))
        return ModelConfig(vocab_size=vocab, max_sequence_length=4096, init_seed=1234 + self.seed,
                           tokenizer=str(folder))  # every export carries it (train.publish)

    def harness_adapter(self):
        """The harness adapter the job names (the scripted one makes ``calls`` calls unless its options say)."""
        options = dict(self.harness_options) if isinstance(self.harness_options, dict) else self.harness_options
        if self.harness == "scripted" and isinstance(options, dict):
            options = {"calls": self.calls, "compact_every": 0, "subagent_at": (), **options}
        return resolve_harness(self.harness, options)

    def task_source(self):
        """The backend's task source: a ``TaskSet`` (``tasks`` + ``evaluator``) or the toy ``EmitCharTask``."""
        if not self.tasks:
            return EmitCharTask(self.target)
        return load_taskset(self.tasks, self.evaluator, seed=self.seed)

    def gpu_layout(self):
        """The checked ``GpuLayout`` of a CUDA job (``runtime.layout``)."""
        if self.model.get("checkpoint") is None:
            raise ValueError("device = \"cuda\" needs a [model] checkpoint (a Hugging Face Qwen folder)")
        if self.scheduler().C_s > 0:
            raise ValueError(f"preset {self.preset!r} keeps a separate rollout pool, which [job.layout] "
                             f"gives no GPUs; choose a preset without one on device = \"cuda\"")
        return layout_from_table(self.layout, self.nodes)

    def model_config(self):
        """The cells' ``ModelConfig`` from the [model] checkpoint (None: the tiny toy model)."""
        if not self.model:
            return None
        unknown = sorted(set(self.model) - {"checkpoint", "dtype"})
        if unknown or not isinstance(self.model.get("checkpoint"), str):
            raise ValueError(f"[model] needs checkpoint = \"FOLDER\" (and optionally dtype); unknown: {unknown}")
        folder = Path(self.model["checkpoint"])
        if not folder.exists():
            raise ValueError(f"[model] checkpoint {folder}: no config.json, the folder does not exist: set it to "
                             f"a Hugging Face checkpoint folder on this machine (nothing is downloaded)")
        if not (folder / "config.json").is_file():
            raise ValueError(f"[model] checkpoint {folder}: no config.json (a Hugging Face checkpoint folder)")
        if self.model.get("dtype", "float32") not in ("float32", "bfloat16"):
            raise ValueError(f"[model] dtype must be float32 or bfloat16, not {self.model['dtype']!r}")
        from gyre.real.train.bridge import model_config_from_hf

        try:
            return model_config_from_hf(folder, dtype=self.model.get("dtype"), init_seed=1234 + self.seed,
                                        max_sequence_length=4096)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"[model] checkpoint {folder}: {exc}") from None

    def shape(self) -> ClusterShape:
        return ClusterShape(nodes=self.nodes, nodes_per_cell=1, per_node_capacity=self.C_e, N=self.N, B=self.B)

    def scheduler(self) -> SchedulerConfig:
        """The preset on this job's cluster, with the ``schedule`` overrides applied."""
        return build_preset(self.preset, self.shape(), **self.schedule)


def load_job_config(path: str | Path, tables: dict[str, dict[str, Any]] | None = None,
                    **overrides: Any) -> JobConfig:
    """The ``[job]`` table of a TOML file, with ``overrides`` (whole fields) and ``tables`` (entries merged
    into a table field: ``gyre run --set schedule.phi=0.5``), checked with ``check_environment``; errors
    name the file and the field."""
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
    data = dict(table, **overrides)
    for name, entries in (tables or {}).items():
        if not isinstance(data.get(name, {}), dict):
            raise ValueError(f"job configuration {path}: {name} is not a table, so {name}.KEY cannot be set")
        data[name] = {**data.get(name, {}), **entries}
    known = {f.name for f in dataclasses.fields(JobConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"job configuration {path}: unknown field(s) {unknown}; known: {sorted(known)}")
    try:
        return JobConfig(**data).check_environment()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job configuration {path}: {exc}") from None


def run_job(job: JobConfig, progress: Callable[[str], None] | None = None,
            watch: Callable[[dict], None] | None = None, resume=None) -> dict[str, Any]:
    """Run ``job`` to its last step: build its parts, run, close (``runtime.job_parts``). ``progress`` gets
    one line per phase and per trained step, ``watch`` each step's metrics record (``runtime.metrics``) as
    it is written; ``resume``: a ``runtime.resume.ResumePlan`` to go on from instead of starting afresh."""
    from gyre.formats.eventlog import replay_run
    from gyre.real.runtime.trace import write_trace

    run = JobParts(job, progress or (lambda line: None), resume)
    try:
        log_dir = run.build(watch).run()
        wired = run.wired()
        return _summarise(job, run.cfg, wired.controller, wired.backend, log_dir, replay_run(log_dir), write_trace,
                          run.work, run.timings, run.cells, wired.watch, run.placement, wired.proxy)
    except Exception:  # a crash or a dead cell: the harnesses stay with the supervisor for a resume to attach to
        run.keep_supervisor = True
        raise
    finally:
        run.close()


def _summarise(job, cfg, controller, backend, log_dir, replayed, write_trace, work, timings,
               cells=(), supervisor=None, placement=None, proxy=None) -> dict[str, Any]:
    m = backend.metrics
    complete: dict[int | str, list[ExecutionResult]] = {}
    for r in m.trace:
        complete.setdefault(r.query_id, []).append(r)
    kept = [r for rs in complete.values() if len([x for x in rs if x.outcome != "cancelled"]) == cfg.N for r in rs]
    trace_path = write_trace(kept, work / "trace.csv", N=cfg.N) if kept else None
    if trace_path is not None:  # self-describing: gyre sim --trace RUN/trace.csv needs no --set
        write_trace_meta(trace_path, TraceMeta(job.preset, job.shape(), dict(job.schedule), "gyre run"))
    staleness = m.staleness()
    curve = [statistics.fmean(m.rewards[v]) for v in sorted(m.rewards)]
    finished = [o for x, o in m.outcomes.items()]
    summary = {
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
        "resumes": _resumes(work), "supervisor": _supervision(work, backend.parts.runner),
        "log": str(log_dir), "timings": timings, "config": dataclasses.asdict(job),
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
    """Per resume of this run (``attempts/{n}/resume.json``): executions re-attached, re-run (and why) and
    re-admitted."""
    keys = ("attempt", "version", "reattached", "rerun", "rerun_reasons", "readmitted", "cancelled", "supervisor")
    found = sorted((work / "attempts").glob("*/resume.json"), key=lambda p: int(p.parent.name)) \
        if (work / "attempts").is_dir() else []
    return [{k: v for k, v in json.loads(p.read_text()).items() if k in keys} for p in found]


def _supervision(work: Path, runner) -> dict[str, Any]:
    """What the run's supervisor ledger says was started again and why (``supervisor.ledger.restarts``), and
    the harnesses this attempt attached to (execution: pid)."""
    from gyre.real.supervisor.ledger import read_records, restarts

    return {"restarted": restarts(read_records(work / "supervisor" / "ledger.jsonl")),
            "attached": {str(x): pid for x, pid in sorted(getattr(runner, "attached", {}).items())}}


def _predict(work: Path) -> dict[str, Any]:
    """Calibrate the simulator on this run and simulate it (``gyre calibrate``); never fails the run."""
    from gyre.analysis.sim_vs_real import write_comparison

    try:
        result = write_comparison(work)
    except Exception as exc:  # the run's own records are already written; say why there is no prediction
        return {"error": f"{type(exc).__name__}: {exc}"}
    result.pop("table")
    return result
