"""One cell's training state: model, flat weights, gradient accumulator, and the core's optimizer.

Gradient accumulation with frozen weights (docs/streaming.md#joining-a-step): between two updates
the weights do not change, so every micro-step's gradient is taken at the same
point whichever cell computes it. ``accumulate`` computes one micro-step's
gradient in a zeroed float32 buffer and adds it to ``acc``, kept in
``accumulate_dtype`` (float64 by default).

Why float64: the step's gradient is the sum of per-micro-step gradients, and a
satellite joining mid-step changes only how that sum is split over cells and
in what order it is added. Each term is a float32 value, so a float64 sum
differs between splits by a few float64 ulps at most, far below float32's
resolution; rounding it to float32 gives the same gradient, and so the same
update, for every split (except in the vanishingly rare case that a sum lands
on a float32 rounding boundary). Float32 accumulation would differ in the last
float32 bits and the weights would drift apart after the first update.

Only the core (cell 0) has an optimizer (one per rank: each TP rank updates its
shard; Adam is elementwise). ``apply_update`` rounds the reduced sum to float32,
clips its global norm (over the whole model: with TP > 1 the
shards' squared norms are summed over the TP group, replicated parameters
counted once), and takes one optimizer step; a bfloat16 model steps float32
master weights and takes them rounded (``train.precision``). The loss already divides by the batch's B*N raw executions
(docs/trajectories.md#execution-level-loss, ``gyre.real.train.loss``), so the reduced sum is the batch gradient;
the core checks that every micro-step of the batch carried the same B*N.

``offload``/``restore``: leaving training frees gradients and the accumulator
and moves weights, masters and optimizer state to host memory (a no-op move on
CPU); entering brings them back to ``device``, the training device recorded
when the state is built, never to wherever the tensors happen to sit (after an
offload that is the host). Processes and communication groups are untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gyre.real.train.model import FlatParameters, LossConfig, microstep_loss, microstep_tensors
from gyre.real.train.precision import make_updater
from gyre.trajectory.packing import MicroStep


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 1e-6  # docs/trajectories.md#execution-level-loss: Adam, constant lr 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    accumulate_dtype: str = "float64"


@dataclass(frozen=True)
class MicroStepResult:
    name: str
    loss: float
    nll: float
    targets: int
    batch_executions: int
    clip_fraction: float
    seconds: float = 0.0  # forward + backward + accumulation, measured by the cell (gyre calibrate)


@dataclass(frozen=True)
class UpdateStats:
    grad_norm: float  # before clipping
    clipped: bool


class TrainingState:
    def __init__(self, model, flat: FlatParameters, optim: OptimConfig, loss: LossConfig, *, owns_optimizer: bool,
                 tp_group=None, device: torch.device | str | None = None,
                 place_weights: Callable[[torch.Tensor, torch.device], torch.Tensor] | None = None):
        self.model = model
        # How restore moves the weights to ``device`` (``place``); a test may observe the move instead.
        self.place_weights = place_weights if place_weights is not None else place
        # The device this state trains on; offload/restore round-trip to it (default: where the weights are now).
        self.device = torch.device(device) if device is not None else flat.data.device
        self.tp_group = tp_group if tp_group is not None and dist.get_world_size(tp_group) > 1 else None
        # Elements this rank counts in the global gradient norm: its shards, and replicated
        # parameters on TP rank 0 only (every TP rank holds the same replicated gradient).
        self._norm_spans = _norm_spans(flat, self.tp_group) if self.tp_group is not None else None
        self.flat = flat
        self.optim_cfg = optim
        self.loss_cfg = loss
        self.acc_dtype = getattr(torch, optim.accumulate_dtype)
        self.acc: torch.Tensor | None = None
        self.resident = False
        self.restore_weights()
        self.updater = make_updater(flat, optim, self.device, self._clip) if owns_optimizer else None
        self.restore()

    @property
    def optimizer(self):
        """The torch optimizer the core steps (Adam over the parameters or their float32 masters); None on a
        satellite."""
        return self.updater.optimizer if self.updater is not None else None

    def masters(self) -> torch.Tensor:
        """The float32 weights the optimizer steps (the model buffer itself for a float32 model)."""
        masters = getattr(self.updater, "masters", None)
        return masters if masters is not None else self.flat.data

    # -- accumulation (weights frozen) ------------------------------------------------------------
    def accumulate(self, step: MicroStep) -> MicroStepResult:
        """Add one micro-step's gradient to ``acc``; the weights are not touched."""
        self._require_resident()
        started = time.perf_counter()
        batch = microstep_tensors(step, self.device)
        self.flat.grad.zero_()
        loss, stats, nll = microstep_loss(self.model, batch, self.loss_cfg)
        loss.backward()
        self.acc.add_(self.flat.grad)
        return MicroStepResult(step.name, float(loss.detach()), nll, int(batch.target_mask.sum()),
                               step.batch_executions, stats.clip_fraction, time.perf_counter() - started)

    def discard(self) -> None:
        if self.acc is not None:
            self.acc.zero_()

    def reduce_to_core(self, group, dst: int = 0) -> None:
        """Sum ``acc`` over ``group`` into global rank ``dst``'s ``acc`` (the core's rank of this shard;
        no-op for the core alone)."""
        if group is not None:
            dist.reduce(self.acc, dst=dst, op=dist.ReduceOp.SUM, group=group)

    # -- the core's update ------------------------------------------------------------------------
    def apply_update(self) -> UpdateStats:
        if self.updater is None:
            raise RuntimeError("only the core cell owns an optimizer")
        self._require_resident()
        norm = self.updater.step(self.acc)  # the float64 sum rounded once to float32
        self.acc.zero_()
        return UpdateStats(float(norm), bool(norm > self.optim_cfg.max_grad_norm))

    def _clip(self, params: list[torch.Tensor], grad: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return torch.nn.utils.clip_grad_norm_(params, self.optim_cfg.max_grad_norm)
        return self._clip_sharded(grad)

    def _clip_sharded(self, grad: torch.Tensor) -> torch.Tensor:
        """``clip_grad_norm_`` over the whole model when this rank holds one TP shard of it: the squared
        norms of the shards (replicated parameters once) are summed over the TP group, in float64."""
        local = sum((grad[a:b].double().square().sum() for a, b in self._norm_spans),
                    torch.zeros((), dtype=torch.float64, device=grad.device))
        dist.all_reduce(local, group=self.tp_group)
        norm = local.sqrt()
        coef = self.optim_cfg.max_grad_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            grad.mul_(coef)
        return norm

    def load_weights(self, weights: torch.Tensor, *, reset_optimizer: bool = True) -> None:
        self.flat.data.copy_(weights.to(self.flat.data.device, self.flat.dtype))
        if reset_optimizer and self.updater is not None:
            self.updater.reset()
        self.discard()

    # -- resume checkpoints (train.checkpoint) ----------------------------------------------------
    def optimizer_state_dict(self) -> dict | None:
        """Adam state and float32 masters on the host, resident or offloaded (None: a satellite)."""
        return self.updater.state_dict() if self.updater is not None else None

    def load_optimizer_state(self, saved: dict | None) -> None:
        """Take ``saved`` (``optimizer_state_dict``) as the optimizer state; offloaded, it waits on the host."""
        if self.updater is not None and saved is not None:
            self.updater.load_state_dict(saved, self.resident)

    # -- role changes -----------------------------------------------------------------------------
    def offload(self) -> None:
        """Leave training: free grads and accumulator, move weights and optimizer state to host."""
        if not self.resident:
            return
        self.flat.release_grads()
        self.acc = None
        if self.updater is not None:
            self.updater.offload()
        if self.flat.data.device.type != "cpu":
            self.flat.rebind(host_copy(self.flat.data))
        self.resident = False

    def restore(self) -> None:
        """Enter training: weights back on ``self.device``, zeroed grads and accumulator, optimizer state."""
        if self.resident:
            return
        self.restore_weights()
        self.flat.attach_grads()
        self.acc = torch.zeros(self.flat.numel, dtype=self.acc_dtype, device=self.device)
        if self.updater is not None:
            self.updater.restore(self.device)
        self.resident = True

    def restore_weights(self) -> None:
        """The model buffer onto the training device (wherever it sits now)."""
        if self.flat.data.device != self.device:
            self.flat.rebind(self.place_weights(self.flat.data, self.device))

    def resident_bytes(self) -> int:
        """Bytes of training-only buffers held now (grads, accumulator, masters, optimizer state)."""
        total = sum(t.numel() * t.element_size() for t in (self.flat.grad, self.acc) if t is not None)
        return total + (self.updater.resident_bytes() if self.resident and self.updater is not None else 0)

    def _require_resident(self) -> None:
        if not self.resident:
            raise RuntimeError("training state is offloaded: restore() it before training")


def _norm_spans(flat: FlatParameters, tp_group) -> list[tuple[int, int]]:
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    return [(a, b) for p, a, b in zip(flat.params, flat.offsets, flat.offsets[1:])
            if param_is_not_tensor_parallel_duplicate(p, tp_group)]


def place(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on the training device ``device`` (the one move ``restore`` makes)."""
    return tensor.to(device)


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in host memory (pinned when CUDA is there, for fast copies back)."""
    host = tensor.to("cpu")
    return host.pin_memory() if torch.cuda.is_available() else host
