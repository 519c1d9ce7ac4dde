"""The real-time controller: the same core, wall-clock time, replayable event log.

The backend here is a timed test double at the outer edge (asyncio timers in
place of harnesses, engines and training cells); the controller, the policy
core and the replay path are the real ones.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gyre import actions as act
from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.real.runtime.controller import Controller, ControllerError
from gyre.scheduler import Scheduler
from gyre.formats.eventlog import replay, replay_run
from gyre.loop import ActionFailed, ActionHandler

CFG = SchedulerConfig(K=3, C_e=4, C_s=2, N=2, B=2, phi=0.5, mu=2, rho_min=0.5, tau=0.02, granularity="fine")


class TimedBackend(ActionHandler):
    """Executions last a few milliseconds; transitions, steps and publications too."""

    def __init__(self, cfg: SchedulerConfig, seed: int, fail_on: type | None = None) -> None:
        self.cfg, self.rng, self.fail_on = cfg, np.random.default_rng(seed), fail_on
        self.ctl: Controller | None = None
        self.closed: dict[int, int] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.fed = self.wanted = 0

    def later(self, seconds: float, kind: type, **fields) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(seconds, lambda: self.ctl.report(kind, **fields))

    def refuse(self, a: act.Action) -> None:
        if self.fail_on is not None and isinstance(a, self.fail_on):
            raise OSError("engine refused the connection")

    def on_dispatch_groups(self, a: act.DispatchGroups) -> None:
        self.refuse(a)

    def on_start_executions(self, a: act.StartExecutions) -> None:
        self.refuse(a)
        for x, _engine in a.placements:
            delay = float(self.rng.exponential(0.015))
            self.timers[x] = asyncio.get_running_loop().call_later(delay, self.finish, x)

    def on_cancel_executions(self, a: act.CancelExecutions) -> None:
        self.refuse(a)
        for x in a.executions:
            self.timers.pop(x).cancel()
            self.ctl.report(ev.ExecutionFinished, execution=x, outcome="cancelled")

    def on_reroute(self, a: act.Reroute) -> None:
        self.refuse(a)

    def on_begin_transition(self, a: act.BeginTransition) -> None:
        self.refuse(a)
        self.later(0.005, ev.TransitionDone, cell=a.cell, role=a.role)

    def on_start_batch(self, a: act.StartBatch) -> None:
        self.refuse(a)
        self.fed, self.wanted = 0, 0
        self.want()

    def on_feed_groups(self, a: act.FeedGroups) -> None:
        self.refuse(a)
        self.fed += len(a.groups)
        self.wanted -= len(a.groups)
        if self.fed == self.cfg.B:
            self.later(0.01, ev.StepDone, version=a.version)
        else:
            self.want()

    def on_broadcast(self, a: act.Broadcast) -> None:
        self.refuse(a)

    def on_publish(self, a: act.Publish) -> None:
        self.refuse(a)
        self.later(0.005, ev.PublishDone, version=a.version)

    def want(self) -> None:
        if self.cfg.streaming and self.fed + self.wanted < self.cfg.B:
            self.wanted += 1
            self.ctl.report(ev.GroupWanted)

    def finish(self, x: int) -> None:
        self.timers.pop(x)
        self.ctl.report(ev.ExecutionFinished, execution=x, outcome="completed")
        g = x // self.cfg.group_size
        self.closed[g] = self.closed.get(g, 0) + 1
        if self.closed[g] == self.cfg.N:
            self.ctl.report(ev.GroupReady, group=g)


def run(cfg: SchedulerConfig, steps: int, seed: int = 0, fail_on: type | None = None) -> Controller:
    backend = TimedBackend(cfg, seed, fail_on)
    ctl = Controller(cfg, backend)
    backend.ctl = ctl
    asyncio.run(ctl.run(steps, timeout_s=30))
    return ctl


@pytest.mark.timeout(60)
def test_controller_log_replays_to_the_same_actions(tmp_path):
    ctl = run(CFG, steps=4)
    assert ctl.core.version == 4
    times = [row["now"] for row in ctl.log.rows]
    assert times == sorted(times)
    kinds = {row["kind"] for row in ctl.log.actions}
    assert {"begin_transition", "publish", "feed_groups", "start_executions"} <= kinds
    events = [ev.event_from_dict({k: v for k, v in row.items() if k != "seq"}) for row in ctl.log.rows]
    assert replay(CFG, events) == ctl.log.actions
    assert replay_run(ctl.write_log(tmp_path / "run")) == ctl.log.actions


@pytest.mark.timeout(60)
def test_supply_timer_fires_as_tick_without_other_events():
    """A Tick arrives when the supply timer expires, and that Tick is what starts a transition."""
    cfg = CFG.replace_fields(tau=0.05)
    ctl = run(cfg, steps=2, seed=1)
    core, switched_on_tick = Scheduler(cfg), []
    for event in ctl.log.events():
        since = core.supply_since
        actions = core.handle(event)
        if isinstance(event, ev.Tick) and any(isinstance(a, act.BeginTransition) for a in actions):
            assert since is not None and event.now >= since + cfg.tau - 1e-9, "a Tick fired before tau elapsed"
            switched_on_tick.append(event)
    assert switched_on_tick, "no transition was started by a supply-timer Tick"


@pytest.mark.timeout(60)
def test_backend_failure_names_the_action_and_keeps_the_log(tmp_path):
    backend = TimedBackend(CFG, 0, fail_on=act.BeginTransition)
    ctl = Controller(CFG, backend)
    backend.ctl = ctl
    with pytest.raises(ActionFailed, match="BeginTransition.*engine refused"):
        asyncio.run(ctl.run(2, timeout_s=30))
    assert ctl.log.rows and ctl.log.rows[0]["kind"] == "begin"
    out = ctl.write_log(tmp_path / "failed")
    replayed = replay_run(out)
    assert replayed[:len(ctl.log.actions)] == ctl.log.actions
    failed = [a for a in ctl.log.actions if a["kind"] == "begin_transition"]
    assert failed and failed[-1]["role"] == "training"  # the refused action is in the kept log


def test_report_before_run_is_an_error():
    with pytest.raises(ControllerError, match="before run"):
        Controller(CFG, TimedBackend(CFG, 0)).report(ev.GroupWanted)


@pytest.mark.timeout(60)
def test_finish_publication_waits_for_the_last_burst_to_publish():
    backend = TimedBackend(CFG, 2)
    ctl = Controller(CFG, backend)
    backend.ctl = ctl
    asyncio.run(ctl.run(2, timeout_s=30, finish_publication=True))  # mu = 2: step 2 ends a burst
    assert ctl.core.version == 2 and not ctl.core.awaiting_publish and ctl.core.published == 2
    assert ctl.log.rows[-1]["kind"] == "publish_done"


@pytest.mark.timeout(60)
def test_the_clock_starts_with_the_run_and_a_resumed_core_goes_on_from_its_last_event():
    """Set-up between construction and ``run`` is not in the log's time; a resumed core's clock starts at
    its replayed ``now`` (so a resumed log is continuous: ``analysis.calibrate``)."""
    import time

    first = run(CFG, steps=2)
    resumed_core = Scheduler(CFG)
    for event in first.log.events():
        resumed_core.handle(event)
    backend = TimedBackend(CFG, 0)
    ctl = Controller(CFG, backend, core=resumed_core)
    backend.ctl = ctl
    offset = resumed_core.now
    time.sleep(0.3)  # set-up (a restore) before the run
    assert ctl.clock() == offset
    started = []

    def resume() -> None:  # where the replayed log's outstanding actions are applied again
        started.append(ctl.clock())

    asyncio.run(ctl.run(2, timeout_s=30, resume=resume))  # the replayed core is at step 2 already
    assert offset > 0 and started[0] - offset < 0.2, (offset, started)
    fresh = Controller(CFG, TimedBackend(CFG, 0))
    time.sleep(0.3)
    fresh.backend.ctl = fresh
    asyncio.run(fresh.run(1, timeout_s=30))
    assert fresh.log.rows[0]["kind"] == "begin" and fresh.log.rows[0]["now"] < 0.2
