"""Hypothesis state machine: random legal and illegal event sequences against a model.

The model mirrors what a driver can know from the actions alone (which
executions run, which cells are switching, which batch is open) and checks the
the invariants (docs/scheduler.md) of ``gyre.scheduler`` after every step. It is an
``ActionHandler`` driven through the shared ``gyre.loop.DriverLoop``, like the
simulator and the real controller; its event log must replay to the same
actions at every step. ``running`` holds the executions that hold a rollout
slot, ``stopped`` those whose harness stopped (HarnessStopped) before they
finished: they hold no slot but stay in the waterlevel. The machine reads the
core only through its public views: ``Scheduler.snapshot()`` (whose copy must
agree with the model and never change once taken) and the read-only properties.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import pytest
from hypothesis import HealthCheck, assume, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from hypothesis_budget import examples

from gyre import actions as act
from gyre import events as ev
from gyre.actions import SEPARATE
from gyre.config import ConfigError, SchedulerConfig
from gyre.formats.eventlog import replay
from gyre.loop import ActionHandler, DriverLoop
from gyre.scheduler import PolicyError, Scheduler


@st.composite
def configs(draw) -> SchedulerConfig:
    granularity = draw(st.sampled_from(["none", "global", "coarse", "fine"]))
    K = draw(st.integers(1, 4))
    C_s = draw(st.sampled_from([0, 0, 2, 5]))
    static = draw(st.integers(1, K)) if granularity == "none" else 0
    B = draw(st.integers(1, 3))
    phi = draw(st.sampled_from([0.0, 0.5, 1.0, 1.5]))
    assume(abs(phi * B - round(phi * B)) < 1e-9)
    try:
        return SchedulerConfig(
            K=K, C_e=draw(st.integers(1, 6)), C_s=C_s, N=draw(st.integers(1, 3)), B=B, phi=phi,
            mu=draw(st.integers(1, 3)), rho_min=draw(st.sampled_from([0.3, 0.5, 1.0])),
            tau=draw(st.sampled_from([0.0, 5.0])), granularity=granularity,
            streaming=draw(st.booleans()), static_train_cells=static, oversample=draw(st.integers(0, 1)),
            dispatch=draw(st.sampled_from(["boundary", "boundary", "continuous"])))
    except ConfigError:
        assume(False)  # an impossible drawn config is rejected, never swapped for a fixed one
        raise


def plain(snap) -> dict:
    """A snapshot's fields as plain values (mappings copied), to compare one taken earlier with itself."""
    return {f.name: dict(v) if isinstance(v := getattr(snap, f.name), Mapping) else v
            for f in dataclasses.fields(snap)}


class SchedulerMachine(RuleBasedStateMachine, ActionHandler):
    @initialize(cfg=configs())
    def start(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.s = Scheduler(cfg)
        self.loop = DriverLoop(self.s, self)
        self.now = 0.0
        self.queued: set[int] = set()
        self.running: set[int] = set()
        self.stopped: set[int] = set()
        self.ended: set[int] = set()
        self.closed: dict[int, int] = {}
        self.ready_sent: set[int] = set()
        self.ready_unfed: dict[int, int] = {}  # group -> v_d
        self.v_d: dict[int, int] = {}
        self.v_t: dict[int, int] = {}
        self.taken: tuple | None = None  # an earlier snapshot and its plain values then
        self.fed_groups: set[int] = set()
        self.dropped_groups: set[int] = set()
        self.reserve: dict[int, int] = {}  # streaming off: groups the current burst may draw from
        self.allowance = 0  # waterlevel rise allowed by replacements of dropped groups
        self.switching: dict[int, str] = {}
        self.batch: int | None = None
        self.fed = 0
        self.wanted = 0
        self.publishing: int | None = None
        self.prev_counters = (0, 0, 0)
        self.prev_w = (None, None)
        self.started = self.dropped = self.finished = self.dispatched = 0
        self.send(ev.Begin(0.0))

    # ---- the driver side: apply actions to the model -------------------------
    def send(self, event: ev.Event) -> None:
        self.last_started = 0
        self.loop.feed(event)

    def on_dispatch_groups(self, a: act.DispatchGroups) -> None:
        assert a.version == self.s.published
        for g in a.groups:
            self.v_d[g] = a.version
            self.queued.update(self.s.executions_of(g))
            self.dispatched += self.cfg.group_size

    def on_start_executions(self, a: act.StartExecutions) -> None:
        for x, engine in a.placements:
            assert x in self.queued, f"started {x} which is not queued"
            self.queued.discard(x)
            self.running.add(x)
            self.started += 1
            self.last_started += 1

    def on_cancel_executions(self, a: act.CancelExecutions) -> None:
        assert set(a.executions) <= self.running | self.stopped, "cancelled an execution that is not running"
        for x in a.dropped:
            self.queued.discard(x)
            self.dropped += 1

    def on_reroute(self, a: act.Reroute) -> None:
        assert a.execution in self.running and a.source != a.dest, "rerouted a stopped or finished execution"

    def on_begin_transition(self, a: act.BeginTransition) -> None:
        assert a.cell not in self.switching
        self.switching[a.cell] = a.role

    def on_start_batch(self, a: act.StartBatch) -> None:
        assert self.batch is None
        assert a.final == ((a.version + 1) % self.cfg.mu == 0), "StartBatch.final disagrees with the burst"
        self.batch, self.fed, self.wanted = a.version, 0, 0

    def on_feed_groups(self, a: act.FeedGroups) -> None:
        self.check_feed(a)

    def on_broadcast(self, a: act.Broadcast) -> None:
        assert self.cfg.core_unit and not set(a.cells) & set(self.cfg.core_unit), "broadcast to the core unit"

    def on_publish(self, a: act.Publish) -> None:
        assert self.publishing is None
        self.publishing = a.version

    def check_feed(self, a: act.FeedGroups) -> None:
        assert a.version == self.batch
        pool = self.ready_unfed if self.cfg.streaming else self.burst_pool(a)
        for g in a.groups:
            assert g in self.ready_unfed, f"group {g} fed but not ready (or fed twice)"
            assert g in pool, f"group {g} became ready after its burst reserved its groups"
            assert g not in self.fed_groups
            assert a.version - self.v_d[g] >= 0, "negative staleness"
        oldest_left = min((v for g, v in pool.items() if g not in a.groups), default=None)
        if oldest_left is not None:
            assert max(self.v_d[g] for g in a.groups) <= oldest_left, "fed a newer group before an older one"
        for g in a.groups:
            self.fed_groups.add(g)
            self.v_t[g] = a.version
            del self.ready_unfed[g]
            self.reserve.pop(g, None)
        self.fed += len(a.groups)
        if self.cfg.streaming:
            self.wanted -= len(a.groups)
        else:
            assert len(a.groups) == self.cfg.B, "streaming off feeds whole batches"
        assert self.fed <= self.cfg.B

    def burst_pool(self, a: act.FeedGroups) -> dict[int, int]:
        """Streaming off: at a burst's first update, mu * B ready groups must exist; the burst draws
        only from the oldest of those (what was ready then), never from groups ready later."""
        if a.version % self.cfg.mu == 0:
            assert len(self.ready_unfed) >= self.cfg.mu * self.cfg.B, "burst started before mu * B groups were ready"
            cutoff = sorted(self.ready_unfed.values())[self.cfg.mu * self.cfg.B - 1]
            self.reserve = {g: v for g, v in self.ready_unfed.items() if v <= cutoff}
        return self.reserve

    # ---- legal events ---------------------------------------------------------
    @rule(dt=st.sampled_from([0.0, 1.0, 5.0, 20.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.send(ev.Tick(self.now))

    @precondition(lambda self: self.s.next_deadline() is not None)
    @rule()
    def tick_to_deadline(self) -> None:
        self.now = self.s.next_deadline()
        self.send(ev.Tick(self.now))

    def close(self, x: int) -> None:
        self.running.discard(x)
        self.stopped.discard(x)
        self.ended.add(x)
        g = self.s.group_of(x)
        self.closed[g] = self.closed.get(g, 0) + 1
        self.finished += 1

    @precondition(lambda self: self.running or self.stopped)
    @rule(data=st.data(), outcome=st.sampled_from(["completed", "failed", "harness_timeout"]))
    def finish(self, data, outcome: str) -> None:
        x = data.draw(st.sampled_from(sorted(self.running | self.stopped)))
        was_stopped, holding = x in self.stopped, self.s.holding
        self.close(x)
        self.send(ev.ExecutionFinished(self.now, x, outcome))
        if was_stopped:  # no double release: its slot went back at HarnessStopped
            assert self.s.holding == holding + self.last_started, "a stopped execution released a slot again"

    @precondition(lambda self: self.running or self.stopped)
    @rule(data=st.data(), k=st.integers(2, 12))
    def finish_several(self, data, k: int) -> None:
        chosen = data.draw(st.permutations(sorted(self.running | self.stopped)))[:k]
        for x in chosen:
            self.close(x)
            self.send(ev.ExecutionFinished(self.now, x))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def harness_stops(self, data) -> None:
        x = data.draw(st.sampled_from(sorted(self.running)))
        w, holding = self.s.waterlevel, self.s.holding
        self.running.discard(x)
        self.stopped.add(x)
        self.send(ev.HarnessStopped(self.now, x))
        assert self.s.waterlevel == w, "HarnessStopped changed the waterlevel"
        assert self.s.holding == holding - 1 + self.last_started, "HarnessStopped did not free exactly one slot"

    @precondition(lambda self: self.closable_groups())
    @rule()
    def all_groups_ready(self) -> None:
        for g in self.closable_groups():
            self.ready_sent.add(g)
            self.ready_unfed[g] = self.v_d[g]
            self.send(ev.GroupReady(self.now, g))

    def closable_groups(self) -> list[int]:
        return sorted(g for g, n in self.closed.items()
                      if n >= self.cfg.N and g not in self.ready_sent and g not in self.dropped_groups)

    def droppable_groups(self) -> list[int]:
        return sorted(g for g in self.v_d if g not in self.ready_sent and g not in self.dropped_groups)

    @precondition(lambda self: self.droppable_groups())
    @rule(data=st.data())
    def drop_group(self, data) -> None:
        g = data.draw(st.sampled_from(self.droppable_groups()))
        dispatched_before = len(self.v_d)
        self.dropped_groups.add(g)
        self.allowance += self.cfg.group_size
        self.send(ev.GroupDropped(self.now, g))
        assert len(self.v_d) == dispatched_before + 1, "a dropped group was not replaced"
        assert all(x not in self.queued for x in self.s.executions_of(g))

    @precondition(lambda self: self.closable_groups())
    @rule(data=st.data())
    def group_ready(self, data) -> None:
        g = data.draw(st.sampled_from(self.closable_groups()))
        self.ready_sent.add(g)
        self.ready_unfed[g] = self.v_d[g]
        self.send(ev.GroupReady(self.now, g))

    @precondition(lambda self: self.cfg.streaming and self.batch is not None
                  and self.fed + self.wanted < self.cfg.B)
    @rule()
    def want_group(self) -> None:
        self.wanted += 1
        self.send(ev.GroupWanted(self.now))

    @precondition(lambda self: self.switching)
    @rule(data=st.data())
    def transition_done(self, data) -> None:
        cell = data.draw(st.sampled_from(sorted(self.switching)))
        role = self.switching.pop(cell)
        event(f"{self.cfg.granularity} transition to {role}")
        self.send(ev.TransitionDone(self.now, cell, role))

    @precondition(lambda self: self.batch is not None and self.fed == self.cfg.B)
    @rule()
    def step_done(self) -> None:
        version, self.batch = self.batch, None
        event(f"reached version {min(version + 1, 3)}+")
        self.send(ev.StepDone(self.now, version))

    @precondition(lambda self: self.publishing is not None)
    @rule()
    def publish_done(self) -> None:
        version, self.publishing = self.publishing, None
        self.send(ev.PublishDone(self.now, version))

    # ---- illegal events leave the state unchanged ------------------------------
    @rule(data=st.data())
    def illegal(self, data) -> None:
        candidates = [ev.Begin(self.now), ev.Tick(self.now - 1.0), ev.StepDone(self.now, self.s.version + 7),
                      ev.PublishDone(self.now, self.s.version + 3), ev.GroupReady(self.now, 10**6),
                      ev.TransitionDone(self.now, self.cfg.K, "training"),
                      ev.ExecutionFinished(self.now, 10**7)]
        candidates += [ev.ExecutionFinished(self.now, x) for x in sorted(self.queued)[:2]]
        candidates += [ev.HarnessStopped(self.now, 10**7)]
        candidates += [ev.HarnessStopped(self.now, x) for x in sorted(self.queued)[:2]]
        candidates += [ev.HarnessStopped(self.now, x) for x in sorted(self.stopped)[:2]]
        candidates += [ev.HarnessStopped(self.now, x) for x in sorted(self.ended)[:2]]
        candidates += [ev.ExecutionFinished(self.now, x) for x in sorted(self.ended)[:2]]
        candidates += [ev.GroupReady(self.now, g) for g in sorted(self.ready_sent)[:2]]
        candidates += [ev.GroupDropped(self.now, g) for g in sorted(self.ready_sent)[:2]]
        candidates += [ev.GroupDropped(self.now, g) for g in sorted(self.dropped_groups)[:2]]
        candidates += [ev.GroupReady(self.now, g) for g in sorted(self.dropped_groups)[:2]]
        candidates.append(ev.GroupDropped(self.now, 10**6))
        candidates += [ev.TransitionDone(self.now, c, "training") for c in range(self.cfg.K)
                       if c not in self.switching]
        if self.batch is None or not self.cfg.streaming:
            candidates.append(ev.GroupWanted(self.now))
        event = data.draw(st.sampled_from(candidates))
        before = self.s.snapshot()
        try:
            self.s.handle(event)
        except PolicyError:
            pass
        else:
            raise AssertionError(f"illegal event accepted: {event}")
        assert self.s.snapshot() == before

    # ---- invariants ------------------------------------------------------------
    @invariant()
    def log_replays(self) -> None:
        """The loop's event log regenerates every action the core returned so far."""
        if len(self.loop.log.rows) % 16 == 0:  # a full replay is O(steps): check every 16th event
            assert replay(self.cfg, self.loop.log.events()) == self.loop.log.actions

    @invariant()
    def counters(self) -> None:
        s = self.s
        assert s.d >= s.p >= s.f >= 0
        assert all(now >= prev for now, prev in zip((s.d, s.p, s.f), self.prev_counters))
        self.prev_counters = (s.d, s.p, s.f)
        assert (s.d, s.p, s.f) == (self.dispatched, self.started + self.dropped, self.finished + self.dropped)
        assert s.queued == len(self.queued) and s.running == len(self.running) + len(self.stopped)
        assert s.holding == len(self.running) and s.stopped_executions() == self.stopped

    @invariant()
    def capacity_respected(self) -> None:
        placements = self.s.placements()
        assert set(placements) == self.running
        assert self.s.holding <= self.s.capacity, "slots held exceed C_R"
        for x, engine in placements.items():
            if engine != SEPARATE:
                assert self.s.roles[engine] == "rollout", f"execution {x} routed to cell {engine} ({self.s.roles[engine]})"
            load = sum(1 for e in placements.values() if e == engine)
            assert load <= (self.cfg.C_s if engine == SEPARATE else self.cfg.C_e)

    @invariant()
    def free_slots_go_to_queued_executions(self) -> None:
        """After every event: nothing queued, or every slot of C_R held (a stopped harness's slot reused)."""
        assert self.s.queued == 0 or self.s.holding == self.s.capacity

    @invariant()
    def waterlevel_never_rises_inside_a_burst(self) -> None:
        burst, w = self.s.burst, self.s.waterlevel
        prev_burst, prev_w = self.prev_w
        if prev_burst == burst and self.cfg.dispatch == "boundary":
            assert w <= prev_w + self.allowance
        self.prev_w, self.allowance = (burst, w), 0

    @invariant()
    def dispatch_depth(self) -> None:
        """Groups dispatched but not yet fed: (phi + mu) * B at start, never more."""
        unconsumed = len(self.v_d) - len(self.fed_groups) - len(self.dropped_groups)
        assert unconsumed <= self.cfg.initial_groups
        if self.cfg.dispatch == "continuous":
            assert unconsumed == self.cfg.initial_groups

    @invariant()
    def snapshot_agrees_and_stays_put(self) -> None:
        """The public snapshot matches the model; one taken earlier has not changed since."""
        snap = self.s.snapshot()
        assert snap.staleness() == {g: self.v_t[g] - self.v_d[g] for g in sorted(self.v_t)}
        assert (snap.waterlevel, snap.queued, snap.running) == (self.s.waterlevel, len(self.queued),
                                                               len(self.running) + len(self.stopped))
        assert set(snap.placements) == self.running and snap.stopped == self.stopped
        assert {g for g, view in snap.groups.items() if view.dropped} == self.dropped_groups
        if self.taken is not None:
            assert plain(self.taken[0]) == self.taken[1], "a snapshot changed after it was taken"
        with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
            snap.groups[0] = None  # read-only (TypeError), like every field (FrozenInstanceError)
        self.taken = (snap, plain(snap))

    @invariant()
    def training_is_a_prefix(self) -> None:
        cells = self.s.training_cells()
        assert cells == tuple(range(len(cells)))
        if self.cfg.static:
            assert cells == tuple(range(self.cfg.static_train_cells))


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=examples(400), stateful_step_count=120, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])
