"""Driver side of the training plane: control store, K cell processes, supervision, commands.

``TrainingPlane`` hosts the TCPStore (so coordination survives any cell),
starts one process per cell and supervises them: when a cell exits without
being told to stop, the supervisor records ``crash/{cell}`` with its exit code
(the core then finishes the current step without it) and every pending or
later command to that cell fails with ``CellError`` naming the exit code.

A cell of ``tp`` tensor-parallel ranks is ``tp`` processes (rank r of cell c
is global rank c * tp + r); its rank 0 answers the commands (``train.ranks``).

Cells start from a ``forkserver`` whose preload imports the cell module
(Megatron-core, Mooncake): the ~5 s import is paid once per driver process,
not once per cell. Each cell is a fresh fork of that server, with no state
from the driver. Everything listens on 127.0.0.1 only, on ports chosen at
run time.

Commands are asynchronous: ``send`` returns a ``Ticket``; the driver can feed
the queue of a running step (``queues``) and start satellites while the core
trains. ``call`` is ``send(...).result()``.

On a Ray cluster (``cluster.placement``, given as ``launcher``) the same cells
run on the nodes the placement put them on: the store listens on the head's
address, each rank is started by its node's agent and supervised through a
handle with the ``multiprocessing.Process`` calls used here; nothing else changes.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from gyre.real.train.context import CellConfig
from gyre.real.train.fence import write_attempt
from gyre.real.train.membership import BatchQueues, ControlStore
from gyre.real.train.model import LossConfig, ModelConfig
from gyre.real.train.state import OptimConfig
from gyre.real.train import keys

HOST = "127.0.0.1"


class CellError(RuntimeError):
    """A command failed in its cell, or the cell exited; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class PlaneConfig:
    cells: int = 3
    transport: str = "mooncake"
    device: str = "cpu"
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    threads: int = 1
    timeout_s: float = 60.0
    start_timeout_s: float = 180.0
    record_gradients: bool = False
    crash_after: tuple[tuple[int, int], ...] = ()
    tp: int = 1  # tensor-parallel ranks per cell: one process each (``train.ranks``)
    pp: int = 1  # pipeline stages per cell: only 1 is supported (``CellConfig``)
    attempt: int = 0  # the job's attempt on its run folder, named by every command; 0: unfenced (``train.fence``)


class Ticket:
    """One command's answer, to wait for."""

    def __init__(self, plane: "TrainingPlane", cell: int, n: int, op: str) -> None:
        self.plane, self.cell, self.n, self.op = plane, cell, n, op

    def done(self) -> bool:
        return self.plane.control.has(keys.reply(self.cell, self.n))

    def result(self, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout if timeout is not None else self.plane.cfg.timeout_s * 2)
        while not self.done():
            if self.plane.abandoned:
                raise CellError(f"cell {self.cell}: {self.op!r} abandoned (the run is over)")
            exitcode = self.plane.crashes.get(self.cell)
            if exitcode is not None:
                raise CellError(f"cell {self.cell} exited with code {exitcode} before answering {self.op!r}")
            if time.monotonic() > deadline:
                raise CellError(f"cell {self.cell} did not answer {self.op!r} in time")
            time.sleep(0.002)
        reply = self.plane.control.get(keys.reply(self.cell, self.n))
        if "error" in reply:
            raise CellError(f"cell {self.cell} failed {self.op!r}: {reply['error']}")
        return reply


class TrainingPlane:
    def __init__(self, cfg: PlaneConfig, workdir: str | Path, launcher=None) -> None:
        self.cfg = cfg
        self.launcher = launcher  # None: forked here; else ``cluster.placement.Placement`` (store_host, start_rank)
        self.workdir = Path(workdir)
        self.crashes: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self._procs: list = []
        self._next = [0] * cfg.cells
        self._stopping = False
        self.abandoned = False  # set by abandon(): waiting for an answer raises at once
        self._store = None
        self.control: ControlStore | None = None
        self.queues = BatchQueues(self.workdir / "queue")

    def __enter__(self) -> "TrainingPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "TrainingPlane":
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.cfg.attempt:
            write_attempt(self.workdir, self.cfg.attempt)  # before any cell of this attempt starts
        timeout = datetime.timedelta(seconds=self.cfg.timeout_s)
        host = self.launcher.store_host if self.launcher is not None else HOST
        self._store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
        self.control = ControlStore(self._store)
        cell_cfg = self._cell_config(self._store.port, host)
        if self.launcher is not None:
            cell_cfg = self.launcher.cell_config(cell_cfg)  # each cell's node address
        else:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["gyre.real.train.cell"])
            from gyre.real.train.cell import cell_main
        for cell in range(self.cfg.cells):
            for rank in range(self.cfg.tp):
                name = f"gyre-cell{cell}" + (f"-rank{rank}" if rank else "")
                if self.launcher is not None:
                    self._procs.append(self.launcher.start_rank(cell_cfg, cell, rank, name))
                    continue
                proc = ctx.Process(target=cell_main, args=(cell_cfg, cell, rank), name=name, daemon=True)
                proc.start()
                self._procs.append(proc)
        threading.Thread(target=self._supervise, name="gyre-cell-supervisor", daemon=True).start()
        self._wait_ready()
        return self

    def _cell_config(self, port: int, host: str = HOST) -> CellConfig:
        c = self.cfg
        return CellConfig(cells=c.cells, store_port=port, queue_root=str(self.queues.root),
                          workdir=str(self.workdir), store_host=host, device=c.device, transport=c.transport,
                          model=c.model, optim=c.optim, loss=c.loss, threads=c.threads, timeout_s=c.timeout_s,
                          record_gradients=c.record_gradients, crash_after=c.crash_after, tp=c.tp, pp=c.pp,
                          attempt=c.attempt)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.cfg.start_timeout_s
        for cell in range(self.cfg.cells):
            while not self.control.has(keys.ready(cell)):
                if cell in self.crashes or time.monotonic() > deadline:
                    self.close()
                    raise CellError(f"cell {cell} did not start (exit code {self.crashes.get(cell)}); "
                                    f"see {self.workdir / f'cell{cell}.log'} and stderr")
                time.sleep(0.01)
            self.pids[cell] = self.control.get(keys.ready(cell))["pid"]

    def _supervise(self) -> None:
        """Record every cell one of whose ranks exits while not being stopped (exit code in
        ``crash/{cell}``); the cell's other ranks are killed (they cannot go on without it)."""
        while not self._stopping:
            for index, proc in enumerate(self._procs):
                cell = index // self.cfg.tp
                if cell not in self.crashes and proc.exitcode is not None and not self._stopping:
                    self.crashes[cell] = proc.exitcode
                    self._store.set(keys.crash(cell), json.dumps({"exitcode": proc.exitcode, "pid": proc.pid}))
                    for sibling in self._procs[cell * self.cfg.tp:(cell + 1) * self.cfg.tp]:
                        if sibling.exitcode is None:
                            sibling.kill()
            time.sleep(0.01)

    def send(self, cell: int, op: str, **args) -> Ticket:
        ticket, write = self.prepare(cell, op, **args)
        write()
        return ticket

    def prepare(self, cell: int, op: str, **args) -> tuple[Ticket, Callable[[], None]]:
        """A command numbered now (a cell runs its commands in this order) and the write that sends it:
        a call to the control store, which an event loop makes on another thread. The cell runs command n
        only after n - 1, whatever order the writes land in."""
        if not 0 <= cell < self.cfg.cells:
            raise ValueError(f"cell must be in [0, {self.cfg.cells}), got {cell!r}")
        n = self._next[cell]
        self._next[cell] += 1
        command = {"op": op, "args": args, "attempt": self.cfg.attempt}
        return Ticket(self, cell, n, op), lambda: self.control.set(keys.command(cell, n), command)

    def call(self, cell: int, op: str, *, timeout: float | None = None, **args) -> dict:
        return self.send(cell, op, **args).result(timeout)

    def wait_seated(self, version: int, cell: int, timeout: float | None = None) -> str:
        """Block until satellite ``cell`` holds a seat in step ``version``; returns the seat state."""
        return self.control.wait(keys.seat(version, cell), timeout or self.cfg.timeout_s,
                                 f"cell {cell}'s seat in step {version}", raw=True)

    def log_text(self, cell: int) -> str:
        path = self.workdir / f"cell{cell}.log"
        return path.read_text() if path.exists() else ""

    def abandon(self) -> None:
        """The run is over: every wait for a command's answer (``Ticket.result``) raises ``CellError`` at once.

        A run can end with commands nobody will answer (a step opened for a batch that
        will never be fed); their waiting threads must not hold the process up. ``close``
        still stops the cells afterwards."""
        self.abandoned = True

    def close(self) -> None:
        if self._store is None:
            return
        self.abandoned = False  # the stop commands below are waited for
        tickets = [self.send(c, "stop") for c in range(self.cfg.cells) if c not in self.crashes]
        self._stopping = True
        for ticket in tickets:
            try:
                ticket.result(timeout=10)
            except CellError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._procs, self._store, self.control = [], None, None
