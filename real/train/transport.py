"""Moving the core's weight snapshot to a joining satellite: Mooncake, or torch.distributed as fallback.

The core *exposes* its flat weight buffer before every step (``expose`` returns
a ``Snapshot`` descriptor that goes into the control store); a satellite that
took a seat *pulls* it into its own flat buffer. The weights are frozen while
the step accumulates and the join window closes before the update, so every
pull of version v reads the same bytes.

- ``MooncakeTransport`` (docs/streaming.md#joining-a-step): the core registers the buffer with its
  Mooncake Transfer Engine (P2P handshake, no metadata server); the satellite
  registers its destination and issues one-sided reads
  (``transfer_sync_read``). The core does nothing per join and keeps training.
  Protocol ``tcp`` on CPU, ``rdma`` where an RDMA device exists.
- ``TorchTransport`` (fallback, chosen by config): ``torch.distributed.broadcast``
  from the core over the pair group {0, c} built up front (per shard r of a
  TP cell: {r, c * tp + r}, the core's rank first). The core must take
  part, so it serves pending pulls between micro-steps (``train.cell``).

A pull checks the descriptor's layout digest and byte count against its own
buffer first, so cells with different models fail with a clear error instead
of reading garbage.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from gyre.real.train.model import FlatParameters

TRANSPORTS = ("mooncake", "torch")


class TransportError(RuntimeError):
    """A snapshot could not be exposed or pulled; the message names the step and the cause."""


@dataclass(frozen=True)
class Snapshot:
    version: int
    transport: str
    nbytes: int
    layout: str
    peer: str = ""  # mooncake: "host:rpc_port" of the core's engine
    address: int = 0  # mooncake: remote address of the buffer

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Snapshot":
        return cls(**data)


def check_compatible(snapshot: Snapshot, flat: FlatParameters) -> None:
    if snapshot.layout != flat.layout_digest() or snapshot.nbytes != flat.nbytes:
        raise TransportError(f"snapshot of version {snapshot.version} has layout {snapshot.layout} "
                             f"({snapshot.nbytes} bytes) but this cell's model is {flat.layout_digest()} "
                             f"({flat.nbytes} bytes): cells must be built from the same ModelConfig")


class MooncakeTransport:
    """One Mooncake Transfer Engine per cell; memory registered once per buffer address."""

    name = "mooncake"

    def __init__(self, host: str, protocol: str, device_name: str = "") -> None:
        from mooncake.engine import TransferEngine

        self.host = host
        self.engine = TransferEngine()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", protocol, device_name)
        if rc != 0:
            raise TransportError(f"Mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, {protocol!r}) "
                                 f"returned {rc}")
        self.peer = f"{host}:{self.engine.get_rpc_port()}"
        self._registered: dict[int, int] = {}

    def _register(self, tensor: torch.Tensor) -> int:
        ptr, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        if self._registered.get(ptr) != nbytes:
            if ptr in self._registered:
                self.engine.unregister_memory(ptr)
            rc = self.engine.register_memory(ptr, nbytes)
            if rc != 0:
                raise TransportError(f"Mooncake register_memory({nbytes} bytes) returned {rc}")
            self._registered[ptr] = nbytes
        return ptr

    def expose(self, flat: FlatParameters, version: int) -> Snapshot:
        address = self._register(flat.data)
        return Snapshot(version, self.name, flat.nbytes, flat.layout_digest(), self.peer, address)

    def pull(self, snapshot: Snapshot, flat: FlatParameters, group=None) -> float:
        """Read the snapshot into ``flat.data``; returns seconds spent."""
        check_compatible(snapshot, flat)
        local = self._register(flat.data)
        start = time.perf_counter()
        rc = self.engine.transfer_sync_read(snapshot.peer, local, snapshot.address, snapshot.nbytes)
        if rc != 0:
            raise TransportError(f"Mooncake read of version {snapshot.version} from {snapshot.peer} returned {rc}")
        return time.perf_counter() - start

    def serve(self, flat: FlatParameters, group) -> None:
        """Nothing to do: Mooncake reads are one-sided."""


class TorchTransport:
    """Fallback: the core broadcasts its buffer over the pair group {0, c}."""

    name = "torch"

    def expose(self, flat: FlatParameters, version: int) -> Snapshot:
        return Snapshot(version, self.name, flat.nbytes, flat.layout_digest())

    def pull(self, snapshot: Snapshot, flat: FlatParameters, group=None) -> float:
        check_compatible(snapshot, flat)
        if group is None:
            raise TransportError("torch transport needs the pair group {0, c} to pull")
        start = time.perf_counter()
        dist.broadcast(flat.data, src=dist.get_global_rank(group, 0), group=group)
        return time.perf_counter() - start

    def serve(self, flat: FlatParameters, group) -> None:
        """Send ``flat`` over the pair group; its rank 0 is the core's rank of this shard."""
        dist.broadcast(flat.data, src=dist.get_global_rank(group, 0), group=group)


def make_transport(name: str, host: str, protocol: str):
    if name == "mooncake":
        return MooncakeTransport(host, protocol)
    if name == "torch":
        return TorchTransport()
    raise ValueError(f"transport must be one of {TRANSPORTS}, got {name!r}")
