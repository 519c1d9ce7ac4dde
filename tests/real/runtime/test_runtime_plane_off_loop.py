"""A plane command and a resume checkpoint's folder are written off the event loop.

``BackendContext.send_to_cell`` numbers a command on the loop (a cell runs
its commands in the order the actions were applied) and writes it to the
control store on another thread; the ``Checkpointer`` makes its folder there
too, before the command that fills it. A control store that hangs leaves the
loop running: the handlers return while the write still waits, and the
writes land with the numbers the handlers gave them, whatever their order.
The event journal's sync that a checkpoint waits for (events[0:P] on disk
before its manifest names P) runs there too: a slow disk holds the
checkpoint, not the loop.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

from gyre.presets import PAPER_SHAPE, build_preset
from gyre.real.runtime.backend_context import BackendContext, Metrics, Parts
from gyre.real.runtime.restore import Checkpointer

HANG_S = 5.0  # how long a write waits for the test to let it through before giving up


class HangingPlane:
    """A plane whose control store answers no write until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.written: list[tuple[int, int, str, bool, str]] = []  # cell, n, op, released in time, thread
        self.numbers: dict[int, int] = {}

    def prepare(self, cell: int, op: str, **args):
        n = self.numbers[cell] = self.numbers.get(cell, -1) + 1
        folder = args.get("folder")

        def write() -> None:
            released = self.release.wait(HANG_S)
            made = folder is None or Path(folder).is_dir()  # a checkpoint's folder exists before its command
            self.written.append((cell, n, op, released and made, threading.current_thread().name))

        return SimpleNamespace(cell=cell, n=n, op=op), write


def context(plane: HangingPlane, tmp_path: Path) -> BackendContext:
    parts = Parts(proxy_url="http://127.0.0.1:9", admin_token="-", engines=None, engine_names={}, plane=plane,
                  runner=None, records_dir=tmp_path, checkpoint_dir=tmp_path, task=None)  # type: ignore[arg-type]
    return BackendContext(build_preset("gyre-1", PAPER_SHAPE), parts)


async def released_after(plane: HangingPlane, ctx: BackendContext) -> None:
    assert not plane.written, "a write finished before the store answered"
    plane.release.set()
    await asyncio.wait(list(ctx.tasks), timeout=HANG_S * 2)


def test_a_hanging_control_store_does_not_stall_the_loop(tmp_path):
    plane = HangingPlane()
    ctx = context(plane, tmp_path)

    async def main() -> list:
        tickets = [ctx.send_to_cell(0, "step"), ctx.send_to_cell(1, "leave_training"), ctx.send_to_cell(0, "publish")]
        await asyncio.sleep(0.05)  # the loop runs on while every write waits for the store
        await released_after(plane, ctx)
        return tickets

    tickets = asyncio.run(main())
    assert [(t.cell, t.n, t.op) for t in tickets] == [(0, 0, "step"), (1, 0, "leave_training"), (0, 1, "publish")]
    assert sorted(w[:4] for w in plane.written) == [(0, 0, "step", True), (0, 1, "publish", True),
                                                    (1, 0, "leave_training", True)]
    assert all(w[4] != threading.main_thread().name for w in plane.written) and not ctx.errors


def test_a_checkpoint_folder_is_made_off_the_loop_before_its_command(tmp_path):
    plane = HangingPlane()
    ctx = context(plane, tmp_path)
    core = SimpleNamespace(published=1, burst=1, now=0.0)
    controller = SimpleNamespace(core=SimpleNamespace(snapshot=lambda: core), log=[], cfg=ctx.cfg)
    backend = SimpleNamespace(ctx=ctx, metrics=Metrics(), progress=lambda line: None)
    checkpointer = Checkpointer(tmp_path / "checkpoints", plane, controller, backend, tp=1, seed=0)

    async def main() -> None:
        checkpointer(2)
        assert not (tmp_path / "checkpoints").exists()  # nothing touched the disk on the loop
        await asyncio.sleep(0.05)
        await released_after(plane, ctx)

    asyncio.run(main())
    assert [w[:4] for w in plane.written] == [(0, 0, "save_checkpoint", True)]
    checkpointer(2)  # the same burst end again (a resumed run): no second command
    assert plane.numbers == {0: 0}


class SlowSyncLog(list):
    """An event journal whose ``sync`` waits (a slow disk) until ``go`` is set; it notes the loop's turns then."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.turns = 0  # the loop's turns so far (the test's ticker counts them)
        self.turns_at_sync: int | None = None

    def sync(self) -> None:
        self.go.wait(HANG_S)  # on the loop nothing could set it: the test fails after HANG_S instead of hanging
        self.turns_at_sync = self.turns


def test_a_slow_journal_sync_holds_the_checkpoint_not_the_loop(tmp_path):
    log, turns_needed = SlowSyncLog(), 5
    plane = SimpleNamespace(prepare=lambda cell, op, **args: (SimpleNamespace(result=lambda timeout: None),
                                                               lambda: None))
    ctx = context(HangingPlane(), tmp_path)
    core = SimpleNamespace(published=1, burst=1, now=0.0)
    controller = SimpleNamespace(core=SimpleNamespace(snapshot=lambda: core), log=log, cfg=ctx.cfg)
    said: list[str] = []
    backend = SimpleNamespace(ctx=ctx, metrics=Metrics(), progress=said.append)
    checkpointer = Checkpointer(tmp_path / "checkpoints", plane, controller, backend, tp=1, seed=0)

    async def main() -> None:
        checkpointer(2)
        while not said and log.turns < 2000:
            log.turns += 1
            if log.turns == turns_needed:
                log.go.set()
            await asyncio.sleep(0.005)
        if ctx.tasks:
            await asyncio.wait(list(ctx.tasks), timeout=HANG_S * 2)

    asyncio.run(main())
    assert not ctx.errors and said and said[0].startswith("checkpoint resume-v000002"), (said, ctx.errors)
    assert log.turns_at_sync is not None and log.turns_at_sync >= turns_needed, \
        f"the loop turned {log.turns_at_sync} times while the journal synced"
