"""A training-cell process: build the context once, then serve the driver's commands until ``stop``.

Commands arrive as ``cmd/{cell}/{n}`` (n = 0, 1, ...) in the control store and
are answered as ``reply/{cell}/{n}``, in order. A handler that fails answers
``{"error": ...}`` and the cell keeps serving; only ``stop`` ends the process.

| op              | cells      | effect                                                        |
|-----------------|------------|---------------------------------------------------------------|
| enter_training  | all        | restore training state; a satellite then joins steps until    |
|                 |            | released or barred (other commands are served between steps); |
|                 |            | with ``hold=True`` it joins nothing until ``join`` arrives     |
| join            | satellite  | end the hold: join steps from now on                          |
| leave_training  | all        | offload training state (idempotent)                           |
| step            | core       | ``CoreCell.step(version, batch, final)``; answers its report  |
| publish         | core       | weights to each engine, from memory or disk; HF checkpoint    |
| dump / load     | all / core | write weights (and the last reduced gradient) / load weights  |
|                 |            | (per rank: rank r > 0 of a TP cell uses ``{path}.rank{r}``)   |
| save_checkpoint | core       | every rank writes weights + Adam + RNG (``train.checkpoint``) |
| load_checkpoint | core       | every rank restores them (satellites pull the loaded weights) |
| info, stop      | all        | pid, role, resident bytes / answer and exit                   |

Mapping to the policy core's actions (gyre/): BeginTransition(cell, role) ->
enter/leave_training, answered = TransitionDone; StartBatch + FeedGroups ->
``step`` on the core while the driver packs groups into the batch's queue;
the step's answer = StepDone; Broadcast is carried out by the core at the end
of a non-final step; Publish -> ``publish``.

A cell of ``tp`` ranks is one process per rank: rank 0 (the leader) runs this
loop, the other ranks run ``train.ranks.CellRanks.follow`` and execute every
tensor operation the leader hands them; ``stop`` ends them too.

Fault injection (tests of ``gyre run --resume``): ``GYRE_FAULT_PAUSE``
(``runtime.faults``) makes the core sleep at the start of a named ``step`` or
``publish`` of one version, so a test can kill the job inside that phase.
"""

from __future__ import annotations

import logging
import os
import time
import traceback

import torch

from gyre.real.train.context import CellConfig, CellContext, build_context
from gyre.real.train.core import CoreCell
from gyre.real.train.fence import exit_if_stale
from gyre.real.train.publish import publish_from_disk, save_hf_tensors
from gyre.real.train.satellite import Interrupted, SatelliteCell
from gyre.real.train import keys
from gyre.real.runtime.faults import fault_pause
from gyre.real.runtime.lifetime import die_with_parent, release_forkserver

IDLE_POLL_S = 0.01  # command polling while not training (a satellite in training polls at poll_s)


def cell_main(cfg: CellConfig, cell: int, rank: int = 0) -> None:
    """Process entry point of rank ``rank`` of ``cell`` (picklable target for multiprocessing): the
    leader (rank 0) serves the driver's commands, the other ranks follow it (``train.ranks``).
    It dies with the forkserver that started it, which ends with the job (``runtime.lifetime``)."""
    die_with_parent()
    release_forkserver()  # else this cell keeps the forkserver, and so itself, alive after the job is gone
    ctx = build_context(cfg, cell, rank)
    try:
        if rank == 0:
            CellProcess(ctx).serve()
        else:
            ctx.ranks.follow()
    finally:
        logging.shutdown()
        os._exit(0)  # no atexit teardown: peers may be gone, and the driver owns the store


class CellProcess:
    def __init__(self, ctx: CellContext) -> None:
        self.ctx = ctx
        self.core = CoreCell(ctx) if ctx.cell == 0 else None
        self.n = 0
        self.role = "rollout"
        self.next_version = 0  # a satellite never joins a step older than this
        self.held = False  # in training but not joining steps yet (enter_training(hold=True))
        self.entries = 0  # enter_training commands served (GYRE_FAULT_PAUSE's transition number)
        self.memory = None  # train.publish_memory.MemoryRoute once a publication goes from memory

    def serve(self) -> None:
        control = self.ctx.control
        control.set(keys.ready(self.ctx.cell), {"pid": os.getpid()})
        while True:
            if self.core is None and self.role == "training" and not self.held and not self.command_pending():
                self._train_as_satellite()  # returns on release, bar, failure or a new command
                continue
            if not self.command_pending():
                time.sleep(IDLE_POLL_S)
                continue
            cmd = control.get(keys.command(self.ctx.cell, self.n))
            exit_if_stale(self.ctx.cfg.workdir, self.ctx.cfg.attempt, cmd.get("attempt", 0), f"cell {self.ctx.cell}")
            op, args = cmd["op"], cmd.get("args", {})
            try:
                result = self.handle(op, args)
            except Exception as exc:
                self.ctx.log.exception("cell %d: command %s failed", self.ctx.cell, op)
                result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            if op == "stop":
                self.ctx.ranks.run("stop")  # the followers exit with the leader
            self.reply(result)
            if op == "stop":
                return

    def command_pending(self) -> bool:
        return self.ctx.control.has(keys.command(self.ctx.cell, self.n))

    def reply(self, result: dict) -> None:
        self.ctx.control.set(keys.reply(self.ctx.cell, self.n), result)
        self.n += 1

    def handle(self, op: str, args: dict) -> dict:
        handlers = {"enter_training": self.enter_training, "leave_training": self.leave_training, "join": self.join,
                    "step": self.step, "publish": self.publish, "dump": self.dump, "load": self.load,
                    "save_checkpoint": self.save_checkpoint, "load_checkpoint": self.load_checkpoint,
                    "info": self.info, "stop": self.info}
        if op not in handlers:
            raise ValueError(f"unknown command {op!r}; known: {sorted(handlers)}")
        return handlers[op](**args)

    # -- role changes -----------------------------------------------------------------------------
    def enter_training(self, hold: bool = False) -> dict:
        """Restore the training state; the answer is TransitionDone (a satellite then joins the next window).

        ``hold``: join no step until ``join`` (the driver first learns whether the policy core
        keeps this cell in training, or sends it straight back because its burst ended)."""
        self.entries += 1
        fault_pause("transition", self.entries, self.ctx.log)
        self.ctx.ranks.run("restore")
        self.role, self.held = "training", hold
        self.ctx.log.info("cell %d entered training (%d bytes of training state)", self.ctx.cell,
                          self.ctx.state.resident_bytes())
        return self.info()

    def _train_as_satellite(self) -> None:
        satellite = SatelliteCell(self.ctx, self.command_pending, self.next_version)
        try:
            outcome = satellite.train()
        except Interrupted:
            return  # serve the pending command, then resume if still in training
        except Exception:
            self.ctx.log.exception("cell %d: training loop failed; back to rollout", self.ctx.cell)
            outcome = "failed"
        finally:
            self.next_version = satellite.next_version
        self.ctx.log.info("cell %d leaves training: %s", self.ctx.cell, outcome)
        self._to_rollout()

    def join(self) -> dict:
        """End a hold: a satellite in training joins steps from now on (a no-op otherwise)."""
        self.held = False
        return self.info()

    def leave_training(self) -> dict:
        self.held = False
        self._to_rollout()
        return self.info()

    def _to_rollout(self) -> None:
        self.ctx.ranks.run("offload")
        self.role = "rollout"

    # -- core-only and utility commands -----------------------------------------------------------
    def step(self, version: int, batch: int | None = None, final: bool = False) -> dict:
        self._require_core("step")
        fault_pause("step", version, self.ctx.log)
        return self.core.step(version, version if batch is None else batch, final)

    def publish(self, version: int, endpoints: list[str], directory: str, timeout: float = 120.0,
                route: str = "disk", engine_tp: int = 1) -> dict:
        """Version ``version`` to ``endpoints``: from memory (``route = "memory"``: the engines pause only for
        the swap) or from disk; either way the checkpoint is written (engines coming back load it, resumes)."""
        self._require_core("publish")
        fault_pause("publish", version, self.ctx.log)
        tensors = self.ctx.ranks.run("export")  # full HF tensors, TP shards gathered
        swap_s = self._publish_from_memory(endpoints, tensors, version, engine_tp) if route == "memory" else None
        used = "disk" if swap_s is None else "memory"
        t0 = time.perf_counter()
        path = save_hf_tensors(directory, tensors, self.ctx.cfg.model, version)
        write_s = time.perf_counter() - t0
        answers: list[dict] = []
        if swap_s is None:
            t0 = time.perf_counter()
            answers = publish_from_disk(endpoints, path, version, timeout=timeout)
            swap_s = time.perf_counter() - t0
        self.ctx.log.info("published version %d to %d engines from %s (%.3f s swap, %.3f s write)", version,
                          len(endpoints), used, swap_s, write_s)
        return {"path": str(path), "answers": answers, "route": used, "swap_s": swap_s, "write_s": write_s}

    def _publish_from_memory(self, endpoints: list[str], tensors: dict, version: int, engine_tp: int) -> float | None:
        """The swap's seconds, or None: this publication goes through the disk (memory refused, or it failed)."""
        from gyre.real.train.publish import PublishError
        from gyre.real.train.publish_memory import MemoryRoute

        if self.memory is None:
            self.memory = MemoryRoute(self.ctx.cfg.host_of(0), self.ctx.log)
        try:
            return self.memory.publish({url: engine_tp for url in endpoints}, list(tensors.items()), version,
                                       self.ctx.state.device)
        except (PublishError, RuntimeError) as exc:  # an engine died mid-swap: the disk path names it
            self.ctx.log.warning("publication of version %d from memory failed (%s); from disk instead", version,
                                 exc)
            return None

    def dump(self, path: str, hf: bool = False) -> dict:
        """Each rank writes its shard (rank r > 0 to ``{path}.rank{r}``); with ``hf`` the leader also writes
        the gathered Hugging Face tensors to ``{path}.hf``."""
        self.ctx.ranks.run("dump", path=path, gradient=self.core is not None)
        answer = {"path": path, "tp": self.ctx.cfg.tp}
        if hf:
            torch.save(self.ctx.ranks.run("export"), f"{path}.hf")
            answer["hf"] = f"{path}.hf"
        return answer

    def save_checkpoint(self, folder: str) -> dict:
        """Every rank writes its shard, Adam state and RNG states into ``folder`` (``train.checkpoint``)."""
        self._require_core("save_checkpoint")
        self.ctx.ranks.run("save_state", folder=folder)
        return {"folder": folder, "tp": self.ctx.cfg.tp}

    def load_checkpoint(self, folder: str) -> dict:
        self._require_core("load_checkpoint")
        self.ctx.ranks.run("load_state", folder=folder)
        self.core.members = set()  # satellites must pull the loaded weights
        return self.info()

    def load(self, path: str) -> dict:
        self._require_core("load")
        self.ctx.ranks.run("load", path=path)
        self.core.members = set()  # satellites must pull the loaded weights
        return self.info()

    def info(self) -> dict:
        return {"cell": self.ctx.cell, "pid": os.getpid(), "role": self.role, "tp": self.ctx.cfg.tp,
                "resident_bytes": self.ctx.state.resident_bytes()}

    def _require_core(self, op: str) -> None:
        if self.core is None:
            raise ValueError(f"{op!r} is a core command; cell {self.ctx.cell} is a satellite")
