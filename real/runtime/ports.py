"""Free TCP ports that no other process's ephemeral bind can take before we bind them.

A port found free by ``bind(('127.0.0.1', 0))`` comes from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default): the very range every
outgoing connection and every other ``bind(0)`` draws from. Between finding it and the real bind
(the proxy starts seconds after its port is chosen, and must come back on it after a restart),
another process (Mooncake's transfer engine, an engine's scheduler, a Ray worker) can be handed
it, and the bind fails with ``EADDRINUSE``.

Invariants:
- ``free_port`` returns a port below the ephemeral range and at or above ``PORT_FLOOR`` (above
  Ray's default worker ports, 10002-19999), bindable on ``host`` when it was checked;
- one process never returns the same port twice in a row (a cursor moves past each port it
  hands out, so two ports asked for before either is bound differ);
- processes start their scan at different places (derived from the pid, no random state);
- where the range below the ephemeral ports is too narrow, it falls back to the kernel's choice.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

PORT_FLOOR = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768
MIN_SPAN = 256  # below this many ports, scanning would collide more than the kernel's choice

_lock = threading.Lock()
_cursor: dict[str, int] = {}  # offset into the range where this process's next scan starts


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (the Linux default where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_choice(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_port(host: str = "127.0.0.1", *, low: int | None = None) -> int:
    """A TCP port on ``host`` that is free right now, chosen outside the ephemeral range."""
    top = ephemeral_low() if low is None else low
    span = top - PORT_FLOOR
    if span < MIN_SPAN:
        return _kernel_choice(host)
    with _lock:
        start = _cursor.get("next", os.getpid() * 7919 % span)
        for step in range(span):
            offset = (start + step) % span
            if _bindable(host, PORT_FLOOR + offset):
                _cursor["next"] = (offset + 1) % span
                return PORT_FLOOR + offset
    return _kernel_choice(host)
