"""The one place where the training plane adapts Megatron-core and Mooncake to a CPU-only machine.

Everything else in ``real/train_*`` is the GPU path unchanged; ``prepare_device``
is called once per cell process and applies the adaptations below only when
the device is the CPU (facts measured in docs/cpu-stack.md):

1. ``torch.cuda.current_device()`` raises on a CPU build of torch. Megatron-core
   0.16 calls it to mean "the compute device" in ``GlobalMemoryBuffer.get_tensor``,
   ``RotaryEmbedding.get_emb`` (moves ``inv_freq``) and ``DistributedDataParallel``.
   It is pointed at the CPU device, only when CUDA is unavailable.
2. ``model_parallel_cuda_manual_seed`` needs CUDA RNG states: on CPU the model's
   RNG tracker is the inference tracker (no forked CUDA states) and the CPU
   generator is seeded.
3. Megatron's own optimizer (``get_megatron_optimizer``) hard-codes CUDA: the
   training plane uses a torch optimizer on every device (``train.state``).
4. The collective backend is gloo, Mooncake's protocol tcp (RDMA where an
   InfiniBand device exists).
5. Threads: each cell uses ``threads`` intra-op threads (default 1 on CPU), so K
   cells on a few cores do not oversubscribe and results are bit-reproducible.

Not a patch but needed on both paths: ``get_default_causal_mask`` hard-codes
``device="cuda"`` when no mask is given, so ``train.model`` always passes an
explicit causal mask.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_PATCHED = False


@dataclass(frozen=True)
class DeviceSetup:
    device: torch.device
    backend: str  # torch.distributed backend
    mooncake_protocol: str  # "tcp" or "rdma"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"


def prepare_device(device: str = "cpu", *, local_rank: int = 0, threads: int | None = None) -> DeviceSetup:
    """Select the device for this process; on CPU apply the adaptations of the module docstring."""
    if device == "cpu":
        apply_cpu_patches()
        torch.set_num_threads(threads or 1)
        quiet_mooncake_logs()
        return DeviceSetup(torch.device("cpu"), "gloo", "tcp")
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    torch.cuda.set_device(local_rank)
    if threads:
        torch.set_num_threads(threads)
    return DeviceSetup(torch.device("cuda", local_rank), "nccl", "rdma" if rdma_available() else "tcp")


def device_problem(device: str, gpus: int = 1) -> str | None:
    """Why this machine cannot give ``gpus`` local GPUs for ``device`` (None: it can).

    The driver asks before any rank starts, so a CUDA job on a machine without CUDA is one line, not
    a traceback from every rank (docs/gpu.md, "Before a GPU run")."""
    if device == "cpu":
        return None
    if device != "cuda":
        return f"device must be 'cpu' or 'cuda', got {device!r}"
    if torch.version.cuda is None:
        return (f"device = \"cuda\" but torch {torch.__version__} is a CPU-only build: install a CUDA build of "
                f"torch on the GPU node, or run with device = \"cpu\"")
    if not torch.cuda.is_available():
        return (f"device = \"cuda\" but torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU "
                f"(driver missing or CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r})")
    if torch.cuda.device_count() < gpus:
        return f"the job needs {gpus} GPUs on this node, torch sees {torch.cuda.device_count()}"
    return None


def apply_cpu_patches() -> None:
    """Point ``torch.cuda.current_device`` at the CPU when CUDA is unavailable (idempotent)."""
    global _PATCHED
    if _PATCHED or torch.cuda.is_available():
        return
    torch.cuda.current_device = _cpu_device
    _PATCHED = True
    log.debug("CPU mode: torch.cuda.current_device -> cpu for Megatron-core")


def _cpu_device() -> torch.device:
    return torch.device("cpu")


def seed_model_rng(seed: int, setup: DeviceSetup) -> None:
    """Seed parameter initialisation identically in every cell (same seed -> same model)."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    if setup.is_cpu:
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def rdma_available() -> bool:
    """True when the machine exposes an InfiniBand/RoCE device to user space."""
    root = Path("/sys/class/infiniband")
    return root.is_dir() and any(root.iterdir())


def quiet_mooncake_logs(level: str = "WARNING") -> None:
    """Mooncake logs at INFO on every engine start and transfer set-up; keep warnings and errors.

    Read by the Transfer Engine when it initialises (``MC_LOG_LEVEL``); an explicit setting wins.
    """
    os.environ.setdefault("MC_LOG_LEVEL", level)
