"""The ``[cluster]`` table of a job file: which Ray cluster a job is placed on, checked before anything starts.

``ClusterConfig`` (frozen, keyword-only; its constructor does no I/O) names:

- ``address``: the Ray cluster's GCS address ``HOST:PORT`` (what ``ray start --head``
  prints), or ``"auto"`` (the cluster this machine's ``ray start`` joined);
- ``interface``: the network interface whose IPv4 address every node advertises
  for torch.distributed rendezvous (the control store, gloo), Mooncake endpoints
  and SGLang engines; empty: the address Ray itself advertises for the node;
- ``cell_resource``: a custom Ray resource each cell's placement group takes one
  unit of, so an operator (or a test) decides how many cells a node may host by
  starting it with ``--resources='{"NAME": n}'``; empty: CPUs alone decide;
- ``rank_cpus`` / ``engine_cpus``: the logical CPUs a rank's and an engine's bundle ask for;
- ``start_timeout_s``: how long to wait for the placement groups and node agents.

``cluster_from_table`` parses the TOML table; ``check_interface`` checks an
interface on *this* machine (the driver's: the head, where the controller runs).
``interface_address`` reads an interface's IPv4 address (Linux ``SIOCGIFADDR``); it
never answers ``0.0.0.0``: an interface without an IPv4 address is an error.

Invariants: every error names the field (``cluster.address`` ...) and what was
wrong; this module never imports Ray (``make run`` and a job without ``[cluster]``
need no Ray).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from gyre.real.runtime.tables import from_table

SIOCGIFADDR = 0x8915  # <linux/sockios.h>
UNSPECIFIED = {"0.0.0.0", "::", ""}


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    address: str
    interface: str = ""
    cell_resource: str = ""
    rank_cpus: float = 1.0
    engine_cpus: float = 1.0
    start_timeout_s: float = 120.0

    def check(self) -> None:
        """Raise ValueError naming the first bad field (pure: no interface look-up, see ``check_interface``)."""
        check_address(self.address)
        for name in ("interface", "cell_resource"):
            value = getattr(self, name)
            if not isinstance(value, str) or any(ch.isspace() for ch in value):
                raise ValueError(f"cluster.{name} must be a name without spaces, not {value!r}")
        for name in ("rank_cpus", "engine_cpus", "start_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"cluster.{name} must be a non-negative number, not {value!r}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"cluster.start_timeout_s must be positive, not {self.start_timeout_s!r}")


def check_address(address: Any) -> None:
    """``"auto"`` or ``HOST:PORT`` with a concrete host (not 0.0.0.0) and a port in 1..65535."""
    if not isinstance(address, str) or not address:
        raise ValueError(f"cluster.address must be \"HOST:PORT\" (the Ray head's GCS address) or \"auto\", "
                         f"not {address!r}")
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"cluster.address must be \"HOST:PORT\" with a port in 1..65535 (e.g. "
                         f"\"10.0.0.1:6379\") or \"auto\", not {address!r}")
    if host in UNSPECIFIED:
        raise ValueError(f"cluster.address {address!r}: {host} names no machine; give the head's address")
    if any(ch.isspace() or ch in "/@" for ch in host):
        raise ValueError(f"cluster.address {address!r}: {host!r} is not a host name or IP address")


def check_interface(name: str) -> str:
    """The IPv4 address of interface ``name`` on this machine; ValueError naming ``cluster.interface``."""
    known = sorted(n for _, n in socket.if_nameindex())
    if name not in known:
        raise ValueError(f"cluster.interface {name!r} does not exist on this machine (interfaces: {known})")
    try:
        return interface_address(name)
    except OSError as exc:
        raise ValueError(f"cluster.interface {name!r} has no IPv4 address on this machine ({exc})") from None


def interface_address(name: str) -> str:
    """IPv4 address of interface ``name`` (Linux); OSError when it has none, never 0.0.0.0."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    address = socket.inet_ntoa(packed[20:24])
    if address in UNSPECIFIED or ipaddress.ip_address(address).is_unspecified:
        raise OSError(f"interface {name!r} has no IPv4 address")
    return address


def cluster_from_table(table: Mapping[str, Any], *, check_local: bool = True) -> ClusterConfig:
    """The ``[cluster]`` table as a checked ``ClusterConfig``; unknown keys are named.

    ``check_local``: also check that ``interface`` exists here (the driver runs on the head)."""
    config = from_table(ClusterConfig, table, "cluster", 'address = "HEAD:6379"',
                        required={"address": "the Ray head's \"HOST:PORT\" (or gyre run --cluster ADDRESS)"})
    config.check()
    if check_local and config.interface:
        check_interface(config.interface)
    return config
