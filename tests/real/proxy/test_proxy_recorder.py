"""``proxy.recording.Recorder``: a committed call joins its execution's tree and caches after the
commit returns (so the answer goes out first), on the loop's next turn or at the next ``state()``,
whichever comes first, and always in commit order."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from gyre.real.proxy.recording import ALONE_WAIT_S, Recorder
from gyre.real.proxy.tokenize import ChatTokenizer
from gyre.real.store.commit_journal import JOURNAL_NAME
from gyre.real.store.durable import Disk
from gyre.real.store.tito_log import ExecutionStore
from gyre.trajectory.records import ModelCall

try:
    from held_calls import held
except ImportError:
    from ..held_calls import held

pytestmark = pytest.mark.timeout(60)


def call(chat: ChatTokenizer, execution: str, turn: int, prompt: str) -> ModelCall:
    output = chat.encode(f"answer {turn}") + [chat.stop_token_ids[0]]
    return ModelCall(execution_id=execution, request_id=f"r{turn}", input_ids=chat.encode(prompt),
                     output_ids=output, output_logprobs=np.full(len(output), -0.5), policy_version=0)


@pytest.mark.parametrize("fsync", [True, False])
def test_a_commit_is_learned_after_it_returns_and_before_anyone_reads_the_state(tmp_path, model, fsync):
    chat = ChatTokenizer(str(model))

    async def main() -> None:
        recorder = Recorder(tmp_path / f"records-{fsync}", chat, fsync=fsync)
        try:
            first = call(chat, "ex", 0, "hello there")
            await recorder.commit(first, "hello there", alone=True)
            raw = recorder._states["ex"]  # noqa: SLF001 - what the loop's next turn will find
            assert raw.requests == 0 and len(raw.unlearned) == 1  # durable, not yet learned
            assert recorder.state("ex").requests == 1  # a reader learns it first
            assert not raw.unlearned

            second = call(chat, "ex", 1, "hello there again")
            await recorder.commit(second, "hello there again")
            assert raw.requests == 1
            await asyncio.sleep(0)  # the loop's next turn learns it without a reader
            assert raw.requests == 2 and not raw.unlearned
            assert raw.prefix.best_prefix("hello there again" + chat.decode(second.output_ids.tolist()))[0] > 0
        finally:
            recorder.close()

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["back-to-back", "back-to-back-unsynced", "concurrent"])
def test_commits_of_one_execution_are_learned_in_log_order(tmp_path, model, mode):
    """back-to-back: commits that never suspend (synced on the loop's thread, or not synced), each
    learning the one before; concurrent: commits through the group's writer."""
    chat = ChatTokenizer(str(model))
    prompts = [f"turn {i} " + "x" * i for i in range(12)]

    async def main() -> list[str]:
        recorder = Recorder(tmp_path / "records", chat, fsync=mode != "back-to-back-unsynced")
        try:
            calls = [recorder.commit(call(chat, "ex", i, p), p, alone=mode != "concurrent")
                     for i, p in enumerate(prompts)]
            if mode == "concurrent":
                await asyncio.gather(*calls)
            else:
                for commit in calls:
                    await commit
                    assert len(recorder._states["ex"].unlearned) == 1  # noqa: SLF001 - the earlier ones are learned
            await asyncio.sleep(0)
            state = recorder._states["ex"]  # noqa: SLF001 - learned by the loop, not by a reader
            assert state.requests == len(prompts) and not state.unlearned
            return [state.tree.request(i).request_id for i in range(state.tree.num_requests)]
        finally:
            recorder.close()

    tree_order = asyncio.run(main())
    log_order = [r.request_id for r in ExecutionStore(tmp_path / "records").read("ex")]
    assert sorted(log_order) == sorted(f"r{i}" for i in range(len(prompts)))
    assert tree_order == log_order


class SlowSync(Disk):
    """The store's disk, its syncs made ``delay`` seconds slower."""

    delay = 0.0

    def fdatasync(self, fd: int) -> None:
        time.sleep(self.delay)
        super().fdatasync(fd)


def _count_wakes(loop: asyncio.AbstractEventLoop) -> list[tuple]:
    """The calls handed to ``loop`` from other threads (``call_soon_threadsafe``), appended as they come."""
    wakes: list[tuple] = []
    original = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args: wakes.append(args) or original(*args)  # type: ignore[method-assign]
    return wakes


def test_a_lone_commit_is_answered_without_waking_the_loop_and_a_late_one_through_it(tmp_path, model):
    """A lone commit that lands within ``ALONE_WAIT_S`` is answered on the loop's thread: no wake-up
    of the loop, no future; one that lands later (a slow sync), a commit that is not alone, and an
    abandoned one are settled through the loop, once each, and every one of them is durable."""
    chat = ChatTokenizer(str(model))
    disk = SlowSync()

    async def main() -> int:
        wakes = _count_wakes(asyncio.get_running_loop())
        recorder = Recorder(tmp_path / "records", chat, fsync=True, disk=disk)
        try:
            turns = 0  # a loaded machine may sync one past ALONE_WAIT_S: then it is a late one; go on until
            while turns < 5 or recorder.commit_stats()["here"] == 0 and turns < 60:  # one landed in time
                turn, turns = turns, turns + 1
                here, woken = recorder.commit_stats()["here"], len(wakes)
                lone = await recorder.begin(call(chat, "ex", turn, f"hi {turn}"), f"hi {turn}")
                await recorder.wait(lone, alone=True)
                answered_here = recorder.commit_stats()["here"] - here
                assert len(wakes) - woken == 1 - answered_here
                assert lone.landing is not None and (lone.landing.future is None) == bool(answered_here)
            assert recorder.commit_stats()["here"] >= 1
            disk.delay = 10 * ALONE_WAIT_S
            here, woken = recorder.commit_stats()["here"], len(wakes)
            await recorder.commit(call(chat, "ex", turns, "late"), "late", alone=True)
            assert (recorder.commit_stats()["here"] - here, len(wakes) - woken) == (0, 1)
            await recorder.commit(call(chat, "ex", turns + 1, "and again"), "and again")  # not alone
            assert len(wakes) - woken == 2
            recorder.abandon(await recorder.begin(call(chat, "ex", turns + 2, "gone"), "gone"))
            while recorder.state("ex").requests < turns + 3:  # the abandoned record lands, then is learned
                await asyncio.sleep(0.01)
            assert len(wakes) - woken == 3
            return turns, recorder.commit_stats()["records"]
        finally:
            recorder.close()

    turns, records = asyncio.run(main())
    assert records == turns + 3
    assert [c.request_id for c in ExecutionStore(tmp_path / "records").read("ex")] == [f"r{i}" for i in range(records)]


class NotedDisk(Disk):
    """The system disk, counting the commit journal's writes."""

    def __init__(self) -> None:
        self.journal_writes = 0

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self.journal_writes += os.readlink(f"/proc/self/fd/{fd}").endswith(JOURNAL_NAME)
        return super().pwrite(fd, data, offset)


def test_a_lone_begin_returns_once_its_record_is_written_and_a_stalled_write_does_not_hold_it(tmp_path, model):
    """``Recorder.begin(alone=True)`` lets the writer write the record before the caller goes on (its
    sync then overlaps the caller's work); a write that does not return holds it ``ALONE_WAIT_S`` at most."""
    chat = ChatTokenizer(str(model))
    disk = NotedDisk()

    async def main() -> None:
        recorder = Recorder(tmp_path / "records", chat, fsync=True, disk=disk)
        try:
            written = disk.journal_writes
            pending = await recorder.begin(call(chat, "ex", 0, "hi 0"), "hi 0", alone=True)
            assert disk.journal_writes == written + 1  # written before begin returned
            await recorder.wait(pending, alone=True)
            assert recorder.group is not None
            written = disk.journal_writes
            with held(recorder.group.journal, "append", wait_s=5) as (reached, release):
                pending = await recorder.begin(call(chat, "ex", 1, "hi 1"), "hi 1", alone=True)
                assert reached.is_set() and disk.journal_writes == written  # back while the write still hangs
                release.set()
                await recorder.wait(pending, alone=True)
            assert recorder.state("ex").requests == 2
        finally:
            recorder.close()

    asyncio.run(main())


class FailingSync(Disk):
    """The system disk, its syncs failing while ``failing`` is set."""

    failing = False

    def fdatasync(self, fd: int) -> None:
        if self.failing:
            raise OSError(5, "Input/output error (test)")
        super().fdatasync(fd)


def test_a_record_durable_before_its_wait_is_learned_without_a_future(tmp_path, model):
    """A record whose batch landed while its caller was still answering (``Recorder.wait`` finds it
    landed) is acknowledged at once: no future, no loop wake-up, and it still joins the tree; one
    whose batch failed is not acknowledged."""
    chat = ChatTokenizer(str(model))
    disk = FailingSync()

    async def main() -> None:
        wakes = _count_wakes(asyncio.get_running_loop())
        recorder = Recorder(tmp_path / "records", chat, fsync=True, disk=disk)
        futures = []
        made = recorder._future  # noqa: SLF001 - counted: a landed record needs none
        recorder._future = lambda landing: futures.append(landing) or made(landing)  # type: ignore[method-assign]
        try:
            for turn in range(3):
                pending = await recorder.begin(call(chat, "ex", turn, f"hi {turn}"), f"hi {turn}")
                deadline = time.monotonic() + 30
                while not pending.landing.landed and time.monotonic() < deadline:
                    time.sleep(0.001)  # the writer thread syncs the batch meanwhile
                assert pending.landing.landed
                woken = len(wakes)
                await recorder.wait(pending)  # not alone: through the loop, had it not landed
                assert not futures and pending.landing.future is None and len(wakes) == woken
                await asyncio.sleep(0)  # the loop's next turn learns it
                assert recorder._states["ex"].requests == turn + 1  # noqa: SLF001 - learned, no reader
            disk.failing = True
            pending = await recorder.begin(call(chat, "ex", 3, "lost"), "lost")
            deadline = time.monotonic() + 30
            while not pending.landing.landed and time.monotonic() < deadline:
                time.sleep(0.001)
            assert pending.landing.error is not None
            with pytest.raises(OSError):
                await recorder.wait(pending)
            await asyncio.sleep(0)
            assert recorder._states["ex"].requests == 3  # noqa: SLF001 - never learned
            disk.failing = False
        finally:
            recorder.close()

    asyncio.run(main())
    assert [c.request_id for c in ExecutionStore(tmp_path / "records").read("ex")] == ["r0", "r1", "r2"]
