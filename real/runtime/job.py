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
get no engine and enter training before the first event. ``run_job`` builds, in order: the tiny tokenizer (trained
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

import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gyre.actions import SEPARATE
from gyre.config import ConfigError, SchedulerConfig
from gyre.formats.trace_meta import TraceMeta, write_trace_meta
from gyre.presets import ClusterShape, build_preset
from gyre.real.runtime.backend import Parts, RealBackend
from gyre.real.runtime.controller import Controller
from gyre.real.runtime.engine_watch import EngineWatch
from gyre.real.runtime.metrics import WANDB_MODES, LiveMetrics
from gyre.real.runtime.proxy_process import ProxyProcess
from gyre.real.engines.manager import HOST, EngineManager, EngineSpec, free_port
from gyre.real.harness.plugins import resolve_harness
from gyre.real.harness.runner import Budgets, HarnessRunner
from gyre.real.harness.sandbox import ISOLATE_MODES
from gyre.real.harness.taskset import TaskSet, load_taskset
from gyre.real.runtime.layout import layout_from_table
from gyre.real.toy.tasks import EmitCharTask
from gyre.real.toy.tiny_model import build_tiny_tokenizer

ADMIN_TOKEN = "gyre-job-admin"
# a model call that finds no engine in the rollout role (the only one died and restarts, or every cell
# trains) waits this long for one in the proxy (RetryPolicy.hold_s) instead of failing the execution
ENGINE_HOLD_S = 600.0
SMALL_ENGINE = ("--mem-fraction-static", "0.05", "--max-total-tokens", "16384", "--skip-server-warmup")


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
    wandb: str = ""            # "offline": metrics also to an offline W&B run in WORKDIR/wandb (runtime.metrics)

    def __post_init__(self) -> None:
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
        if self.wandb not in WANDB_MODES:
            raise ValueError(f"job field wandb must be \"offline\" or \"\" (off), not {self.wandb!r}: a run never "
                             "sends metrics over the network itself (wandb sync uploads an offline run)")
        if self.steps < 1 or self.steps % cfg.mu:
            raise ValueError(f"job field steps must be a positive multiple of mu = {cfg.mu} (whole bursts), "
                             f"not {self.steps}")
        Budgets(harness_timeout_s=self.harness_timeout_s, overall_timeout_s=self.overall_timeout_s)
        if self.model:
            self.model_config()  # a checkpoint the bridge cannot load fails here, before anything starts
        self.harness_adapter()  # an unknown harness or unimportable class fails here
        if bool(self.tasks) != bool(self.evaluator):
            raise ValueError("job fields tasks and evaluator go together: a task set needs its evaluator "
                             f"(\"module:Class\"), got tasks={self.tasks!r}, evaluator={self.evaluator!r}")
        self.task_source()  # every line of the task set and every evaluator's arguments are checked here
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
        if self.cluster:
            self.cluster_config()  # a bad address, unknown key or missing interface fails here, naming the field
            if self.device == "cuda":
                raise ValueError("[cluster] places CPU jobs only so far: a CUDA job's [job.layout] numbers the GPUs "
                                 "of one node; run it without [cluster]")
        if self.cell_tp() > 1:  # the model must split over the cell's ranks; CellConfig's check names what cannot
            self.check_cells(self.model_config() or self.toy_model_config())

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


def load_job_config(path: str | Path, **overrides: Any) -> JobConfig:
    """The ``[job]`` table of a TOML file, with ``overrides``; errors name the file and the field."""
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
    known = {f.name for f in dataclasses.fields(JobConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"job configuration {path}: unknown field(s) {unknown}; known: {sorted(known)}")
    try:
        return JobConfig(**data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job configuration {path}: {exc}") from None


class CellFailed(RuntimeError):
    """A training cell's process died during the run (the message names the cells and exit codes);
    ``gyre run`` resumes the run from its last checkpoint, up to ``cell_restarts`` times."""


async def _run_until_failure(controller, backend, plane, job: JobConfig, wiring) -> None:
    """Run the controller to the end; a failed backend task (engine, cell, proxy) stops it at once,
    as ``CellFailed`` when a training cell is among the dead."""
    run = asyncio.ensure_future(controller.run(job.steps, timeout_s=job.timeout_s, finish_publication=True,
                                               resume=await wiring.before_run()))
    try:
        while not run.done():
            await asyncio.wait({run}, timeout=0.5)
            if backend.errors and not run.done():
                run.cancel()
                raise RuntimeError(f"backend task failed: {backend.errors}")
        run.result()
    except Exception as exc:
        if plane.crashes:
            dead = ", ".join(f"cell {c} (exit code {code})" for c, code in sorted(plane.crashes.items()))
            raise CellFailed(f"training {dead} died: {exc}") from exc
        raise


def _initial_model(plane, tokenizer_dir: Path, work: Path) -> Path:
    """Export the plane's version-0 weights as an HF Qwen2 folder with the tokenizer (engine model)."""
    plane.call(0, "enter_training")
    answer = plane.call(0, "publish", version=0, endpoints=[], directory=str(work / "checkpoints"))
    plane.call(0, "leave_training")
    model = work / "engine-model"
    shutil.copytree(answer["path"], model)
    for item in tokenizer_dir.iterdir():
        if item.is_file() and item.name not in ("config.json", "model.safetensors"):
            shutil.copy(item, model / item.name)
    return model


def run_job(job: JobConfig, progress: Callable[[str], None] | None = None,
            watch: Callable[[dict], None] | None = None, resume=None) -> dict[str, Any]:
    """Run ``job`` to its last step; ``progress`` gets one line per phase and per trained step,
    ``watch`` each step's metrics record (``runtime.metrics``) as it is written. ``resume``: a
    ``runtime.resume.ResumePlan`` (``gyre run --resume``) to go on from instead of starting afresh."""
    from gyre.real.proxy.config import EngineSpec as ProxyEngine
    from gyre.real.proxy.config import Limits, ProxyConfig, RetryPolicy
    from gyre.real.runtime.trace import write_trace
    from gyre.real.train.plane import PlaneConfig, TrainingPlane
    from gyre.real.train.state import OptimConfig
    from gyre.formats.eventlog import replay_run

    layout = job.gpu_layout() if job.device == "cuda" else None
    if layout is not None and layout.runnable_problem():  # refuse what this build cannot place, touching nothing
        raise ValueError(f"job layout: {layout.runnable_problem()}")
    from gyre.real.runtime.restore import ResumeWiring, controller_parts
    from gyre.real.runtime.resume import open_run_folder

    work = Path(job.workdir)
    lock = open_run_folder(job, resume)  # fresh: wiped, job.json; resumed: what it must not see moved aside
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    say = progress or (lambda line: None)
    model_cfg = job.model_config()
    if model_cfg is not None:  # a Hugging Face checkpoint: the cells load it, its tokenizer serves
        tok_dir = Path(job.model["checkpoint"])
        say(f"model: {model_cfg.family} checkpoint {tok_dir} ({model_cfg.dtype})")
    else:
        say(f"building the tiny tokenizer in {job.model_dir}")
        tok_dir = build_tiny_tokenizer(Path(job.model_dir))
        model_cfg = job.toy_model_config()
    cfg = job.scheduler()
    for line in layout.describe(cfg.K) if layout is not None else ():
        say(line)
    tasks, adapter = job.task_source(), job.harness_adapter()
    if isinstance(tasks, TaskSet):  # each execution's process builds its task's workspace first
        adapter = tasks.harness(adapter)
        say(f"task set {job.tasks}: {len(tasks.specs)} tasks, evaluator {job.evaluator}, harness {adapter.name}")
    tp = job.cell_tp()
    plane = TrainingPlane(PlaneConfig(cells=cfg.K, model=model_cfg, optim=OptimConfig(lr=job.lr), timeout_s=300.0,
                                      device=job.device, tp=tp, pp=layout.pipeline_parallel if layout else 1),
                          work / "plane")
    engines = EngineManager(work / "engine-logs")
    names = {c: f"e{c}" for c in range(cfg.static_train_cells, cfg.K)}  # static trainers serve no rollout
    if cfg.C_s > 0:
        names[SEPARATE] = "sep"
    proxy = runner = supervisor = placement = None
    try:
        if job.cluster:  # one placement group per cell on the Ray cluster (real.cluster)
            from gyre.real.cluster.placement import Placement

            cluster = job.cluster_config()
            say(f"placing {cfg.K} cells on the Ray cluster at {cluster.address}")
            placement = Placement(cluster, progress=say).open(cells=cfg.K, tp=tp, engines=names)
            plane.launcher = engines.launcher = placement
        say(f"schedule {job.preset}: K={cfg.K} cells, C_s={cfg.C_s}, phi={cfg.phi}, mu={cfg.mu}, "
            f"{cfg.granularity} transitions, streaming {'on' if cfg.streaming else 'off'}")
        say(f"starting {cfg.K} training cells of {tp} rank{'s' if tp > 1 else ''} each (Megatron-core, "
            f"{job.device})")
        plane.start()
        cells = [plane.call(c, "info") for c in range(cfg.K)]  # each cell's leader, as it came up: role, tp, pid
        (work / "cells.json").write_text(json.dumps({str(c): info for c, info in enumerate(cells)}, default=str))
        model = work / "engine-model"  # a resumed run's engines start from it (runtime.restore loads the newest)
        if resume is None or not model.is_dir():
            model = _initial_model(plane, tok_dir, work)
        for cell in range(cfg.static_train_cells):
            plane.send(cell, "enter_training").result()
        for cell, name in names.items():
            host, port = placement.engine_endpoint(name) if placement is not None else (HOST, free_port())
            engines.launch(EngineSpec(engine_id=name, model_path=str(model), port=port, host=host,
                                      cpu=layout is None,
                                      extra_args=SMALL_ENGINE if layout is None else layout.engine_args(cell)))
        say(f"starting {len(names)} SGLang CPU engines ({', '.join(names.values())})")
        for name in names.values():
            engines.wait_healthy(name, timeout=300)
        timings["startup_s"] = time.monotonic() - t0
        # from here on a dead engine is restarted with the newest published weights (runtime.engine_watch)
        supervisor = EngineWatch(engines, latest=lambda: backend.latest, publishing=lambda: backend._publishing,
                                 gate=lambda name, serving: backend.gate_engine(name, serving),
                                 progress=say, roster=work / "engines.json").start()
        say(f"ready after {timings['startup_s']:.1f} s; running {job.steps} steps, {cfg.mu} per burst")
        proxy_cfg = ProxyConfig(model_path=str(model), records_dir=str(work / "records"), admin_token=ADMIN_TOKEN,
                                engines=tuple(ProxyEngine(id=n, url=engines.engines[n].url) for n in names.values()),
                                port=free_port(), fsync=False, limits=Limits(default_max_tokens=job.max_tokens),
                                retry=RetryPolicy(hold_s=ENGINE_HOLD_S))
        proxy = ProxyProcess(proxy_cfg, work / "proxy", progress=say).start()
        proxy_url = f"http://127.0.0.1:{proxy_cfg.port}"
        runner = HarnessRunner(work / "executions", proxy_url, adapter,
                               Budgets(harness_timeout_s=job.harness_timeout_s,
                                       overall_timeout_s=job.overall_timeout_s), isolate=job.isolate,
                               hide=[work / "records", work / "records" / "keys.json",  # records, key digests
                                     work / "attempts",  # and what a resume moved aside (runtime.resume)
                                     work / "proxy"])  # the proxy's config holds the admin token
        parts = Parts(proxy_url=proxy_url, admin_token=ADMIN_TOKEN, engines=engines, engine_names=names,
                      plane=plane, runner=runner, records_dir=work / "records",
                      checkpoint_dir=work / "checkpoints", task=tasks, watch=supervisor)
        backend = RealBackend(cfg, parts, seed=job.seed, token_budget=job.token_budget,
                              progress=say, steps=job.steps)
        controller = Controller(cfg, backend, **controller_parts(resume, work / "log"))  # log: events.jsonl, live
        backend.bind(controller)
        redone = None if resume is None else resume.version + 1  # the first redone step (step = version + 1)
        live = LiveMetrics(cfg, work, names, log=say, watch=watch, wandb=job.wandb,
                           purge_step=redone).bind(controller, backend)
        backend.on_step = live.on_step  # metrics.jsonl + tb/, one record per step, during the run
        wiring = ResumeWiring(resume, controller, backend, work=work, tp=tp, seed=job.seed)  # runtime.restore

        async def main() -> None:
            supervising = asyncio.ensure_future(supervisor.supervise())
            proxy_watch = asyncio.ensure_future(proxy.supervise(on_restart=backend.reapply_proxy_state))
            try:
                await _run_until_failure(controller, backend, plane, job, wiring)
            finally:
                supervisor.stop()  # the run is over: nothing waits for an engine still coming back
                supervising.cancel()
                proxy_watch.cancel()
                await backend.stop()

        t_run = time.monotonic()
        try:
            asyncio.run(main())
        finally:
            live.close()
            log_dir = controller.write_log(work / "log")
        timings["run_s"] = time.monotonic() - t_run
        return _summarise(job, cfg, controller, backend, log_dir, replay_run(log_dir), write_trace, work, timings,
                          cells, supervisor, placement, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        if supervisor is not None:
            supervisor.close()  # restarts nothing more; stops every engine, then the thread that launched restarts
        engines.shutdown_all()
        plane.close()
        if placement is not None:
            placement.close()  # whatever the node agents still run, then the agents and placement groups
        os.close(lock)


def _summarise(job, cfg, controller, backend, log_dir, replayed, write_trace, work, timings,
               cells=(), supervisor=None, placement=None, proxy=None) -> dict[str, Any]:
    m = backend.metrics
    complete = {}
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
        "move_stalls_ms": m.move_stalls_ms, "excluded_executions": m.excluded, "harnesses_isolated": backend.parts.runner.isolated,
        "harness_paths_hidden": backend.parts.runner.hiding, "cell_tp": job.cell_tp(),
        "cells": list(cells), "placement": placement.describe() if placement is not None else None,
        "executions_in_flight_at_transitions": m.in_flight_at_transition,
        "outcomes": {o: finished.count(o) for o in sorted(set(finished))},
        "backend_errors": backend.errors + (supervisor.errors if supervisor else []),
        "engine_restarts": supervisor.restarts if supervisor else [],
        "proxy_restarts": proxy.restarts if proxy is not None else [], "trace": str(trace_path) if trace_path else None,
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


def _predict(work: Path) -> dict[str, Any]:
    """Calibrate the simulator on this run and simulate it (``gyre calibrate``); never fails the run."""
    from gyre.analysis.sim_vs_real import write_comparison

    try:
        result = write_comparison(work)
    except Exception as exc:  # the run's own records are already written; say why there is no prediction
        return {"error": f"{type(exc).__name__}: {exc}"}
    result.pop("table")
    return result
