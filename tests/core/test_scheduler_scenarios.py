"""Hand-computed scenarios for Eq. 2, the supply timer and the end-of-burst rule."""

from __future__ import annotations

import pytest

from gyre import actions as act
from gyre import events as ev
from gyre import rules
from gyre.config import SchedulerConfig
from gyre.scheduler import PolicyError, Scheduler


class Drive:
    """A tiny manual driver: sends events, keeps every action, tracks placements."""

    def __init__(self, **fields) -> None:
        self.cfg = SchedulerConfig(**fields)
        self.s = Scheduler(self.cfg)
        self.log: list[act.Action] = []
        self.last: list[act.Action] = []
        self.send(ev.Begin(0.0))

    def send(self, event: ev.Event) -> list[act.Action]:
        self.last = self.s.handle(event)
        self.log += self.last
        return self.last

    def kinds(self, kind: type) -> list:
        return [a for a in self.last if isinstance(a, kind)]

    def transitions(self) -> list[act.BeginTransition]:
        return [a for a in self.log if isinstance(a, act.BeginTransition)]

    def finish_group(self, group: int, now: float, ready: bool = True) -> None:
        for x in self.s.executions_of(group):
            self.send(ev.ExecutionFinished(now, x))
        if ready:
            self.send(ev.GroupReady(now, group))


def test_initial_dispatch_and_start_rule():
    d = Drive(K=2, C_e=4, N=2, B=2, phi=1.0, mu=1, granularity="fine")
    dispatch, start = d.log[0], d.log[1]
    assert dispatch == act.DispatchGroups((0, 1, 2, 3), 0)  # (phi + mu) * B = 4 groups
    assert d.s.d == 8 and d.s.p == 8 and d.s.f == 0  # min(d - p, C_R - running) = min(8, 8)
    # separate pool first (none here), then cells in reverse index order
    assert [e for _, e in start.placements] == [1, 1, 1, 1, 0, 0, 0, 0]


def test_eq2_blocks_until_remaining_capacity_covers_outstanding_work():
    d = Drive(K=2, C_e=4, N=2, B=2, phi=1.0, mu=1, rho_min=0.5, tau=0.0, granularity="fine")
    d.finish_group(0, 10.0)  # w = 6 > C_R - C_e = 8 - 4; one ready group >= rho_min * B
    assert d.s.waterlevel == 6 and not d.transitions()
    d.send(ev.ExecutionFinished(20.0, 2))  # w = 5: still blocked
    assert not d.transitions()
    d.send(ev.ExecutionFinished(30.0, 3))  # w = 4 = 8 - 4: Eq. 2 holds (group 1 not ready yet)
    assert d.kinds(act.BeginTransition) == [act.BeginTransition(0, "training")]
    # the core's four executions (4..7) move to cell 1 before the cell switches
    assert d.kinds(act.Reroute) == [act.Reroute(x, 0, 1) for x in (4, 5, 6, 7)]
    assert d.s.capacity == 4 and d.s.placements() == {x: 1 for x in (4, 5, 6, 7)}


@pytest.mark.parametrize(("early", "elapsed"), [(5e-10, True), (2e-9, False)])
def test_the_supply_timer_elapses_within_rules_timer_elapsed_tolerance(early, elapsed):
    """``handle`` tests the timer inline with ``rules.timer_elapsed``'s bound (tau less 1e-9): a Tick a
    hair before the deadline switches exactly when the rule says the timer has elapsed."""
    d = Drive(K=3, C_e=8, N=2, B=2, phi=0.0, mu=2, rho_min=0.5, tau=10.0, granularity="fine")
    d.finish_group(0, 5.0)
    assert rules.timer_elapsed(d.cfg, 5.0, 15.0 - early) is elapsed
    d.send(ev.Tick(15.0 - early))
    assert (d.kinds(act.BeginTransition) == [act.BeginTransition(0, "training")]) is elapsed


def test_supply_timer_must_hold_for_tau_and_restarts_after_a_drop():
    d = Drive(K=3, C_e=8, N=2, B=2, phi=0.0, mu=2, rho_min=0.5, tau=10.0, granularity="fine")
    d.finish_group(0, 5.0)  # supply 1 >= rho_min * B from t = 5
    assert d.s.supply_since == 5.0 and d.s.next_deadline() == 15.0
    d.send(ev.Tick(14.9))
    assert not d.transitions()
    d.send(ev.Tick(15.0))
    assert d.kinds(act.BeginTransition) == [act.BeginTransition(0, "training")]
    d.send(ev.TransitionDone(20.0, 0, "training"))
    assert d.kinds(act.StartBatch) == [act.StartBatch(0, final=False)]  # mu = 2: the first of two updates
    assert d.s.supply_since == 20.0  # restarted at the transition and the batch start
    d.send(ev.GroupWanted(21.0))  # the batch takes group 0: supply drops to 0
    assert d.kinds(act.FeedGroups) == [act.FeedGroups(0, (0,))]
    assert d.s.supply_since is None and d.s.next_deadline() is None
    d.finish_group(1, 25.0)  # supply back at t = 25: the satellite may go at 35, not 30
    assert d.s.next_deadline() == 35.0
    d.send(ev.Tick(34.0))
    assert not d.kinds(act.BeginTransition)
    d.send(ev.Tick(35.0))
    assert d.kinds(act.BeginTransition) == [act.BeginTransition(1, "training")]


def test_supply_is_capped_by_what_the_batch_still_needs():
    d = Drive(K=3, C_e=8, N=1, B=4, phi=1.0, mu=1, rho_min=0.75, tau=5.0, granularity="fine")
    for g in (0, 1, 2):
        d.finish_group(g, 1.0)  # supply 3 >= 0.75 * 4 from t = 1
    d.send(ev.Tick(6.0))
    assert d.transitions() == [act.BeginTransition(0, "training")]
    d.send(ev.TransitionDone(7.0, 0, "training"))
    for _ in range(3):
        d.send(ev.GroupWanted(7.0))  # the batch takes groups 0, 1, 2 and needs one more
    for g in (3, 4, 5, 6):
        d.finish_group(g, 8.0)
    # four ready groups, but the batch needs only 1: supply = min(4, 1) < rho_min * B
    assert d.s.ready_unclaimed == 4
    d.send(ev.Tick(100.0))
    assert d.transitions() == [act.BeginTransition(0, "training")]


def end_of_burst(C_s: int, extra_ready: int) -> Drive:
    """K=2 fine, one-step bursts: train group 0 and stop at the burst end."""
    d = Drive(K=2, C_e=4, C_s=C_s, N=1, B=1, phi=2.0, mu=1, rho_min=1.0, tau=0.0, granularity="fine")
    d.finish_group(0, 1.0)
    d.send(ev.TransitionDone(2.0, 0, "training"))
    d.send(ev.GroupWanted(2.0))
    for g in range(1, 1 + extra_ready):
        d.finish_group(g, 3.0)
    d.send(ev.StepDone(10.0, 0))
    return d


def test_end_of_burst_core_stays_when_supply_and_eq3_hold():
    # w = 3 - 1 - extra_ready = 0 (2 ready), incoming mu*N*B = 1 <= C_s + (K-1) C_e = 4
    d = end_of_burst(C_s=0, extra_ready=2)
    assert d.last == [act.Publish(1)]
    d.send(ev.PublishDone(12.0, 1))
    assert act.DispatchGroups((3,), 1) in d.last and act.StartBatch(1, final=True) in d.last  # mu = 1: every update ends a burst


def test_end_of_burst_core_returns_without_ready_supply():
    d = end_of_burst(C_s=0, extra_ready=0)  # nothing ready for the next batch
    assert d.last == [act.Publish(1), act.BeginTransition(0, "rollout")]
    d.send(ev.PublishDone(12.0, 1))
    assert not d.kinds(act.StartBatch)


def test_end_of_burst_core_returns_when_eq3_fails():
    # raise N so that w + mu*N*B exceeds C_s + (K-1) C_e = 4 although supply holds
    d = Drive(K=2, C_e=4, N=3, B=1, phi=1.0, mu=1, rho_min=1.0, tau=0.0, granularity="fine")
    d.finish_group(0, 1.0)
    d.send(ev.TransitionDone(2.0, 0, "training"))
    d.send(ev.GroupWanted(2.0))
    d.finish_group(1, 3.0)
    assert d.s.waterlevel == 0 and d.s.ready_unclaimed == 1
    d.send(ev.StepDone(10.0, 0))  # 0 + 1 * 3 * 1 <= 4 holds: stays
    assert act.BeginTransition(0, "rollout") not in d.last
    d2 = Drive(K=2, C_e=2, N=3, B=1, phi=1.0, mu=1, rho_min=1.0, tau=0.0, granularity="fine")
    d2.finish_group(0, 1.0)  # w = 3 > (K-1) C_e = 2: the core cannot go yet
    assert not d2.kinds(act.BeginTransition)
    d2.finish_group(1, 1.5)  # w = 0
    d2.send(ev.TransitionDone(2.0, 0, "training"))
    d2.send(ev.GroupWanted(2.0))
    assert d2.s.ready_unclaimed == 1
    d2.send(ev.StepDone(10.0, 0))  # supply holds, but 0 + 3 > C_s + (K-1) C_e = 2: returns
    assert d2.last == [act.Publish(1), act.BeginTransition(0, "rollout")]


def test_satellites_return_and_broadcast_inside_a_burst():
    d = Drive(K=2, C_e=8, C_s=8, N=1, B=2, phi=0.0, mu=2, rho_min=0.5, tau=0.0, granularity="fine")
    d.finish_group(0, 1.0)
    d.send(ev.TransitionDone(2.0, 0, "training"))
    assert d.kinds(act.BeginTransition) == [act.BeginTransition(1, "training")]  # 1 ready of B=2
    d.send(ev.TransitionDone(3.0, 1, "training"))
    assert d.s.training_cells() == (0, 1)
    d.send(ev.GroupWanted(3.0))
    d.send(ev.GroupWanted(3.0))
    d.finish_group(1, 4.0)
    d.send(ev.StepDone(5.0, 0))
    assert d.last[0] == act.Broadcast(1, (1,)) and act.StartBatch(1, final=True) in d.last  # the second of mu = 2
    for g in (2, 3):
        d.finish_group(g, 6.0)
    d.send(ev.GroupWanted(6.0))
    d.send(ev.GroupWanted(6.0))
    d.send(ev.StepDone(7.0, 1))
    assert d.last[:2] == [act.Publish(2), act.BeginTransition(1, "rollout")]


def test_global_granularity_waits_for_every_rollout():
    d = Drive(K=2, C_e=4, N=2, B=1, phi=0.0, mu=2, rho_min=1.0, tau=0.0, granularity="global")
    d.finish_group(0, 1.0)  # w = 2: global needs w == 0
    assert not d.transitions()
    d.finish_group(1, 2.0, ready=False)  # w = 0 with group 0 ready: the whole block goes
    assert d.kinds(act.BeginTransition) == [act.BeginTransition(0, "training"), act.BeginTransition(1, "training")]


def test_oversampling_cancels_surplus_once_n_closed():
    d = Drive(K=1, C_e=3, C_s=0, N=2, B=1, phi=0.0, mu=1, oversample=2, granularity="fine")
    # group of 4, capacity 3: executions 0,1,2 run, 3 waits
    d.send(ev.ExecutionFinished(1.0, 0))
    assert d.kinds(act.StartExecutions) == [act.StartExecutions(((3, 0),))]
    d.send(ev.ExecutionFinished(1.0, 1))
    d.send(ev.GroupReady(2.0, 0))
    assert d.kinds(act.CancelExecutions) == [act.CancelExecutions((2, 3), ())]
    d.send(ev.ExecutionFinished(3.0, 2, "cancelled"))
    d.send(ev.ExecutionFinished(3.0, 3, "cancelled"))
    assert (d.s.d, d.s.p, d.s.f) == (4, 4, 4)


def test_illegal_events_raise_with_clear_messages():
    d = Drive(K=1, C_e=1, N=2, B=1, phi=0.0, mu=1, granularity="fine")
    assert d.s.placements() == {0: 0}
    with pytest.raises(PolicyError, match="never started"):
        d.send(ev.ExecutionFinished(1.0, 1))
    with pytest.raises(PolicyError, match="not running"):
        d.send(ev.ExecutionFinished(1.0, 99))
    with pytest.raises(PolicyError, match="earlier"):
        d.send(ev.Tick(-1.0))
    with pytest.raises(PolicyError, match="only 0 of 2"):
        d.send(ev.GroupReady(1.0, 0))
    with pytest.raises(PolicyError, match="cell 0 finished a switch"):
        d.send(ev.TransitionDone(1.0, 0, "training"))
    with pytest.raises(PolicyError, match="before Begin"):
        Scheduler(d.cfg).handle(ev.Tick(0.0))


def test_streaming_off_reserves_the_whole_burst_then_trains_back_to_back():
    """docs/scheduler.md#baselines-and-ablations: mu = 2, B = 1: update 0 waits for 2 ready groups; update 1 is fed at
    its StartBatch;
    a group ready in between (older or not) waits for the next burst."""
    d = Drive(K=1, C_e=8, C_s=8, N=1, B=1, phi=1.0, mu=2, rho_min=1.0, tau=0.0, granularity="coarse",
              streaming=False)
    d.finish_group(0, 1.0)
    d.send(ev.TransitionDone(2.0, 0, "training"))
    assert d.kinds(act.StartBatch) == [act.StartBatch(0, final=False)] and not d.kinds(act.FeedGroups)
    d.finish_group(2, 3.0)
    assert d.kinds(act.FeedGroups) == [act.FeedGroups(0, (0,))]  # the reserve is {0, 2}, oldest first
    d.finish_group(1, 4.0)  # ready after the reservation: not part of this burst
    d.send(ev.StepDone(5.0, 0))
    assert d.kinds(act.StartBatch) == [act.StartBatch(1, final=True)]
    assert d.kinds(act.FeedGroups) == [act.FeedGroups(1, (2,))]
    assert d.s.ready_unclaimed == 1


# ---- a stopped harness frees its slot (HarnessStopped) -----------------------------------------------
def test_a_stopped_harness_frees_its_slot_but_stays_in_the_waterlevel():
    """C_e = 2 on one rollout cell, one group of 3: two start; the third starts when a harness stops,
    while w = d - f stays 3; the execution's ExecutionFinished later releases nothing more."""
    d = Drive(K=1, C_e=2, C_s=0, N=3, B=1, phi=0.0, mu=1, granularity="fine")
    assert d.s.placements() == {0: 0, 1: 0} and (d.s.d, d.s.p, d.s.f) == (3, 2, 0)
    d.send(ev.HarnessStopped(10.0, 0))
    assert d.kinds(act.StartExecutions) == [act.StartExecutions(((2, 0),))]
    assert d.s.placements() == {1: 0, 2: 0} and d.s.waterlevel == 3
    assert (d.s.running, d.s.holding, d.s.stopped_executions()) == (3, 2, frozenset({0}))
    d.send(ev.ExecutionFinished(40.0, 0, "harness_timeout"))
    assert d.last == [] and d.s.placements() == {1: 0, 2: 0}  # no second release, nothing to start
    assert (d.s.waterlevel, d.s.running, d.s.holding, d.s.stopped_executions()) == (2, 2, 2, frozenset())
    assert d.s.engine_load(0) == 2


def test_a_stopped_harness_is_never_rerouted_and_is_cancelled_into_f_only():
    d = Drive(K=2, C_e=2, C_s=0, N=2, B=1, phi=0.0, mu=1, oversample=1, rho_min=1.0, tau=0.0,
              granularity="fine")
    assert d.s.placements() == {0: 1, 1: 1, 2: 0}  # a group of 3; cell 1 first
    d.send(ev.HarnessStopped(1.0, 2))  # the only execution on cell 0 (the core)
    d.send(ev.ExecutionFinished(2.0, 0))
    d.send(ev.ExecutionFinished(2.0, 1))
    d.send(ev.GroupReady(3.0, 0))  # w = 1 <= C_R - C_e = 2: the core may switch; 2 is the surplus
    assert d.kinds(act.CancelExecutions) == [act.CancelExecutions((2,), ())]
    assert d.kinds(act.BeginTransition) == [act.BeginTransition(0, "training")]
    assert not d.kinds(act.Reroute)  # execution 2 sits on no engine: nothing moves
    p, f = d.s.p, d.s.f
    d.send(ev.ExecutionFinished(4.0, 2, "cancelled"))
    assert (d.s.p, d.s.f, d.s.holding) == (p, f + 1, 0)


def test_illegal_harness_stops_raise_and_change_nothing():
    d = Drive(K=1, C_e=1, N=2, B=1, phi=0.0, mu=1, granularity="fine")
    with pytest.raises(PolicyError, match="never dispatched"):
        d.send(ev.HarnessStopped(1.0, 99))
    with pytest.raises(PolicyError, match="never started"):
        d.send(ev.HarnessStopped(1.0, 1))
    d.send(ev.HarnessStopped(1.0, 0))
    with pytest.raises(PolicyError, match="stopped twice"):
        d.send(ev.HarnessStopped(2.0, 0))
    d.send(ev.ExecutionFinished(3.0, 0))
    with pytest.raises(PolicyError, match="already finished"):
        d.send(ev.HarnessStopped(4.0, 0))
    with pytest.raises(PolicyError, match="not running"):
        d.send(ev.ExecutionFinished(4.0, 0))
    assert (d.s.p, d.s.f, d.s.placements(), d.s.now) == (2, 1, {1: 0}, 3.0)
