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
shard; Adam is elementwise). ``apply_update`` rounds the reduced sum to the
parameter dtype, clips its global norm (over the whole model: with TP > 1 the
shards' squared norms are summed over the TP group, replicated parameters
counted once), and takes one torch optimizer step. The loss already divides by the batch's B*N raw executions
(docs/trajectories.md#execution-level-loss, ``gyre.real.train.loss``), so the reduced sum is the batch gradient;
the core checks that every micro-step of the batch carried the same B*N.

``offload``/``restore``: leaving training frees gradients and the accumulator
and moves weights and optimizer state to host memory (a no-op move on CPU);
entering brings them back. Processes and communication groups are untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gyre.real.train.model import FlatParameters, LossConfig, microstep_loss, microstep_tensors
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
                 tp_group=None):
        self.model = model
        self.tp_group = tp_group if tp_group is not None and dist.get_world_size(tp_group) > 1 else None
        # Elements this rank counts in the global gradient norm: its shards, and replicated
        # parameters on TP rank 0 only (every TP rank holds the same replicated gradient).
        self._norm_spans = _norm_spans(flat, self.tp_group) if self.tp_group is not None else None
        self.flat = flat
        self.optim_cfg = optim
        self.loss_cfg = loss
        self.acc_dtype = getattr(torch, optim.accumulate_dtype)
        self.acc: torch.Tensor | None = None
        self.optimizer = self._new_optimizer() if owns_optimizer else None
        self._host_optimizer_state: dict | None = None
        self.resident = False
        self.restore()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        o = self.optim_cfg
        return torch.optim.Adam(self.flat.params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)

    # -- accumulation (weights frozen) ------------------------------------------------------------
    def accumulate(self, step: MicroStep) -> MicroStepResult:
        """Add one micro-step's gradient to ``acc``; the weights are not touched."""
        self._require_resident()
        started = time.perf_counter()
        batch = microstep_tensors(step, self.flat.data.device)
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
        if self.optimizer is None:
            raise RuntimeError("only the core cell owns an optimizer")
        self._require_resident()
        self.flat.grad.copy_(self.acc)  # round the float64 sum to the parameter dtype
        if self.tp_group is None:
            norm = torch.nn.utils.clip_grad_norm_(self.flat.params, self.optim_cfg.max_grad_norm)
        else:
            norm = self._clip_sharded()
        self.optimizer.step()
        self.acc.zero_()
        return UpdateStats(float(norm), bool(norm > self.optim_cfg.max_grad_norm))

    def _clip_sharded(self) -> torch.Tensor:
        """``clip_grad_norm_`` over the whole model when this rank holds one TP shard of it: the squared
        norms of the shards (replicated parameters once) are summed over the TP group, in float64."""
        grad = self.flat.grad
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
        if reset_optimizer and self.optimizer is not None:
            self.optimizer = self._new_optimizer()
            self._host_optimizer_state = None
        self.discard()

    # -- resume checkpoints (train.checkpoint) ----------------------------------------------------
    def optimizer_state_dict(self) -> dict | None:
        """The Adam state on the host, resident or offloaded (None: a satellite owns no optimizer)."""
        if self.optimizer is None:
            return None
        if not self.resident and self._host_optimizer_state is not None:
            return self._host_optimizer_state
        return _to_device(self.optimizer.state_dict(), torch.device("cpu"))

    def load_optimizer_state(self, saved: dict | None) -> None:
        """Take ``saved`` (``optimizer_state_dict``) as the Adam state; offloaded, it waits on the host."""
        if self.optimizer is None or saved is None:
            return
        if self.resident:
            self.optimizer.load_state_dict(_to_device(saved, self.flat.data.device))
        else:
            self._host_optimizer_state = saved

    # -- role changes -----------------------------------------------------------------------------
    def offload(self) -> None:
        """Leave training: free grads and accumulator, move weights and optimizer state to host."""
        if not self.resident:
            return
        self.flat.release_grads()
        self.acc = None
        if self.flat.data.device.type != "cpu":
            self.flat.rebind(self.flat.data.to("cpu", non_blocking=False).pin_memory())
        if self.optimizer is not None:
            self._host_optimizer_state = _to_device(self.optimizer.state_dict(), torch.device("cpu"))
            self.optimizer.state.clear()
        self.resident = False

    def restore(self, device: torch.device | None = None) -> None:
        """Enter training: weights back on ``device``, zeroed grads and accumulator, optimizer state."""
        if self.resident:
            return
        device = device or self.flat.params[0].device
        if self.flat.data.device != device:
            self.flat.rebind(self.flat.data.to(device))
        self.flat.attach_grads()
        self.acc = torch.zeros(self.flat.numel, dtype=self.acc_dtype, device=device)
        if self.optimizer is not None and self._host_optimizer_state is not None:
            self.optimizer.load_state_dict(_to_device(self._host_optimizer_state, device))
            self._host_optimizer_state = None
        self.resident = True

    def resident_bytes(self) -> int:
        """Bytes of training-only buffers held now (grads, accumulator, optimizer state)."""
        total = 0
        for t in (self.flat.grad, self.acc):
            total += t.numel() * t.element_size() if t is not None else 0
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
        return total

    def _require_resident(self) -> None:
        if not self.resident:
            raise RuntimeError("training state is offloaded: restore() it before training")


def _norm_spans(flat: FlatParameters, tp_group) -> list[tuple[int, int]]:
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    return [(a, b) for p, a, b in zip(flat.params, flat.offsets, flat.offsets[1:])
            if param_is_not_tensor_parallel_duplicate(p, tp_group)]


def _to_device(obj, device: torch.device):
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_device(v, device) for v in obj]
    return obj
