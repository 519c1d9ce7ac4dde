"""Training-plane benchmark on this machine (CPU, loopback): weight pulls, joins, micro-step throughput.

Figures:
- weight pull between two processes, through the training plane's own
  transports (``gyre.real.train.transport``), for 1, 16 and 128 MiB buffers:
  Mooncake Transfer Engine (tcp, one-sided read) against torch.distributed
  broadcast (gloo). ``cold`` is the first pull of a buffer (includes memory
  registration and, for the first buffer, the peer handshake); ``warm`` is the
  median of the next pulls; GB/s = bytes / warm time;
- join latency in the real plane (Megatron GPT of ``ModelConfig()``, 428 KB of
  weights): from the satellite's seat request to weights in place, median of
  5 joins, per transport; once with the core idle, once with the core busy
  computing large micro-steps (8 rows x 192 tokens);
- micro-step throughput of one cell and of three cells (one intra-op thread
  each) on the same tiny model, 60 micro-steps of 4 rows x 64 tokens per step,
  median of 3 steps. This machine has 2 cores, so 3 cells share 2 cores.
Run: ``.venv/bin/python -m bench training``.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import queue
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from gyre.real.train.cpu_compat import prepare_device
from gyre.real.train.model import FlatParameters
from gyre.real.train.plane import PlaneConfig, TrainingPlane
from gyre.real.toy.microsteps import feed, toy_batch, wait_claimed
from gyre.real.train.transport import Snapshot, make_transport

HOST = "127.0.0.1"
SIZES_MIB = (1, 16, 128)
PULLS = 5


class _Blob(torch.nn.Module):
    def __init__(self, numel: int) -> None:
        super().__init__()
        self.blob = torch.nn.Parameter(torch.zeros(numel))


def _transport_peer(rank: int, port: int, name: str, out) -> None:
    """rank 0 exposes/broadcasts buffers, rank 1 pulls them; rank 1 puts its timings in ``out``."""
    setup = prepare_device("cpu", threads=1)
    store = dist.TCPStore(HOST, port, None, False, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore("bench", store), rank=rank, world_size=2)
    transport = make_transport(name, HOST, setup.mooncake_protocol)
    results = {}
    for mib in SIZES_MIB:
        flat = FlatParameters(_Blob(mib << 18))
        if rank == 0:
            flat.data.copy_(torch.randn(flat.numel, generator=torch.Generator().manual_seed(mib)))
            store.set(f"snap/{mib}", json.dumps(transport.expose(flat, mib).as_dict()))
        snapshot = Snapshot.from_dict(json.loads(store.get(f"snap/{mib}")))
        times = []
        for _ in range(PULLS):
            dist.barrier()
            if rank == 0:
                transport.serve(flat, dist.group.WORLD)
            else:
                times.append(transport.pull(snapshot, flat, group=dist.group.WORLD))
        dist.barrier()
        if rank == 1:
            expected = torch.randn(flat.numel, generator=torch.Generator().manual_seed(mib))
            results[mib] = {"times": times, "exact": bool(torch.equal(flat.data, expected))}
    if rank == 1:
        out.put(results)
    dist.barrier()


def transport_figures(name: str) -> dict:
    ctx = mp.get_context("forkserver")
    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
    out = ctx.Queue()
    procs = [ctx.Process(target=_transport_peer, args=(r, store.port, name, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = None
    while results is None:
        try:
            results = out.get(timeout=1)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError(f"a {name} transport peer failed: exit codes {[p.exitcode for p in procs]}")
    for p in procs:
        p.join(timeout=30)
    figures = {}
    for mib, r in results.items():
        warm = statistics.median(r["times"][1:])
        figures[f"{mib}MiB"] = {"cold_s": round(r["times"][0], 5), "warm_s": round(warm, 5),
                                "GB_per_s": round((mib << 20) / warm / 1e9, 3), "byte_exact": r["exact"]}
    return figures


def join_latency(name: str, joins: int = 5, *, busy: bool = False) -> dict:
    """Seat request -> weights in place, in the real plane; a fresh join in each of ``joins`` steps.

    ``busy``: the satellite joins while the core is computing large micro-steps
    (a torch.distributed pull must wait for the core's next serve point; a
    Mooncake read does not involve the core).
    """
    latencies, pulls = [], []
    with TrainingPlane(PlaneConfig(cells=2, transport=name), tempfile.mkdtemp(prefix="gyre-bench-")) as plane:
        plane.call(0, "enter_training")
        for v in range(joins):
            ticket = plane.send(0, "step", version=v, final=True)
            if busy:
                steps = toy_batch(v, v, 12, rows_per_microstep=8, length=192, targets=96)
                feed(plane.queues, steps, close=False)
                wait_claimed(plane.queues, v, 1)
                plane.call(1, "enter_training")
                plane.wait_seated(v, 1)
                plane.queues.close_batch(v, len(steps))
            else:
                plane.call(1, "enter_training")
                plane.wait_seated(v, 1)
                feed(plane.queues, toy_batch(v, v, 4))
            join = ticket.result()["joins"]["1"]
            latencies.append(join["join_s"])
            pulls.append(join["pull_s"])
            plane.call(1, "leave_training")
    return {"join_median_s": round(statistics.median(latencies), 5), "pull_median_s": round(statistics.median(pulls), 5),
            "bytes": join["bytes"]}


def microstep_throughput(cells: int, steps: int = 3, per_step: int = 60) -> dict:
    rates, shares = [], []
    with TrainingPlane(PlaneConfig(cells=3), tempfile.mkdtemp(prefix="gyre-bench-")) as plane:
        for c in range(cells):
            plane.call(c, "enter_training")
        for v in range(steps):
            ticket = plane.send(0, "step", version=v, final=v == steps - 1)
            for c in range(1, cells):
                plane.wait_seated(v, c)
            start = time.perf_counter()
            feed(plane.queues, toy_batch(100 + v, v, per_step, rows_per_microstep=4, length=64, targets=32))
            report = ticket.result()
            rates.append(per_step / (time.perf_counter() - start))
            shares.append(report["by_cell"])
    return {"microsteps_per_s": round(statistics.median(rates), 1), "by_cell_last_step": shares[-1]}


def main() -> dict:
    figures = {"pull": {}, "join": {}, "throughput": {}}
    for name in ("mooncake", "torch"):
        figures["pull"][name] = transport_figures(name)
        figures["join"][name] = join_latency(name)
        figures["join"][f"{name}_busy_core"] = join_latency(name, busy=True)
    for cells in (1, 3):
        figures["throughput"][f"{cells}_cell"] = microstep_throughput(cells)
    one, three = (figures["throughput"][k]["microsteps_per_s"] for k in ("1_cell", "3_cell"))
    figures["throughput"]["speedup_3_vs_1"] = round(three / one, 2)
    for section, values in figures.items():
        for key, value in values.items():
            print(f"   {section:10s} {key:14s} {value}")
    return figures


if __name__ == "__main__":
    main()
