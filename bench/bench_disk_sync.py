"""What one synced write costs on the records' disk, by how long the disk was idle before it.

The commit journal (``gyre.real.store.commit_journal``) makes a record durable with a
``pwrite`` into written, preallocated space and one ``fdatasync``. This measures exactly
that, one process, one 853-byte write at a time (a short call's journal entry), with an
idle time before each write: spent spinning (the CPU stays busy, so what grows is the
device's time) or asleep (as the proxy's threads are while they wait for a sync). On the
2-core machines here a sync that follows the last by more than about 50 us costs five to
thirty times one that follows at once, and how much varies from minute to minute
(``docs/cpu-stack.md#the-proxy-on-two-cores``): the floor under a lone call's durable record.

``GYRE_BENCH_DISK_DIR`` names the folder to measure in (default: the system's temporary
folder, on the same disk as the benchmarks' record stores here).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

ENTRY = 853                                         # bytes a short call's journal entry takes
IDLE_US = (0, 20, 50, 100, 300, 1500)               # idle before each write, spinning
SLEEP_US = (300, 1500)                              # the same, asleep


def sync_times(fd: int, writes: int, idle_s: float, *, sleep: bool, data: bytes = b"\x5a" * ENTRY,
               sync: Callable[[int], None] = os.fdatasync) -> list[float]:
    """Seconds each of ``writes`` ``pwrite`` + ``sync`` of ``data`` took, one after the other at offsets
    ``0, len(data), ...`` of ``fd`` (preallocated and written by the caller, or growing), each after
    ``idle_s`` of sleep or of spinning (none when 0)."""
    times = []
    for i in range(writes):
        if idle_s and sleep:
            time.sleep(idle_s)
        elif idle_s:
            until = time.perf_counter() + idle_s
            while time.perf_counter() < until:
                pass
        start = time.perf_counter()
        os.pwrite(fd, data, i * len(data))
        sync(fd)
        times.append(time.perf_counter() - start)
    return times


def main(writes: int = 500) -> dict:
    folder = os.environ.get("GYRE_BENCH_DISK_DIR") or tempfile.gettempdir()
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"GYRE_BENCH_DISK_DIR={folder!r}: not a folder this process can write in")
    figures: dict = {}
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        path = Path(scratch) / "journal"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.write(fd, bytes(writes * ENTRY))  # written zeros, synced: no metadata left for the syncs
            os.fsync(fd)
            cases = [(us, False) for us in IDLE_US] + [(us, True) for us in SLEEP_US]
            for us, sleep in cases:
                ms = np.array(sync_times(fd, writes, us / 1e6, sleep=sleep)) * 1e3
                name = f"{'asleep' if sleep else 'idle'}_{us}us"
                figures[f"{name}_p50_ms"] = float(np.percentile(ms, 50))
                figures[f"{name}_p90_ms"] = float(np.percentile(ms, 90))
                print(f"   {'asleep' if sleep else 'spinning':8s} {us:5d} us before each write: "
                      f"p50 {figures[f'{name}_p50_ms']:.3f} ms, p90 {figures[f'{name}_p90_ms']:.3f} ms", flush=True)
        finally:
            os.close(fd)
    print(f"   ({folder}; load average {os.getloadavg()[0]:.2f})")
    return figures


if __name__ == "__main__":
    main()
