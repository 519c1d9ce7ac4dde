"""Configuration of the training plane and the per-process context every cell builds once.

``CellConfig`` is one frozen, keyword-only dataclass shared by all K cells (the
driver builds it; constructors do no I/O). ``build_context`` runs inside a cell
process and does, in this order (the same order in every rank, because group
creation is collective): select the device (``train.cpu_compat``), connect to
the driver's TCPStore, join the process group, initialise Megatron's parallel
state (TP = ``tp``: the cell's ranks; PP = 1), build the model from the shared seed (then, when the
model config names a Hugging Face ``checkpoint``, load its weights through
``train.bridge``: every cell loads the same folder, so every cell holds the
same weights), flatten its weights, build the prefix groups, start the
weight transport, and create the training state on the selected device (recorded: every later
``restore`` returns there), then offload it (every cell starts in the rollout role).

A cell spans ``tp`` processes (``train.ranks``): rank r of cell c is global
rank c * tp + r in a world of cells * tp ranks.

Processes, the process group and the communication groups live as long as the
cell: role changes only offload and restore the training state.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from gyre.real.train.cpu_compat import DeviceSetup, prepare_device, seed_model_rng
from gyre.real.train.membership import BatchQueues, CommGroups, ControlStore
from gyre.real.train.model import FlatParameters, LossConfig, ModelConfig, build_gpt
from gyre.real.train.ranks import CellRanks
from gyre.real.train.state import OptimConfig, TrainingState
from gyre.real.train.transport import make_transport

FAULT_EXIT_CODE = 17


@dataclass(frozen=True, kw_only=True)
class CellConfig:
    cells: int
    store_port: int
    queue_root: str
    workdir: str
    store_host: str = "127.0.0.1"
    # each cell's node address (its Mooncake endpoint) when cells sit on several machines
    # (``cluster.placement``); empty: every cell is on the store's host
    cell_hosts: tuple[str, ...] = ()
    device: str = "cpu"
    transport: str = "mooncake"  # "mooncake" or "torch" (torch.distributed broadcast fallback)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    threads: int = 1
    timeout_s: float = 60.0
    poll_s: float = 0.002
    record_gradients: bool = False  # keep the last reduced gradient for ``dump`` (tests)
    # Fault injection for tests: (cell, n) = cell exits with FAULT_EXIT_CODE after claiming its
    # n-th micro-step of a step, before computing it.
    crash_after: tuple[tuple[int, int], ...] = ()
    tp: int = 1  # tensor-parallel ranks per cell (one process each)
    pp: int = 1  # pipeline-parallel stages per cell: only 1 (see ``train.ranks``)
    attempt: int = 0  # the job's attempt on its run folder; 0: unfenced (``train.fence``)
    # ranks started by a node agent that shows each rank only its cell's GPUs (``cluster.agent``:
    # CUDA_VISIBLE_DEVICES): rank r uses visible GPU r; else cell c's ranks use GPUs c*tp .. c*tp+tp-1
    placed: bool = False

    def __post_init__(self) -> None:
        if self.cells < 1:
            raise ValueError(f"cells must be >= 1, got {self.cells!r}")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be a positive int, got {self.tp!r}")
        if self.pp != 1:
            raise ValueError(f"pp must be 1, got {self.pp!r}: pipeline-parallel cells are not supported (a step "
                             "runs forward/backward per micro-step, not Megatron's pipeline schedule, and "
                             "megatron-core 0.16.1's schedule allocates with device='cuda' even on CPU)")
        for name, size in (("num_attention_heads", self.model.num_attention_heads),
                           ("num_query_groups", self.model.num_query_groups),
                           ("ffn_hidden_size", self.model.ffn_hidden_size), ("vocab_size", self.model.vocab_size)):
            if size % self.tp:
                raise ValueError(f"model {name} = {size} is not divisible by tp = {self.tp}")
        if self.transport not in ("mooncake", "torch"):
            raise ValueError(f"transport must be 'mooncake' or 'torch', got {self.transport!r}")
        if self.timeout_s <= 0 or self.poll_s <= 0:
            raise ValueError("timeout_s and poll_s must be positive")
        if self.cell_hosts and len(self.cell_hosts) != self.cells:
            raise ValueError(f"cell_hosts names {len(self.cell_hosts)} hosts for {self.cells} cells")
        if any(h in ("", "0.0.0.0", "::") for h in (self.store_host, *self.cell_hosts)):
            raise ValueError(f"store_host and cell_hosts must be concrete addresses, not {self.store_host!r}, "
                             f"{self.cell_hosts!r}")

    def host_of(self, cell: int) -> str:
        """The address cell ``cell``'s Mooncake endpoint listens on: its node's."""
        return self.cell_hosts[cell] if self.cell_hosts else self.store_host

    def local_gpu(self, cell: int, rank: int) -> int:
        """The CUDA device index rank ``rank`` of ``cell`` selects on its node: its rank in the cell when
        placed (the agent made the cell's GPUs visible, in order), else the cell's block of the node's GPUs
        (``runtime.layout.GpuLayout.cell_gpus``). Never the global rank, which runs past a node's GPUs."""
        return rank if self.placed else cell * self.tp + rank

    def crash_point(self, cell: int) -> int | None:
        return dict(self.crash_after).get(cell)


@dataclass
class CellContext:
    cfg: CellConfig
    cell: int
    setup: DeviceSetup
    control: ControlStore
    groups: CommGroups
    transport: object
    state: TrainingState
    queues: BatchQueues
    log: logging.Logger

    rank: int = 0  # rank within the cell (0 = leader)
    ranks: object = None  # ``train.ranks.CellRanks``

    @property
    def worker(self) -> str:
        return f"cell{self.cell}"

    @property
    def global_rank(self) -> int:
        return self.cell * self.cfg.tp + self.rank


def _logger(workdir: Path, cell: int, rank: int = 0) -> logging.Logger:
    suffix = f"cell{cell}" if rank == 0 else f"cell{cell}.rank{rank}"
    log = logging.getLogger(f"gyre.train.{suffix}")
    log.setLevel(logging.INFO)
    handler = logging.FileHandler(workdir / f"{suffix}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


def build_context(cfg: CellConfig, cell: int, rank: int = 0) -> CellContext:
    """Everything rank ``rank`` of a cell needs, built once at process start (module docstring: order)."""
    global_rank = cell * cfg.tp + rank
    setup = prepare_device(cfg.device, local_rank=cfg.local_gpu(cell, rank), threads=cfg.threads)
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    store = dist.TCPStore(cfg.store_host, cfg.store_port, None, False, timeout=timeout)
    dist.init_process_group(setup.backend, store=dist.PrefixStore("gyre-pg", store), rank=global_rank,
                            world_size=cfg.cells * cfg.tp, timeout=timeout)
    from megatron.core import parallel_state

    # Megatron's default order puts TP innermost: its TP groups are the blocks {c*tp .. c*tp+tp-1},
    # i.e. exactly the cells. Its data-parallel groups are not used (the prefix groups are ours).
    parallel_state.initialize_model_parallel(cfg.tp, 1)
    seed_model_rng(cfg.model.init_seed, setup)
    model = build_gpt(cfg.model, setup.device)
    if cfg.model.checkpoint is not None:
        from gyre.real.train.bridge import load_hf_weights

        load_hf_weights(model, cfg.model.checkpoint, cfg.model)
    flat = FlatParameters(model)
    groups = CommGroups(cfg.cells, pair_groups=cfg.transport == "torch", tp=cfg.tp)
    transport = make_transport(cfg.transport, cfg.host_of(cell), setup.mooncake_protocol)
    state = TrainingState(model, flat, cfg.optim, cfg.loss, owns_optimizer=cell == 0, device=setup.device,
                          tp_group=parallel_state.get_tensor_model_parallel_group() if cfg.tp > 1 else None)
    state.offload()
    log = _logger(Path(cfg.workdir), cell, rank)
    log.info("cell %d rank %d up: %d parameters (%d bytes) in this shard, tp %d, transport %s, backend %s",
             cell, rank, flat.numel, flat.nbytes, cfg.tp, cfg.transport, setup.backend)
    ctx = CellContext(cfg, cell, setup, ControlStore(store, cfg.poll_s), groups, transport, state,
                      BatchQueues(cfg.queue_root), log, rank)
    ctx.ranks = CellRanks(ctx)
    return ctx
