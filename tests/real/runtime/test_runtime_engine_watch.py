"""The engine watch (``runtime.engine_watch``) against a fake engine manager at the outer edge.

The fake keeps the manager's contract: ``exited()`` lists an engine from its
death until a restart replaces it (or ``shutdown`` marks it stopped);
``restart`` refuses a live or stopped engine. Checked: one restart per death,
on the watch's own thread; the weights loaded are the newest published ones,
also when a publish lands during the restart; an engine whose cell trains comes
back with its memory released; a failing restart is recorded (engine and log
named), the engine is given up, and the supervisor goes on restarting others;
the backend's operations on a dead engine revive it first; ``close`` shuts the
engines and ends the restart thread, and nothing is restarted after it.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from gyre.real.engines.manager import EngineError
from gyre.real.runtime.engine_watch import EngineWatch, describe_exit


@dataclass
class FakeEngine:
    name: str
    pid: int
    code: int | None = None          # exit code once dead
    stopped: bool = False
    restarts: int = 0
    released: bool = False

    @property
    def process(self):
        return SimpleNamespace(pid=self.pid)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{30000 + self.pid}"

    @property
    def log_path(self) -> Path:
        return Path(f"/logs/{self.name}.log")


@dataclass
class FakeManager:
    names: tuple[str, ...] = ("e0", "e1")
    fail_restart: set[str] = field(default_factory=set)
    calls: list[tuple] = field(default_factory=list)
    on_restart: object = None        # called inside restart (e.g. to publish meanwhile)

    def __post_init__(self) -> None:
        self.engines = {n: FakeEngine(n, pid=100 + i) for i, n in enumerate(self.names)}
        self.next_pid = 200

    def kill(self, name: str, code: int = -9) -> None:
        self.engines[name].code = code

    def exited(self) -> dict[str, int]:
        return {n: e.code for n, e in self.engines.items() if not e.stopped and e.code is not None}

    def restart(self, name, *, timeout=180.0, weights=None):
        old = self.engines[name]
        self.calls.append(("restart", name, weights, threading.current_thread().name))
        if old.stopped or old.code is None:
            raise EngineError(f"engine {name!r} is not dead")
        if self.on_restart is not None:
            self.on_restart()
        old.stopped = True
        self.next_pid += 1
        new = self.engines[name] = FakeEngine(name, pid=self.next_pid, restarts=old.restarts + 1)
        if name in self.fail_restart:
            new.code = 1
            raise EngineError(f"engine {name!r} (exit code {old.code}, log {old.log_path}.1) did not come back")
        return new

    def _live(self, name: str) -> FakeEngine:
        engine = self.engines[name]
        if engine.stopped or engine.code is not None:
            raise EngineError(f"engine {name!r} exited with code {engine.code}")
        return engine

    def update_weights_from_disk(self, name, path, *, weight_version=None):
        self._live(name)
        self.calls.append(("load", name, str(path), weight_version))

    def quiesce(self, name, timeout=60.0):
        self._live(name)
        self.calls.append(("quiesce", name))

    def release_memory(self, name, tags=None):
        self._live(name).released = True
        self.calls.append(("release", name))

    def resume_memory(self, name, tags=None):
        self._live(name).released = False
        self.calls.append(("resume", name))

    def shutdown(self, name, grace_s=20.0):
        self.engines[name].stopped = True
        self.calls.append(("shutdown", name))

    def shutdown_all(self) -> None:
        for name in self.engines:
            self.engines[name].stopped = True


def watch_for(manager: FakeManager, latest=lambda: (3, "/ckpt/v000003"), **kw) -> EngineWatch:
    return EngineWatch(manager, latest=latest, poll_s=0.01, **kw).start()


async def until(condition, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def supervised(watch: EngineWatch, scenario) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(watch.supervise())
        try:
            await scenario()
        finally:
            task.cancel()
    try:
        asyncio.run(main())
    finally:
        watch.close(timeout=5.0)


def restarts(manager: FakeManager) -> list[tuple]:
    return [c for c in manager.calls if c[0] == "restart"]


def test_one_restart_per_death_with_the_newest_weights_on_the_restart_thread(tmp_path):
    manager = FakeManager()
    watch = watch_for(manager, roster=tmp_path / "engines.json")
    lines: list[str] = []
    watch.progress = lines.append

    async def scenario():
        manager.kill("e1")
        await until(lambda: watch.restarts)
        await asyncio.sleep(0.1)  # many more polls: the engine is back, nothing more to do

    supervised(watch, scenario)
    assert restarts(manager) == [("restart", "e1", ("/ckpt/v000003", "3"), "gyre-engine-restart")]
    [record] = watch.restarts
    assert (record["engine"], record["exit_code"], record["version"], record["role"]) == ("e1", -9, "3", "rollout")
    assert record["back_s"] >= 0 and record["pid"] == manager.engines["e1"].pid
    assert watch.down == set() and watch.errors == []
    assert any("e1" in line and "SIGKILL" in line for line in lines), lines
    assert '"pid": 201' in (tmp_path / "engines.json").read_text()


def gated(manager: FakeManager):
    """A gate that logs into the manager's calls, so its order against restarts and loads shows."""
    return lambda name, serving: manager.calls.append(("unhold" if serving else "hold", name))


def test_a_revived_engine_takes_proxy_calls_only_once_it_holds_the_newest_weights():
    published = [(3, "/ckpt/v000003")]
    manager = FakeManager(on_restart=lambda: published.append((4, "/ckpt/v000004")))
    watch = watch_for(manager, latest=lambda: published[-1], gate=gated(manager))

    async def scenario():
        manager.kill("e1")
        await until(lambda: watch.restarts)

    supervised(watch, scenario)
    assert [c[:2] for c in manager.calls] == [("hold", "e1"), ("restart", "e1"), ("load", "e1"), ("unhold", "e1")]
    assert manager.calls[2] == ("load", "e1", "/ckpt/v000004", "4")


def test_a_lost_engine_stays_held_and_one_back_in_training_is_released_after_its_memory_is():
    """The hold is the watch's alone: released once the engine is back in any role (in training its cell's
    drain keeps calls off it until the backend's transition back loads the newest weights); never for a
    lost engine."""
    manager = FakeManager(names=("e0", "e1", "e2"), fail_restart={"e2"})
    watch = watch_for(manager, gate=gated(manager))

    async def scenario():
        await watch.engine_ops("e1", "training", manager.quiesce, manager.release_memory)
        manager.kill("e1", code=1)  # its cell trains: back with its memory released
        manager.kill("e2")  # its restart fails: lost, held for good
        await until(lambda: watch.restarts and watch.errors)

    supervised(watch, scenario)
    gates = [c for c in manager.calls if c[0] in ("hold", "unhold")]
    assert sorted(gates) == [("hold", "e1"), ("hold", "e2"), ("unhold", "e1")], manager.calls
    e1 = [c[0] for c in manager.calls if c[1:2] == ("e1",)]
    assert e1.index("unhold") > max(i for i, c in enumerate(e1) if c == "release"), e1  # after its memory is
    assert watch.lost == {"e2"} and watch.restarts[0]["role"] == "training"


def test_a_publish_during_the_restart_is_loaded_before_the_engine_counts_as_up():
    published = [(3, "/ckpt/v000003")]
    manager = FakeManager(on_restart=lambda: published.append((4, "/ckpt/v000004")))
    watch = watch_for(manager, latest=lambda: published[-1])

    async def scenario():
        manager.kill("e0")
        await until(lambda: manager.exited())
        assert "e0" in watch.unavailable()  # a publish now skips it
        await until(lambda: watch.restarts)

    supervised(watch, scenario)
    assert restarts(manager)[0][2] == ("/ckpt/v000003", "3")
    assert ("load", "e0", "/ckpt/v000004", "4") in manager.calls
    assert watch.restarts[0]["version"] == "4" and watch.unavailable() == set()


def test_a_publication_under_way_is_awaited_and_loaded_before_the_engine_counts_as_up():
    published, pending = [(3, "/ckpt/v000003")], []
    manager = FakeManager()
    watch = watch_for(manager, latest=lambda: published[-1], publishing=lambda: pending[-1] if pending else None)

    async def scenario():
        pending.append(asyncio.get_running_loop().create_future())  # a publish that skipped the dead engine
        manager.kill("e1")
        await until(lambda: len(restarts(manager)) == 1)
        await asyncio.sleep(0.1)
        assert "e1" in watch.down  # restarted, but held down until the publication ends
        published.append((4, "/ckpt/v000004"))
        pending[-1].set_result(None)
        await until(lambda: watch.restarts)

    supervised(watch, scenario)
    assert manager.calls[-1] == ("load", "e1", "/ckpt/v000004", "4") and watch.restarts[0]["version"] == "4"


def test_an_engine_whose_cell_trains_comes_back_with_its_memory_released():
    manager = FakeManager()
    watch = watch_for(manager)

    async def scenario():
        await watch.engine_ops("e1", "training", manager.quiesce, manager.release_memory)
        manager.calls.clear()
        manager.kill("e1", code=1)
        await until(lambda: watch.restarts)

    supervised(watch, scenario)
    assert manager.calls == [("restart", "e1", None, "gyre-engine-restart"), ("quiesce", "e1"), ("release", "e1")]
    assert manager.engines["e1"].released and watch.restarts[0]["role"] == "training"


def test_a_failing_restart_is_recorded_and_the_supervisor_goes_on():
    manager = FakeManager(names=("e0", "e1", "e2"), fail_restart={"e1"})
    watch = watch_for(manager)

    async def scenario():
        manager.kill("e1")
        await until(lambda: watch.errors)
        manager.kill("e2")
        await until(lambda: watch.restarts)
        await asyncio.sleep(0.1)
        assert await watch.engine_ops("e1", "rollout", manager.quiesce) is False  # lost: skipped

    supervised(watch, scenario)
    [error] = watch.errors
    assert "e1" in error and "/logs/e1.log" in error
    assert [c[1] for c in restarts(manager)] == ["e1", "e2"]  # the lost engine is never restarted again
    assert ("shutdown", "e1") in manager.calls and watch.lost == {"e1"} and "e1" in watch.unavailable()
    assert [r["engine"] for r in watch.restarts] == ["e2"]


def test_an_operation_on_a_dead_engine_revives_it_first():
    manager = FakeManager()
    watch = watch_for(manager)

    async def scenario():  # no supervise task: the backend's own operation finds the engine dead
        manager.kill("e0")
        assert await watch.engine_ops("e0", "rollout", manager.quiesce)

    asyncio.run(scenario())
    watch.close(timeout=5.0)
    assert [c[0] for c in manager.calls] == ["restart", "quiesce"]
    assert watch.role["e0"] == "rollout" and len(watch.restarts) == 1


def test_a_cell_going_to_training_does_not_wait_for_its_dead_engine():
    release = threading.Event()
    manager = FakeManager(on_restart=lambda: release.wait(5.0))
    watch = watch_for(manager)

    async def scenario():
        manager.kill("e1")
        await until(lambda: restarts(manager))  # the revive (rollout role) is under way
        assert await asyncio.wait_for(watch.engine_ops("e1", "training", manager.quiesce,
                                                       manager.release_memory), 1.0) is False
        release.set()
        await until(lambda: watch.restarts)

    supervised(watch, scenario)
    assert [c[0] for c in manager.calls] == ["restart", "quiesce", "release"]  # released once it was back
    assert manager.engines["e1"].released and watch.restarts[0]["role"] == "training"


def test_close_stops_the_restart_thread_and_restarts_nothing_after():
    manager = FakeManager()
    watch = watch_for(manager)
    thread = watch.thread.thread
    assert thread.is_alive()
    watch.close(timeout=5.0)
    assert not thread.is_alive()
    assert all(e.stopped for e in manager.engines.values())
    manager.engines["e0"] = FakeEngine("e0", pid=300, code=-9)  # a death seen after the end

    asyncio.run(watch.revive("e0", -9))
    assert restarts(manager) == [] and watch.restarts == []


def test_stop_abandons_a_revive_under_way_and_operations_on_the_engine_return():
    release = threading.Event()
    manager = FakeManager(on_restart=lambda: release.wait(5.0))  # a restart that takes long
    watch = watch_for(manager)

    async def scenario():
        manager.kill("e1")
        await until(lambda: restarts(manager))
        waiting = asyncio.ensure_future(watch.engine_ops("e1", "rollout", manager.quiesce))
        await asyncio.sleep(0.05)
        watch.stop()  # the run is over
        assert await asyncio.wait_for(waiting, 1.0) is False
        release.set()

    supervised(watch, scenario)
    assert watch.restarts == [] and ("quiesce", "e1") not in manager.calls


@pytest.mark.parametrize("code, text", [(-9, "killed by signal 9 (SIGKILL)"), (1, "exit code 1"),
                                        (-200, "killed by signal 200")])
def test_describe_exit(code, text):
    assert describe_exit(code) == text


# ---- the backend's publication with a watch: dead engines are skipped, one dying under it is survived ----------

class Ticket:
    def __init__(self, answer=None, error=None, during=None):
        self.answer, self.error, self.during = answer, error, during

    def result(self, timeout=None):
        if self.during is not None:
            self.during()
        if self.error is not None:
            raise self.error
        return self.answer


class Plane:
    def __init__(self, ticket: Ticket):
        self.ticket, self.sent = ticket, []

    def send(self, cell, op, **fields):
        self.sent.append((cell, op, fields))
        return self.ticket

    def prepare(self, cell, op, **fields):  # as TrainingPlane.prepare: the command, and its write (none here)
        return self.send(cell, op, **fields), lambda: None


def publishing_backend(tmp_path, manager, ticket, admin_calls=None):
    """A backend whose proxy admin API answers at once (``admin_calls`` gets each call's path)."""
    from gyre.config import SchedulerConfig
    from gyre.real.runtime.backend import RealBackend
    from gyre.real.runtime.proxy_admin import InlineAdmin

    def admin(method, path, body=None):
        if admin_calls is not None:
            admin_calls.append(path)
        return {"ok": True, "engines": []}

    reports = []
    parts = SimpleNamespace(engine_names={0: "e0", 1: "e1", 2: "e2"}, engines=manager, plane=Plane(ticket),
                            records_dir=tmp_path / "records", checkpoint_dir=tmp_path / "checkpoints",
                            watch=EngineWatch(manager, latest=lambda: None), publication="disk", engine_tp=1)
    cfg = SchedulerConfig(K=3, C_e=8, C_s=0, N=2, B=1, phi=0.0, mu=1, granularity="global")
    backend = RealBackend(cfg, parts, seed=0, token_budget=10, admin=InlineAdmin(admin))
    backend.bind(SimpleNamespace(report=lambda kind, **fields: reports.append((kind.__name__, fields))))
    return backend, reports


def publish(backend, version: int) -> None:
    from gyre import actions as act

    async def main():
        backend.on_publish(act.Publish(version))
        await asyncio.wait({backend.publisher.publishing})

    asyncio.run(main())


def test_a_publish_skips_an_engine_that_is_down(tmp_path):
    manager = FakeManager(names=("e0", "e1", "e2"))
    manager.kill("e1")
    backend, reports = publishing_backend(tmp_path, manager, Ticket(answer={"path": "/ckpt/v000001"}))
    publish(backend, 1)
    [(cell, op, fields)] = backend.parts.plane.sent
    assert (cell, op) == (0, "publish") and fields["endpoints"] == [manager.engines[n].url for n in ("e0", "e2")]
    assert backend.latest == (1, "/ckpt/v000001") and reports == [("PublishDone", {"version": 1})]


def test_an_engine_dying_under_a_publish_does_not_fail_it(tmp_path):
    from gyre.real.train.publish import PublishError, checkpoint_folder

    manager = FakeManager(names=("e0", "e1", "e2"))
    folder = checkpoint_folder(tmp_path / "checkpoints", 2)
    folder.mkdir(parents=True)  # the core cell wrote the checkpoint, then its load into e2 failed
    ticket = Ticket(error=PublishError("e2 unreachable"), during=lambda: manager.kill("e2"))
    backend, reports = publishing_backend(tmp_path, manager, ticket)
    publish(backend, 2)
    assert backend.errors == [] and backend.latest == (2, str(folder))
    loads = [c for c in manager.calls if c[0] == "load"]
    assert loads == [("load", "e0", str(folder), "2"), ("load", "e1", str(folder), "2")]
    assert reports == [("PublishDone", {"version": 2})]


def test_a_publish_failing_on_a_live_engine_still_fails(tmp_path):
    from gyre.real.train.publish import PublishError, checkpoint_folder

    manager = FakeManager(names=("e0", "e1", "e2"))
    checkpoint_folder(tmp_path / "checkpoints", 3).mkdir(parents=True)
    backend, reports = publishing_backend(tmp_path, manager, Ticket(error=PublishError("e1 refused")))
    publish(backend, 3)
    assert len(backend.errors) == 1 and "e1 refused" in backend.errors[0] and reports == []


def test_stop_ends_the_queue_watcher_of_a_batch_the_run_never_trained(tmp_path):
    """A batch opened for the next burst when the run ends: ``stop`` abandons its step, and its queue watcher
    stops polling (before, it polled on until ``stop``'s 120 s wait for the backend's tasks ran out)."""
    from gyre import actions as act
    from gyre.config import SchedulerConfig
    from gyre.real.runtime.backend import RealBackend

    abandoned = threading.Event()

    class StepTicket:
        def result(self, timeout=None):
            abandoned.wait(timeout)
            raise RuntimeError("step abandoned (the run is over)")

    class Runner:
        async def cancel(self, x):
            pass

        async def close(self):
            pass

    queues = SimpleNamespace(queue=lambda version: SimpleNamespace(ready_count=lambda: 0))
    plane = SimpleNamespace(prepare=lambda cell, op, **fields: (StepTicket(), lambda: None), abandon=abandoned.set,
                            queues=queues)
    parts = SimpleNamespace(engine_names={0: "e0"}, plane=plane, runner=Runner(), records_dir=tmp_path / "records",
                            watch=None, proxy_url="http://127.0.0.1:9", admin_token="-")  # no admin call made
    cfg = SchedulerConfig(K=1, C_e=8, C_s=0, N=2, B=1, phi=0.0, mu=1, granularity="global")
    backend = RealBackend(cfg, parts, seed=0, token_budget=10).bind(SimpleNamespace(report=lambda kind, **f: None))

    async def main():
        backend.on_start_batch(act.StartBatch(5, False))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(backend.stop(), 30.0)  # a hang guard, not a timing check

    asyncio.run(main())
    assert backend.tasks == set() and len(backend.errors_after_stop) == 1


def test_the_backends_gate_holds_apart_from_the_drains_of_roles(tmp_path):
    """``RealBackend.gate_engine`` holds and releases an engine, whatever its cell's role; a transition back
    to rollout undrains its engine even while the watch revives it (the hold keeps calls off it); a
    restarted proxy gets the drains of training cells and the holds of down engines back."""
    manager = FakeManager(names=("e0", "e1", "e2"))
    calls = []
    backend, _ = publishing_backend(tmp_path, manager, Ticket(), admin_calls=calls)
    backend.cells.restore(dict(backend.cells.snapshot(), rollout_ready=[0, 1]))  # cell 2 trains

    async def gate_and_reapply():
        backend.gate_engine("e1", False)
        backend.gate_engine("e1", True)
        backend.gate_engine("e2", False)
        assert calls == ["/admin/engines/e1/hold", "/admin/engines/e1/release", "/admin/engines/e2/hold"]
        calls.clear()
        manager.kill("e0")  # found dead: a publish or a restarted proxy must not count on it
        backend.reapply_proxy_state()
        assert calls == ["/admin/engines/e0/hold", "/admin/engines/e2/drain"]

    asyncio.run(gate_and_reapply())

    calls.clear()
    backend.parts.watch.down.add("e2")  # cell 2 goes back to rollout while the watch revives its engine
    backend.parts.watch.down.discard("e0")
    manager.engines["e0"].code = None

    async def back_to_rollout():
        backend.cells.engine_ops = lambda name, role, *ops: asyncio.sleep(0)  # the watch's own, tested above
        await backend.cells.to_rollout(2, Ticket())

    asyncio.run(back_to_rollout())
    assert calls[-1] == "/admin/engines/e2/undrain" and 2 in backend.rollout_ready
    assert "/admin/engines/e2/release" not in calls  # the watch's, once the engine is back
