"""The live parts of one real run, built in order, run, and closed in reverse: ``runtime.job.run_job``.

``JobParts(job, say, resume)`` holds what a run starts; ``build()`` starts it,
one named step each (the work folder and its lock, the model and tokenizer,
the tasks and harness, the training plane, the engines and their watch, the
proxy, the backend wired to the controller, its live metrics and resume
checkpoints); ``wired()`` gives the parts a finished build wired together
(RuntimeError before then); ``run()`` runs the controller to the end and
writes the event log; ``close()`` stops whatever was started, in reverse
order, whatever failed. Every step reads the job's configuration and does the
I/O the configuration itself never does.

The harnesses, their sandbox bridge, the proxy and (without a Ray cluster) the
SGLang engines run under the run folder's supervisor (``real.supervisor``),
started or reused right after the folder is opened; on a Ray cluster each
engine runs under its node's supervisor (a detached actor per node that hosts
an engine, opened with the placement: ``cluster.node_engines``), the cells
with the node agents. A resumed run adopts the
engines and the proxy a killed attempt left (same pids and ports; each engine
then loads the version the resume restores), starts again on the proxy's
ports the engines that died, and attaches to the harnesses still running.

Invariants: nothing starts before the layout is known to be runnable; every
process started here is stopped by ``close`` (harnesses, engines, cells,
proxy, placement) and the folder's lock released, except, after a failure,
what the supervisors own (harnesses, bridge, proxy, engines: kept for a resume, and
stopped by each supervisor itself once its lease has been expired for the
job's ``supervisor_grace_s``); the engine watch serves
the backend (its newest publication, the one in flight, the proxy's gate)
only once both exist.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable

from gyre.actions import SEPARATE
from gyre.real.engines.manager import HOST, EngineManager, EngineSpec
from gyre.real.harness.runner import HarnessRunner
from gyre.real.harness.taskset import TaskSet
from gyre.real.runtime.backend import Parts, RealBackend
from gyre.real.runtime.controller import Controller
from gyre.real.runtime.engine_watch import EngineWatch
from gyre.real.runtime.metrics import LiveMetrics
from gyre.real.runtime.ports import free_port
from gyre.real.runtime.proxy_process import ProxyProcess
from gyre.real.supervisor.client import LeaseRenewer, SupervisorClient

if TYPE_CHECKING:
    from gyre.real.cluster.placement import Placement
    from gyre.real.runtime.job_config import JobConfig
    from gyre.real.runtime.restore import ResumeWiring
    from gyre.real.runtime.resume import ResumePlan
    from gyre.real.train.plane import TrainingPlane

ADMIN_TOKEN = "gyre-job-admin"
# a model call that finds no engine in the rollout role (the only one died and restarts, or every cell
# trains) waits this long for one in the proxy (RetryPolicy.hold_s) instead of failing the execution
ENGINE_HOLD_S = 600.0
SMALL_ENGINE = ("--mem-fraction-static", "0.05", "--max-total-tokens", "16384", "--skip-server-warmup")


class CellFailed(RuntimeError):
    """A training cell's process died during the run (the message names the cells and exit codes);
    ``gyre run`` resumes the run from its last checkpoint, up to ``cell_restarts`` times."""


class SupervisorLost(CellFailed):
    """The run's supervisor died (its harnesses with it): ``gyre run`` resumes as after a dead cell, a new
    supervisor re-runs those executions (``runtime.resume``: re-run, "its supervisor is gone")."""


@dataclass(frozen=True)
class Wired:
    """The parts ``JobParts.run`` drives, every one built (``JobParts.build`` ends with them)."""

    plane: TrainingPlane
    watch: EngineWatch
    proxy: ProxyProcess
    backend: RealBackend
    controller: Controller
    live: LiveMetrics
    wiring: ResumeWiring


class JobParts:
    def __init__(self, job: JobConfig, say: Callable[[str], None], resume: ResumePlan | None = None) -> None:
        self.job, self.say, self.resume = job, say, resume
        self.cfg, self.work = job.scheduler(), Path(job.workdir)
        self.layout = job.gpu_layout() if job.layout.device == "cuda" else None
        self.names = {c: f"e{c}" for c in range(self.cfg.static_train_cells, self.cfg.K)}  # static: no engine
        if self.cfg.C_s > 0:
            self.names[SEPARATE] = "sep"
        self.timings: dict[str, float] = {}
        self.cells: list[dict] = []
        self.lock: int | None = None
        self.supervisor: SupervisorClient | None = None  # the folder's supervisor (real.supervisor)
        self.lease: LeaseRenewer | None = None
        self.keep_supervisor = False  # close(): keep it (and its harnesses) for a resume to attach to
        self.adoptions: dict[str, str] = {}  # a resume: per engine, adopted or why not (summary.json)
        # what ``close`` stops: each None until its step has started it (a build can fail part-way)
        self.plane: TrainingPlane | None = None
        self.engines: EngineManager | None = None
        self.placement: Placement | None = None
        self.watch: EngineWatch | None = None
        self.proxy: ProxyProcess | None = None
        self._wired: Wired | None = None

    # ---- build -------------------------------------------------------------------------
    def build(self, watch: Callable[[dict], None] | None = None) -> JobParts:
        if self.layout is not None and self.layout.runnable_problem():  # refuse what cannot be placed, touching nothing
            raise ValueError(f"job layout: {self.layout.runnable_problem()}")
        from gyre.real.runtime.resume import open_run_folder

        if self.resume is None:  # a killed run's harnesses (and node supervisors) on this folder: not this run's
            stop_stale_supervisor(self.work, cluster=self.job.cluster is not None)
        self.lock = open_run_folder(self.job, self.resume)  # fresh: wiped, job.json; resumed: old work moved aside
        self._start_supervisor()
        t0 = time.monotonic()
        tokenizer, model_cfg = self._model()
        tasks, adapter = self._tasks()
        plane, engines = self._start_plane(model_cfg)
        model = self._start_engines(plane, engines, tokenizer)
        self.timings["startup_s"] = time.monotonic() - t0
        engine_watch = self.watch = EngineWatch(engines, progress=self.say, roster=self.work / "engines.json").start()
        self.say(f"ready after {self.timings['startup_s']:.1f} s; running {self.job.steps} steps, "
                 f"{self.cfg.mu} per burst")
        proxy = self._start_proxy(engines, model)
        self._wired = self._wire(tasks, adapter, watch, plane, engines, engine_watch, proxy)
        return self

    def wired(self) -> Wired:
        """The parts a finished ``build`` wired together; RuntimeError before then."""
        if self._wired is None:
            raise RuntimeError("JobParts: build() has not finished, so there is nothing to run or summarise")
        return self._wired

    def _start_supervisor(self) -> None:
        """Start the folder's supervisor, or reuse the one a killed attempt left (its harnesses go on), and
        renew its lease from a thread until ``close``."""
        from gyre.real.supervisor.client import SUPERVISOR_DIR, LeaseRenewer, start_or_reuse

        self.supervisor, reused = start_or_reuse(self.work / SUPERVISOR_DIR, self.job.harness.supervisor_grace_s)
        self.lease = LeaseRenewer(self.supervisor).start()
        self.say(f"supervisor {self.supervisor.pid} ({'reused' if reused else 'started'}; it stops the harnesses, "
                 f"proxy and engines {self.job.harness.supervisor_grace_s:g} s after this process stops renewing "
                 "its lease)")

    def _model(self):
        """The tokenizer's folder and the cells' model: a Hugging Face checkpoint, or the tiny toy model."""
        model = self.job.model
        if not model.checkpoint:
            self.say(f"building the tiny tokenizer in {model.model_dir}")
        tokenizer, model_cfg = model.build(self.job.seed)
        if model.checkpoint:  # a Hugging Face checkpoint: the cells load it, its tokenizer serves
            self.say(f"model: {model_cfg.family} checkpoint {tokenizer} ({model_cfg.dtype})")
        return tokenizer, model_cfg

    def _tasks(self):
        placed = self.job.cluster is not None
        for line in self.layout.describe(self.cfg.K, placed=placed) if self.layout is not None else ():
            self.say(line)
        tasks, adapter = self.job.tasks.build(self.job.seed), self.job.harness.build()
        if isinstance(tasks, TaskSet):  # each execution's process builds its task's workspace first
            adapter = tasks.harness(adapter)
            self.say(f"task set {self.job.tasks.path}: {len(tasks.specs)} tasks, evaluator {self.job.tasks.evaluator}, "
                     f"harness {adapter.name}")
        return tasks, adapter

    def _start_plane(self, model_cfg) -> tuple[TrainingPlane, EngineManager]:
        from gyre.real.runtime.resume import PLANE_DIR, running_attempt
        from gyre.real.train.plane import PlaneConfig, TrainingPlane
        from gyre.real.train.state import OptimConfig

        job, cfg, tp = self.job, self.cfg, self.job.cell_tp()
        plane_cfg = PlaneConfig(cells=cfg.K, model=model_cfg, optim=OptimConfig(lr=job.training.lr), timeout_s=300.0,
                                device=job.layout.device, tp=tp, pp=self.layout.pipeline_parallel if self.layout else 1,
                                attempt=running_attempt(self.resume))
        plane = self.plane = TrainingPlane(plane_cfg, self.work / PLANE_DIR)
        engines = self.engines = EngineManager(self.work / "engine-logs")
        if job.cluster is not None:  # one placement group per cell on the Ray cluster (real.cluster)
            from gyre.real.cluster.placement import Placement

            cluster = job.cluster
            self.say(f"placing {cfg.K} cells on the Ray cluster at {cluster.address}")
            by_cell: dict[Hashable, str] = dict(self.names.items())  # Placement.open: keys of any hashable type
            gpus = self.layout.gpus_per_cell if self.layout is not None else 0  # a CUDA job's cells hold their GPUs
            placement = self.placement = Placement(cluster, progress=self.say).open(cells=cfg.K, tp=tp,
                                                                                    engines=by_cell, gpus=gpus)
            plane.launcher = placement
            engines.launcher = self._node_engines(placement)
        else:  # alone: the engines are the supervisor's, they outlive this process (supervisor.engines)
            from gyre.real.supervisor.engines import SupervisedEngines

            engines.launcher = SupervisedEngines(self._client())
        self.say(f"schedule {job.schedule.preset}: K={cfg.K} cells, C_s={cfg.C_s}, phi={cfg.phi}, mu={cfg.mu}, "
                 f"{cfg.granularity} transitions, streaming {'on' if cfg.streaming else 'off'}")
        self.say(f"starting {cfg.K} training cells of {tp} rank{'s' if tp > 1 else ''} each (Megatron-core, "
                 f"{job.layout.device})")
        plane.start()
        self.cells = [plane.call(c, "info") for c in range(cfg.K)]  # each cell's leader: role, tp, pid
        (self.work / "cells.json").write_text(json.dumps({str(c): i for c, i in enumerate(self.cells)}, default=str))
        return plane, engines

    def _node_engines(self, placement: Placement):
        """The engines' launcher on a cluster: the supervisors of the nodes that host an engine, opened (on a
        resume: found again, with the live ones of every node the killed attempt used)."""
        from gyre.real.cluster.node_engines import NodeEngines
        from gyre.real.cluster.node_supervisor import recorded_nodes

        grace_s = self.job.harness.supervisor_grace_s
        nodes = list(dict.fromkeys(g.node_id for g in placement.engine_groups.values()))
        supervisors = placement.open_supervisors(self.work, grace_s, nodes=nodes,
                                                 known=recorded_nodes(self.work) if self.resume is not None else [])
        self.say(f"node supervisors on {len(supervisors.live())} node(s) run the engines (they stop them "
                 f"{grace_s:g} s after this process stops renewing their leases)")
        return NodeEngines(placement, supervisors)

    def _start_engines(self, plane: TrainingPlane, engines: EngineManager, tokenizer: Path) -> Path:
        """One SGLang engine per rollout cell (and the separate pool), serving the plane's version-0 weights."""
        model = self.work / "engine-model"  # a resumed run's engines start from it (runtime.restore loads the newest)
        if self.resume is None or not model.is_dir():
            model = _initial_model(plane, tokenizer, self.work)
        for cell in range(self.cfg.static_train_cells):
            plane.send(cell, "enter_training").result()
        ports = self._adoptable_proxy_ports()  # a resumed run's engines come back where the proxy waits for them
        adopted = []
        for cell, name in self.names.items():
            host, free = self.placement.engine_endpoint(name) if self.placement is not None else (HOST, 0)
            port = ports.get(name) or free or free_port()
            extra = SMALL_ENGINE if self.layout is None else self.layout.engine_args(
                cell, placed=self.placement is not None)
            spec = EngineSpec(engine_id=name, model_path=str(model), port=port, host=host, cpu=self.layout is None,
                              extra_args=extra)
            if self.resume is not None and self._adopt(engines, spec):
                adopted.append(name)
            else:
                engines.launch(spec)
        self.say(f"starting {len(self.names) - len(adopted)} SGLang engines "
                 f"({', '.join(n for n in self.names.values() if n not in adopted) or 'none'})")
        for name in self.names.values():
            if name not in adopted:
                engines.wait_healthy(name, timeout=300)
        if adopted and self.resume is not None and self.resume.published_folder() is None:
            for name in adopted:  # restore_parts loads a published version into every engine; version 0 is this
                engines.update_weights_from_disk(name, model, weight_version="0")
        return model

    def _adopt(self, engines: EngineManager, spec: EngineSpec) -> bool:
        """Whether the engine a killed attempt left under the supervisor serves ``spec`` for this run (its weights
        are loaded later, never assumed); one that cannot is stopped and launched afresh."""
        engine, why = engines.adopt(spec, timeout=300)  # as a launch: it may still be loading its model
        self.adoptions[spec.engine_id] = why
        if engine is not None or why != "not running":
            self.say(f"engine {spec.engine_id}: {why}")
        return engine is not None

    def _client(self) -> SupervisorClient:
        if self.supervisor is None:
            raise RuntimeError("JobParts: the supervisor starts before the proxy and the harnesses")
        return self.supervisor

    def _adoptable_proxy_ports(self) -> dict[str, int]:
        """The engine ports of the proxy a killed attempt left running under the supervisor (a resume
        adopts it); empty when there is none to adopt."""
        from gyre.real.supervisor.services import PROXY_KEY, proxy_engine_ports, running

        if self.resume is None or self.supervisor is None or not (self.work / "proxy" / "proxy.json").is_file() \
                or running(self.supervisor, PROXY_KEY) is None:
            return {}
        return proxy_engine_ports(self.work / "proxy")

    def _start_proxy(self, engines: EngineManager, model: Path) -> ProxyProcess:
        from gyre.real.proxy.config import EngineSpec as ProxyEngine
        from gyre.real.proxy.config import Limits, ProxyConfig, RetryPolicy, config_from_mapping
        from gyre.real.supervisor.services import SupervisedProxy

        if self._adoptable_proxy_ports():  # its harnesses' calls wait in it: same port, keys and records
            config = config_from_mapping(json.loads((self.work / "proxy" / "proxy.json").read_text()))
            adopted = self.proxy = SupervisedProxy(config, self.work / "proxy", self._client(),
                                                   progress=self.say).adopt()
            self.proxy_url = f"http://127.0.0.1:{config.port}"
            self.say(f"proxy {adopted.pid} adopted from the supervisor on {self.proxy_url}")
            return adopted

        config = ProxyConfig(model_path=str(model), records_dir=str(self.work / "records"), admin_token=ADMIN_TOKEN,
                             engines=tuple(ProxyEngine(id=n, url=engines.engines[n].url)
                                           for n in self.names.values()),
                             port=free_port(), fsync=False, limits=Limits(default_max_tokens=self.job.proxy.max_tokens),
                             retry=RetryPolicy(hold_s=ENGINE_HOLD_S))
        proxy = self.proxy = SupervisedProxy(config, self.work / "proxy", self._client(), progress=self.say).start()
        self.proxy_url = f"http://127.0.0.1:{config.port}"
        return proxy

    def _wire(self, tasks, adapter, watch: Callable[[dict], None] | None, plane: TrainingPlane,
              engines: EngineManager, engine_watch: EngineWatch, proxy: ProxyProcess) -> Wired:
        """Harness runner, backend, controller, live metrics and resume wiring, each given what it needs."""
        from gyre.real.runtime.restore import ResumeWiring, controller_parts

        job, work, cfg = self.job, self.work, self.cfg
        runner = HarnessRunner(work / "executions", self.proxy_url, adapter,
                               job.harness.budgets(), isolate=job.harness.isolate,
                               hide=[work / "records", work / "records" / "keys.json",  # records, key digests
                                     work / "attempts",  # and what a resume moved aside (runtime.resume)
                                     work / "proxy",  # the proxy's config holds the admin token
                                     work / "supervisor"],  # its port and token
                               supervisor=self.supervisor)
        parts = Parts(proxy_url=self.proxy_url, admin_token=ADMIN_TOKEN, engines=engines,
                      engine_names=self.names, plane=plane, runner=runner, records_dir=work / "records",
                      checkpoint_dir=work / "checkpoints", task=tasks, watch=engine_watch,
                      publication=job.layout.publication_route(),
                      engine_tp=self.layout.engine_tensor_parallel if self.layout is not None else 1)
        backend = RealBackend(cfg, parts, seed=job.seed, token_budget=job.training.token_budget, progress=self.say,
                              steps=job.steps)
        engine_watch.serve(backend)  # from here on a dead engine comes back with the newest weights
        if getattr(proxy, "adopted", False):  # what the killed attempt left in it: every engine serving again
            for name in self.names.values():
                backend.proxy.call_blocking("POST", f"/admin/engines/{name}/undrain")
                backend.proxy.call_blocking("POST", f"/admin/engines/{name}/release")
        controller = Controller(cfg, backend, **controller_parts(self.resume, work / "log"))
        backend.bind(controller)
        redone = None if self.resume is None else self.resume.version + 1  # the first redone step
        live = LiveMetrics(cfg, work, self.names, log=self.say, watch=watch, wandb=job.metrics.wandb,
                           purge_step=redone).bind(controller, backend)
        backend.set_hooks(on_step=live.on_step_off_loop)  # metrics.jsonl + tb/, one record per step
        wiring = ResumeWiring(self.resume, controller, backend, work=work, tp=job.cell_tp(), seed=job.seed)
        return Wired(plane=plane, watch=engine_watch, proxy=proxy, backend=backend, controller=controller,
                     live=live, wiring=wiring)

    # ---- run -----------------------------------------------------------------------------
    def run(self) -> Path:
        """Run the controller to the last step; the event log's folder."""
        wired = self.wired()

        async def main() -> None:
            supervising = asyncio.ensure_future(wired.watch.supervise())
            proxy_watch = asyncio.ensure_future(wired.proxy.supervise(on_restart=wired.backend.reapply_proxy_state))
            try:
                await _run_until_failure(wired.controller, wired.backend, wired.plane, self.job, wired.wiring)
            finally:
                wired.watch.stop()  # the run is over: nothing waits for an engine still coming back
                supervising.cancel()
                proxy_watch.cancel()
                await wired.backend.stop()

        t_run = time.monotonic()
        try:
            asyncio.run(main())
        finally:
            wired.live.close()
            log_dir = wired.controller.write_log(self.work / "log")
        self.timings["run_s"] = time.monotonic() - t_run
        return log_dir

    # ---- close ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop what was started, in reverse order; release the folder's lock. The supervisor first, with the
        harnesses it owns, unless ``keep_supervisor`` (a failed run: a resume attaches to them; its lease,
        no longer renewed, bounds how long they wait for one)."""
        if self.lease is not None:
            self.lease.stop()
        if self.proxy is not None:  # first: the supervisor's stop ends the proxy, and that is no crash to restart
            self.proxy.detach()  # kept with a kept supervisor: the harnesses' calls wait in it for a resume
        if self.supervisor is not None and not self.keep_supervisor:
            self.supervisor.stop()
        if self.proxy is not None and not self.keep_supervisor:
            self.proxy.stop()
        if self.engines is not None and self.keep_supervisor:
            self.engines.detach_all()  # kept with the supervisor: a resume adopts them, loaded weights and all
        if self.watch is not None:
            self.watch.close()  # restarts nothing more; stops every engine, then the thread that launched restarts
        if self.engines is not None:
            self.engines.shutdown_all()
        if self.plane is not None:
            self.plane.close()
        if self.placement is not None:
            # the node supervisors (with the engines, unless kept), what the node agents still run, the agents
            self.placement.close(keep_supervisors=self.keep_supervisor)
        if self.lock is not None:
            os.close(self.lock)


async def _run_until_failure(controller, backend, plane, job, wiring) -> None:
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
        supervisor = getattr(backend.parts.runner, "supervisor", None)
        if supervisor is not None and SupervisorClient.find(supervisor.folder) is None:
            if hasattr(backend.proxy.transport, "wait_s"):  # its proxy died with it: no admin call waits for it
                backend.proxy.transport.wait_s = 0.0
            raise SupervisorLost(f"the supervisor {supervisor.pid} of {supervisor.folder} died: {exc}") from exc
        if plane.crashes:
            dead = ", ".join(f"cell {c} (exit code {code})" for c, code in sorted(plane.crashes.items()))
            raise CellFailed(f"training {dead} died: {exc}") from exc
        raise


def stop_stale_supervisor(work: Path, cluster: bool = False) -> None:
    """Stop a supervisor a killed run left on ``work`` (with its harnesses; with ``cluster``, its node
    supervisors too) before a fresh run wipes it; ResumeError, touching nothing, when a live job holds the
    folder."""
    from gyre.real.runtime.resume import refuse_if_held
    from gyre.real.supervisor.client import SUPERVISOR_DIR

    if not (work / SUPERVISOR_DIR).is_dir():
        return
    refuse_if_held(work)
    stale = SupervisorClient.find(work / SUPERVISOR_DIR)
    if stale is not None:
        stale.stop()
    if cluster:
        from gyre.real.cluster.node_supervisor import stop_on_cluster

        stop_on_cluster(work)


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
