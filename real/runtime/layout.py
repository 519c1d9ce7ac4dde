"""Where a CUDA job's cells and engines sit on its GPU nodes: the ``[job.layout]`` table.

A job on ``device = "cuda"`` has ``nodes`` cells (Gyre's cells: each one a
training cell and, when it serves rollouts, one SGLang engine on the same
GPUs). ``GpuLayout`` gives each cell ``tensor_parallel x pipeline_parallel``
consecutive GPUs of the node (cell ``c`` trains on ``cuda:c`` when it
has one GPU: ``train.cpu_compat.prepare_device``), and its engine the cell's GPUs with
``--tp-size engine_tensor_parallel`` (one engine per cell: the backend routes
an execution to its cell's engine). How new weights reach the engines is the
job's ``publication`` (``PUBLICATIONS``; ``runtime.job_config.LayoutSection``), not a ``GpuLayout`` field.

On one node (no ``[cluster]``) the cells fill at most ``gpus_per_node`` GPUs. On a
Ray cluster (``placed``) each cell is one placement group holding its GPUs on one
node (``cluster.placement``), its node agent makes exactly those GPUs visible
(``CUDA_VISIBLE_DEVICES``), so the cell sees them as 0 .. gpus_per_cell - 1 and rank r
selects ``cuda:r`` (``train.context.CellConfig.local_gpu``), its engine ``--base-gpu-id 0``;
the cells may then need more GPUs than one node has. A cell of ``nodes_per_cell`` > 1
whole nodes (the paper's cells of 48 nodes) is planned, one line per node, its TP groups
as data-parallel replicas with an engine each, but not run (``runnable_problem``).

Invariants (``check``): every count is a positive integer; a cell fits a node; unplaced, the
cells fill at most ``gpus_per_node`` GPUs, no GPU holds two cells; an engine's tensor-parallel size equals its
cell's GPU count; ``runnable_problem`` names what this build cannot start
(pipeline-parallel cells: a cell's step runs forward/backward per micro-step,
not Megatron's pipeline schedule, which needs CUDA even to allocate; see
``train.context.CellConfig``) so a run refuses before anything starts, while the
layout itself still loads. Tensor-parallel cells run: rank r of cell c is one
process on GPU ``c * tensor_parallel + r`` (``cell_gpus(c)[r]``), the cell's
``train.ranks`` leader answering for it.

Memory: engines start with SGLang's memory saver (``--enable-memory-saver``;
without it ``/release_memory_occupation`` keeps the memory) unless
``memory_saver = false``; ``memory_plan`` adds up each GPU's training and
rollout footprint for a model on ``gpu_memory_gib`` GPUs (``train.memory_plan``),
and ``preflight`` refuses, in one line with the numbers, a job whose plan does
not fit or whose device this machine lacks, before anything starts (docs/gpu.md,
"Memory plan"). Pure except ``preflight``'s device check: no CUDA call here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from gyre.real.runtime.tables import from_table

PUBLICATIONS = ("auto", "disk", "memory")  # JobConfig.publication: auto = memory on cuda, disk on cpu


@dataclass(frozen=True, kw_only=True)
class GpuLayout:
    gpus_per_node: int = 8
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    engine_tensor_parallel: int = 1
    engine_mem_fraction: float = 0.3  # SGLang --mem-fraction-static: the rest stays for the training cell
    gpu_memory_gib: float = 80.0  # memory of one GPU, for the memory plan
    memory_saver: bool = True  # engines start with --enable-memory-saver (release frees their memory)
    nodes_per_cell: int = 1  # > 1: a cell of whole nodes, TP groups as data-parallel replicas (planned, not run)

    @property
    def gpus_per_cell(self) -> int:
        """The GPUs of one model replica (a TP x PP group); a single-node cell is one replica."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def data_parallel(self) -> int:
        """Model replicas per cell: 1, or for a cell of whole nodes every replica on its GPUs."""
        return 1 if self.nodes_per_cell == 1 else self.nodes_per_cell * self.gpus_per_node // self.gpus_per_cell

    def check(self, cells: int, *, placed: bool = False) -> None:
        """ValueError naming the first impossible field; ``placed``: each cell gets its own node's GPUs from
        a Ray cluster (``[cluster]``), so only one cell has to fit a node, not all of them together."""
        for name in ("gpus_per_node", "tensor_parallel", "pipeline_parallel", "engine_tensor_parallel",
                     "nodes_per_cell"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"layout.{name} must be a positive integer, not {value!r}")
        if not isinstance(self.gpu_memory_gib, (int, float)) or self.gpu_memory_gib <= 0:
            raise ValueError(f"layout.gpu_memory_gib must be a positive number, not {self.gpu_memory_gib!r}")
        if not 0 < self.engine_mem_fraction < 1:
            raise ValueError(f"layout.engine_mem_fraction must be in (0, 1), not {self.engine_mem_fraction!r}")
        if self.gpus_per_cell > self.gpus_per_node:
            raise ValueError(f"a cell of tensor_parallel x pipeline_parallel = {self.gpus_per_cell} GPUs does not "
                             f"fit on a node of {self.gpus_per_node}")
        if self.nodes_per_cell > 1 and self.gpus_per_node % self.gpus_per_cell:
            raise ValueError(f"a cell of {self.nodes_per_cell} nodes takes them whole: its replicas of "
                             f"{self.gpus_per_cell} GPUs must divide a node's {self.gpus_per_node}")
        if not placed and self.nodes_per_cell == 1 and cells * self.gpus_per_cell > self.gpus_per_node:
            raise ValueError(f"{cells} cells x {self.gpus_per_cell} GPUs = {cells * self.gpus_per_cell} GPUs, more "
                             f"than layout.gpus_per_node = {self.gpus_per_node} (a [cluster] table spreads cells "
                             f"over several nodes)")
        if self.engine_tensor_parallel != self.gpus_per_cell:
            raise ValueError(f"layout.engine_tensor_parallel = {self.engine_tensor_parallel} must equal the cell's "
                             f"{self.gpus_per_cell} GPUs (one engine per cell)")

    def cell_gpus(self, cell: int, *, placed: bool = False) -> list[int]:
        """The CUDA device indices cell ``cell`` sees on its node: a block of the one node's GPUs, or, when
        placed on a Ray cluster, 0 .. gpus_per_cell - 1 of the GPUs its node agent made visible."""
        first = 0 if placed else cell * self.gpus_per_cell
        return list(range(first, first + self.gpus_per_cell))

    def engine_args(self, cell: int, *, placed: bool = False) -> tuple[str, ...]:
        """SGLang arguments that put cell ``cell``'s engine on its GPUs."""
        return ("--tp-size", str(self.engine_tensor_parallel), "--base-gpu-id",
                str(self.cell_gpus(cell, placed=placed)[0]),
                "--mem-fraction-static", str(self.engine_mem_fraction), "--skip-server-warmup",
                *(("--enable-memory-saver",) if self.memory_saver else ()))

    def memory_plan(self, model, tokens: int):
        """Per-GPU memory of a cell training ``model`` on micro-steps of ``tokens`` tokens (``train.memory_plan``)."""
        from gyre.real.train.memory_plan import plan_memory

        return plan_memory(model, tp=self.tensor_parallel, engine_tp=self.engine_tensor_parallel,
                           engine_fraction=self.engine_mem_fraction, gpu_gib=float(self.gpu_memory_gib),
                           tokens=tokens, memory_saver=self.memory_saver)

    def runnable_problem(self) -> str | None:
        """None when this build can start the layout; else why not (pipeline-parallel or multi-node cells)."""
        if self.nodes_per_cell > 1:
            return (f"nodes_per_cell = {self.nodes_per_cell}: a cell of several nodes is planned (gyre run "
                    f"--dry-run) but not run: a cell's ranks form one tensor-parallel group with one engine, "
                    f"without data parallelism inside a cell; use single-node cells and more of them")
        if self.pipeline_parallel > 1:
            return (f"pipeline_parallel = {self.pipeline_parallel}: pipeline-parallel cells are not supported (a "
                    f"cell's step runs forward/backward per micro-step, not Megatron's pipeline schedule, which "
                    f"allocates with device='cuda' even on CPU); use pipeline_parallel = 1 and spread a cell "
                    f"over tensor_parallel GPUs instead")
        return None

    def describe(self, cells: int, *, placed: bool = False) -> list[str]:
        """One line per cell: its GPUs and its engine."""
        where = " of its node" if placed else ""
        return [f"cell {c}: GPUs {self.cell_gpus(c, placed=placed)}{where} (TP {self.tensor_parallel} x PP "
                f"{self.pipeline_parallel}), engine e{c} TP {self.engine_tensor_parallel}" for c in range(cells)]


    def node_lines(self, cells: int) -> list[str]:
        """A cell of whole nodes, one line per node: its ranks, their local ranks and its engines."""
        per_node, replicas = self.gpus_per_node, self.gpus_per_node // self.gpus_per_cell
        lines = [f"{cells} cells x {self.nodes_per_cell} nodes x {per_node} GPUs = "
                 f"{cells * self.nodes_per_cell * per_node} GPUs; a cell: TP {self.tensor_parallel} x PP "
                 f"{self.pipeline_parallel} x DP {self.data_parallel}, one engine TP {self.engine_tensor_parallel} "
                 f"per replica"]
        for cell in range(cells):
            for node in range(self.nodes_per_cell):
                first = (cell * self.nodes_per_cell + node) * per_node  # global rank of the node's first GPU
                engines = ", ".join(f"e{cell}.{node * replicas + k} on cuda:{k * self.gpus_per_cell}-"
                                    f"{(k + 1) * self.gpus_per_cell - 1}" for k in range(replicas))
                lines.append(f"cell {cell} node {node} (job node {cell * self.nodes_per_cell + node}): ranks "
                             f"{first}-{first + per_node - 1} on cuda:0-{per_node - 1} (LOCAL_RANK 0-{per_node - 1}, "
                             f"CUDA_VISIBLE_DEVICES 0-{per_node - 1}); engines {engines}")
        return lines


def layout_from_table(table: Mapping[str, Any], cells: int, *, placed: bool = False) -> GpuLayout:
    """The ``[job.layout]`` table as a checked ``GpuLayout``; unknown keys are named."""
    layout = from_table(GpuLayout, table, "layout")
    layout.check(cells, placed=placed)
    return layout


def plan_lines(job) -> list[str]:
    """What ``gyre run --dry-run`` prints: each cell's GPUs, each rank's device and collective backend, each
    engine's arguments, and the memory plan (a CPU job: its cells and ranks)."""
    cells = job.scheduler().K
    if job.layout.device != "cuda":
        return [f"device cpu: {cells} cells x {job.cell_tp()} rank(s), gloo; SGLang CPU engines"]
    layout, placed = job.gpu_layout(), job.cluster is not None
    plan = layout.memory_plan(job.model.hf_config(job.seed), job.training.token_budget).lines()
    if layout.nodes_per_cell > 1:
        return layout.node_lines(cells) + plan + [f"not runnable: {layout.runnable_problem()}"]
    lines = layout.describe(cells, placed=placed)
    where = "its node's visible " if placed else ""
    for cell in range(cells):
        gpus = layout.cell_gpus(cell, placed=placed)
        lines.append(f"cell {cell}: ranks on {where}" + ", ".join(f"cuda:{g}" for g in gpus) + " (nccl; gloo on a "
                     f"node without CUDA); engine e{cell}: sglang {' '.join(layout.engine_args(cell, placed=placed))}")
    return lines + plan


def preflight(job, *, device_check: bool = True) -> None:
    """ValueError, one line, when ``job`` (``runtime.job.JobConfig``) cannot start: a CUDA layout whose memory
    plan does not fit, or a CUDA job whose cells would run on this machine and it lacks the GPUs
    (``train.cpu_compat.device_problem``; a Ray-placed job's ranks check on their nodes)."""
    if job.layout.device != "cuda":
        return
    layout = job.gpu_layout()
    problem = layout.memory_plan(job.model.hf_config(job.seed), job.training.token_budget).problem()
    if problem:
        raise ValueError(f"job layout: {problem}; see docs/gpu.md, \"Memory plan\"")
    if device_check and job.cluster is None:
        from gyre.real.train.cpu_compat import device_problem

        problem = device_problem(job.layout.device, layout.gpus_per_cell * job.schedule.nodes)
        if problem:
            raise ValueError(f"job device: {problem}")
