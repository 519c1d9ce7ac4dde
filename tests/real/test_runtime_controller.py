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
from gyre.real.runtime_controller import Controller, ControllerError
from gyre.sim.replay import replay, replay_run

CFG = SchedulerConfig(K=3, C_e=4, C_s=2, N=2, B=2, phi=0.5, mu=2, rho_min=0.5, tau=0.02, granularity="fine")


class TimedBackend:
    """Executions last a few milliseconds; transitions, steps and publications too."""

    def __init__(self, cfg: SchedulerConfig, seed: int, fail_on: type | None = None) -> None:
        self.cfg, self.rng, self.fail_on = cfg, np.random.default_rng(seed), fail_on
        self.ctl: Controller | None = None
        self.closed: dict[int, int] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.fed = self.wanted = 0

    def later(self, seconds: float, kind: type, **fields) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(seconds, lambda: self.ctl.report(kind, **fields))

    def apply(self, a: act.Action) -> None:
        if self.fail_on is not None and isinstance(a, self.fail_on):
            raise OSError("engine refused the connection")
        if isinstance(a, act.StartExecutions):
            for x, _engine in a.placements:
                delay = float(self.rng.exponential(0.015))
                self.timers[x] = asyncio.get_running_loop().call_later(delay, self.finish, x)
        elif isinstance(a, act.BeginTransition):
            self.later(0.005, ev.TransitionDone, cell=a.cell, role=a.role)
        elif isinstance(a, act.StartBatch):
            self.fed, self.wanted = 0, 0
            self.want()
        elif isinstance(a, act.FeedGroups):
            self.fed += len(a.groups)
            self.wanted -= len(a.groups)
            if self.fed == self.cfg.B:
                self.later(0.01, ev.StepDone, version=a.version)
            else:
                self.want()
        elif isinstance(a, act.Publish):
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
    times = [row["now"] for row in ctl.events]
    assert times == sorted(times)
    kinds = {row["kind"] for row in ctl.actions}
    assert {"begin_transition", "publish", "feed_groups", "start_executions"} <= kinds
    events = [ev.event_from_dict({k: v for k, v in row.items() if k != "seq"}) for row in ctl.events]
    assert replay(CFG, events) == ctl.actions
    assert replay_run(ctl.write_log(tmp_path / "run")) == ctl.actions


@pytest.mark.timeout(60)
def test_supply_timer_fires_as_tick_without_other_events():
    cfg = CFG.replace_fields(tau=0.05)
    ctl = run(cfg, steps=2, seed=1)
    ticks = [row for row in ctl.events if row["kind"] == "tick"]
    assert ticks, "the supply timer never expired into a Tick"
    transitions = [i for i, row in enumerate(ctl.actions) if row["kind"] == "begin_transition"]
    assert transitions


@pytest.mark.timeout(60)
def test_backend_failure_names_the_action_and_keeps_the_log(tmp_path):
    backend = TimedBackend(CFG, 0, fail_on=act.BeginTransition)
    ctl = Controller(CFG, backend)
    backend.ctl = ctl
    with pytest.raises(ControllerError, match="BeginTransition"):
        asyncio.run(ctl.run(2, timeout_s=30))
    assert ctl.events and ctl.events[0]["kind"] == "begin"
    out = ctl.write_log(tmp_path / "failed")
    replayed = replay_run(out)
    assert replayed[:len(ctl.actions)] == ctl.actions  # the failing action is the last one recorded


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
    assert ctl.events[-1]["kind"] == "publish_done"
