"""The core's optimizer step, with float32 master weights whenever the model trains in bfloat16.

The model's flat buffer (``train.model.FlatParameters``) holds the weights in
the model dtype: forward/backward, the snapshot satellites pull, the broadcast
and every publication read it. What the optimizer updates depends on that
dtype and on the device (docs/gpu.md, "Mixed precision"):

- float32 model: the model buffer is its own master; a torch Adam steps the
  parameters directly (``TorchUpdater`` without masters).
- bfloat16 model on CUDA: Megatron-core's mixed-precision optimizer
  ``Float16OptimizerWithFloat16Params`` (``MegatronUpdater``): float32 main
  parameters, float32 main gradients handed to it as ``param.main_grad``, its
  global-norm clip over the tensor-parallel group, its main -> model copy, and
  its ``offload_to_cpu`` / ``restore_from_cpu`` on role changes. It allocates
  with ``device='cuda'`` and accepts only CUDA tensors, so it cannot run on CPU.
- bfloat16 model elsewhere (the CPU): the torch fallback (``TorchUpdater`` with
  masters): one float32 master buffer laid out like the model buffer, a torch
  Adam over per-parameter views of it, the same clip, then the model buffer
  takes the masters rounded to bfloat16.

Why masters: lr 1e-6 updates are far below bfloat16's resolution (8 bits of
mantissa, ~4e-3 relative): applied to bfloat16 weights most round to zero and
the job does not learn. Megatron's ``DistributedOptimizer`` (with its
``optimizer_cpu_offload`` options) shards masters over a data-parallel group
and needs Megatron's DDP gradient buffers; here only the core cell owns an
optimizer and gradients arrive through Gyre's own float64 accumulator and
prefix-group reduction (``train.state``), so the non-distributed optimizer is
the one that fits.

Invariants (tested on CPU with the fallback): the gradient the optimizer sees
is the float64 accumulator rounded once to float32 (never through bfloat16);
after every step the model buffer equals the masters rounded to the model
dtype; a step moves the masters exactly as a float32 model stepping on the
same gradient moves its weights; masters and Adam state survive an
offload/restore round trip and a checkpoint bit for bit.
"""

from __future__ import annotations

from typing import Callable

import torch

from gyre.real.train.model import FlatParameters

Clip = Callable[[list[torch.Tensor], torch.Tensor], torch.Tensor]  # (params, flat grad) -> norm before clipping


def make_updater(flat: FlatParameters, optim, device: torch.device, clip: Clip):
    """The updater for this model dtype and device (module docstring)."""
    if flat.dtype != torch.float32 and device.type == "cuda":
        return MegatronUpdater(flat, optim)
    return TorchUpdater(flat, optim, clip)


def new_adam(params: list[torch.Tensor], optim) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay)


class TorchUpdater:
    """torch Adam over the model's parameters (float32 model) or over float32 masters (any other dtype)."""

    def __init__(self, flat: FlatParameters, optim, clip: Clip) -> None:
        self.flat, self.optim, self.clip = flat, optim, clip
        self.mixed = flat.dtype != torch.float32
        self.masters: torch.Tensor | None = flat.data.detach().float().clone() if self.mixed else None
        self.grad: torch.Tensor | None = None  # float32 master gradient (mixed only, while resident)
        self.optimizer = new_adam(self.params(), optim)
        self._host: dict | None = None

    def params(self) -> list[torch.Tensor]:
        if not self.mixed:
            return self.flat.params
        if not hasattr(self, "_master_params") or self._master_params[0].data_ptr() != self.masters.data_ptr():
            self._master_params = [torch.nn.Parameter(v) for v in self.flat.views(self.masters)]
        return self._master_params

    def step(self, acc: torch.Tensor) -> torch.Tensor:
        """Round ``acc`` to float32 once, clip, one Adam step; the model buffer = masters rounded."""
        if not self.mixed:
            self.flat.grad.copy_(acc)  # the model's own float32 gradient
            norm = self.clip(self.flat.params, self.flat.grad)
            self.optimizer.step()
            return norm
        if self.grad is None or self.grad.device != self.masters.device:
            self.grad = torch.empty_like(self.masters)
        self.grad.copy_(acc)
        params = self.params()
        for p, view in zip(params, self.flat.views(self.grad)):
            p.grad = view
        norm = self.clip(params, self.grad)
        self.optimizer.step()
        self.flat.data.copy_(self.masters)
        return norm

    def reset(self) -> None:
        """A fresh Adam; masters (mixed) taken from the model buffer, where it sits."""
        if self.mixed:
            self.masters = self.flat.data.detach().float().clone()
        self.optimizer = new_adam(self.params(), self.optim)
        self._host = None

    def state_dict(self) -> dict:
        if self._host is not None:
            return self._host
        return {"adam": to_device(self.optimizer.state_dict(), torch.device("cpu")),
                "masters": self.masters.cpu().clone() if self.mixed else None}

    def load_state_dict(self, saved: dict, resident: bool) -> None:
        if "adam" not in saved:  # a checkpoint written before masters existed: a bare Adam state
            saved = {"adam": saved, "masters": None}
        if not resident:
            self._host = saved
            return
        if self.mixed and saved.get("masters") is not None:
            self.masters = saved["masters"].to(self.flat.data.device, torch.float32).clone()
            self.optimizer = new_adam(self.params(), self.optim)
            self.flat.data.copy_(self.masters)
        self.optimizer.load_state_dict(to_device(saved["adam"], self.flat.data.device))

    def offload(self) -> None:
        self._host = self.state_dict()
        self.optimizer.state.clear()
        self.grad = None
        if self.mixed:
            self.masters = None

    def restore(self, device: torch.device) -> None:
        if self._host is None:  # reset while offloaded: fresh Adam, masters from the host weights
            if self.mixed and self.masters.device != device:
                self.masters = self.masters.to(device)
                self.optimizer = new_adam(self.params(), self.optim)
            return
        saved, self._host = self._host, None
        if self.mixed:
            self.masters = saved["masters"].to(device)
            self.optimizer = new_adam(self.params(), self.optim)
        self.optimizer.load_state_dict(to_device(saved["adam"], device))

    def resident_bytes(self) -> int:
        tensors = [self.grad] if self.mixed else []
        tensors += [self.masters] if self.masters is not None else []
        tensors += [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class MegatronUpdater:
    """Megatron-core's ``Float16OptimizerWithFloat16Params`` over the model's bf16 parameters (CUDA only)."""

    def __init__(self, flat: FlatParameters, optim) -> None:
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

        self.flat, self.optim = flat, optim
        config = OptimizerConfig(optimizer="adam", lr=optim.lr, adam_beta1=optim.betas[0],
                                 adam_beta2=optim.betas[1], adam_eps=optim.eps, weight_decay=optim.weight_decay,
                                 bf16=flat.dtype == torch.bfloat16, fp16=flat.dtype == torch.float16,
                                 clip_grad=optim.max_grad_norm)
        # bf16 needs no loss scaling (grad_scaler None); fp16 would, and is not a model dtype here.
        self.optimizer = Float16OptimizerWithFloat16Params(new_adam(flat.params, optim), config, None,
                                                           _init_adam_state)
        self.grad: torch.Tensor | None = None
        self._host: dict | None = None

    @property
    def masters(self) -> torch.Tensor:
        """Megatron's float32 main parameters, flattened in the model buffer's order (a copy)."""
        return torch.cat([p.detach().reshape(-1) for group in self.optimizer.fp32_from_float16_groups
                          for p in group])

    def step(self, acc: torch.Tensor) -> torch.Tensor:
        if self.grad is None or self.grad.device != self.flat.data.device:
            self.grad = torch.empty(self.flat.numel, dtype=torch.float32, device=self.flat.data.device)
        self.grad.copy_(acc)
        for p, view in zip(self.flat.params, self.flat.views(self.grad)):
            p.main_grad = view
        _, norm, _ = self.optimizer.step()
        self.flat.attach_grads()  # Megatron drops model_param.grad after copying it; rebind the flat views
        return torch.as_tensor(norm if norm is not None else 0.0)

    def reset(self) -> None:
        self.__init__(self.flat, self.optim)

    def state_dict(self) -> dict:
        if self._host is not None:
            return self._host
        return to_device(self.optimizer.state_dict(), torch.device("cpu"))

    def load_state_dict(self, saved: dict, resident: bool) -> None:
        if resident:
            self.optimizer.load_state_dict(to_device(saved, self.flat.data.device))
            self.optimizer._copy_main_params_to_model_params()
        else:
            self._host = saved

    def offload(self) -> None:
        self.optimizer.offload_to_cpu()  # Megatron's own: main params and Adam state to host memory
        self.grad = None
        for p in self.flat.params:
            p.__dict__.pop("main_grad", None)

    def restore(self, device: torch.device) -> None:
        self.optimizer.restore_from_cpu()
        if self._host is not None:
            saved, self._host = self._host, None
            self.load_state_dict(saved, resident=True)

    def resident_bytes(self) -> int:
        opt = self.optimizer.optimizer
        tensors = [p for g in opt.param_groups for p in g["params"] if p.device.type == "cuda"]
        tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]
        tensors += [self.grad] if self.grad is not None else []
        return sum(t.numel() * t.element_size() for t in tensors)


def _init_adam_state(optimizer: torch.optim.Optimizer, config=None) -> None:
    """Zero Adam moments for parameters without state (Megatron calls it before loading a state dict)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not optimizer.state[p]:
                optimizer.state[p]["exp_avg"] = torch.zeros_like(p.data)
                optimizer.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)


def to_device(obj, device: torch.device):
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    return obj
