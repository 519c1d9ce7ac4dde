"""The elastic scheduling policy core: events in, actions out (docs/staleness.md#staleness-identity, docs/scheduler.md).

``Scheduler.handle(event) -> list[Action]`` is the only way state changes. The
core never reads a clock (``event.now`` is the time), does no I/O, starts no
threads, and does not know whether SimPy or a real controller drives it.

Invariants (each is tested by a Hypothesis state machine):
- counters d >= p >= f never decrease; queued = d - p, running = p - f;
- running = holding + stopped: every running execution either holds a
  rollout slot (sits on an engine) or has had its HarnessStopped, never both;
- executions holding a slot never exceed C_R, and each sits on an engine
  whose cell is in the rollout role (or the separate pool);
- under boundary dispatch the waterlevel w = d - f never rises between two
  publications (d only grows at Begin and at PublishDone), except by one
  group's executions per GroupDropped (its replacement); under continuous
  dispatch d also grows by one group per group fed; either way the
  dispatched, not dropped and unconsumed depth stays at most (phi + mu) * B
  (exactly that under continuous dispatch);
- cells in (or entering) training form a prefix 0..k-1 that starts at the core;
  only one unit switches into training at a time;
- every group is fed to exactly one batch, ready groups oldest policy version
  first; staleness v_t - v_d >= 0;
- an illegal event raises ``PolicyError`` and leaves the state unchanged.

Choices where the paper is silent (documented here, tested in tests/):
- p counts when the core emits StartExecutions (the start decision reserves
  the slot); a driver whose start fails reports ExecutionFinished("failed").
- Slots are freed when a harness stops. docs/scheduler.md#counters starts
  min(d - p, C_R - (p - f)) executions; Gyre reads p - f there as the
  executions *holding a rollout slot*: an execution whose harness has stopped
  (HarnessStopped) while its evaluation is still pending holds no rollout
  capacity, so its slot goes to a queued execution at once. It still counts
  as outstanding in w = d - f until its ExecutionFinished (f counts
  terminations, unchanged), so Eq. 2 and Eq. 3 see it. Its ExecutionFinished
  releases nothing more; it is never rerouted (it sits on no engine); a
  cancellation ends it like any running execution (CancelExecutions, then
  ExecutionFinished: it counts only in f). HarnessStopped is optional: an
  execution finishing without it releases its slot at ExecutionFinished.
- C_R counts engines whose cell is in the rollout role *and ready*: a cell
  switching back to rollout adds capacity only at its TransitionDone.
- A queued surplus execution cancelled at GroupReady counts as started and
  terminated at once (p and f both +1), so d - p stays the queue length.
- The supply timer restarts at every TransitionDone and every StartBatch.
- A satellite still switching into training when its burst ends goes back to
  rollout as soon as it arrives; it is not counted as training meanwhile.
- After a burst's final step the next batch opens only at PublishDone.
- Streaming off (docs/streaming.md#streaming-on-and-off): a burst trains like a conventional trainer. Its
  first update is fed only once mu * B groups are ready; the core then
  reserves those mu * B (oldest policy version first; groups that become
  ready later wait for the next burst) and feeds B of them to each of the
  burst's mu updates back to back, in version order. The global shuffle
  across the burst's minibatches is the trainer's; accounting each group's
  v_t in version order leaves the group-weighted mean staleness unchanged.
  With mu = 1 this is "wait for B ready groups".
- GroupDropped (a group that can never complete: query cancelled, task not
  set up) cancels the group's running executions, removes its queued ones
  (counted started and terminated at once, like a surplus) and dispatches
  one replacement group at the newest published version, so the dispatched
  depth, and with it the burst's supply, stays whole. The waterlevel may
  therefore rise by at most one group's executions per dropped group. An
  excluded execution (overall timeout) is *not* a dropped group: it is a
  designated outcome and its group becomes ready (docs/trajectories.md#evaluation-and-outcomes).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable

from gyre import actions as act
from gyre import events as ev
from gyre import roles as R
from gyre import rules
from gyre.config import SchedulerConfig
from gyre.ledger import RolloutLedger
from gyre.snapshot import CounterViews, GroupView, SchedulerSnapshot, read_only


class PolicyError(RuntimeError):
    """An event that is illegal in the current state; the state is unchanged."""


@dataclass(slots=True)
class GroupState:
    v_d: int
    closed: int = 0
    ready: bool = False
    dropped: bool = False
    v_t: int | None = None


class Scheduler(CounterViews):
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.now: float | None = None
        self.d = self.p = self.f = 0
        self.version = 0
        self.published = 0
        self.burst = 0
        self.steps_in_burst = 0
        self.roles: list[str] = [R.ROLLOUT] * cfg.K
        self.groups: dict[int, GroupState] = {}
        self.batch_open = False
        self.fed = 0
        self.wants = 0
        self.awaiting_publish = False
        self.supply_since: float | None = None
        self._units = cfg.transition_units()
        self._core_unit = cfg.core_unit  # read once per event by _open_batch
        self._static = cfg.static
        self._group_size = cfg.group_size
        self._batch_size = cfg.B  # read once per event by handle
        self._continuous = cfg.dispatch == "continuous"
        self._streaming = cfg.streaming  # read once per event of an open batch by handle
        self._tau_elapsed = cfg.tau - 1e-9  # rules.timer_elapsed's bound (the same float), read once per event
        # Derived from the roles and awaiting_publish alone, read after most events and changed by few:
        # kept until one of them changes (``_set_role``, ``_set_awaiting_publish``).
        self._candidate: tuple[int, ...] | None | object = _UNKNOWN
        self._core_training: bool | None = None
        # the supply rule's two inputs when it was last asked (ready groups, batch need): -1, never asked
        self._supply_ready = self._supply_need = -1
        self._supply_value = False
        self._unit_of = {c: i for i, unit in enumerate(self._units) for c in unit}
        self._returning: set[int] = set()
        self._ledger = RolloutLedger(cfg)
        self._queue: deque[int] = deque()
        self._queued: set[int] = set()
        self._stopped: set[int] = set()  # harness stopped, evaluation pending: running, holding no slot
        self._ready: list[tuple[int, int]] = []
        self._burst_reserve: deque[int] = deque()  # streaming off: the burst's groups, reserved at its start
        # event type -> (its check or None, its change); a change whose check is None checks first itself
        self._handlers: dict[type, tuple[Callable | None, Callable]] = {
            ev.Begin: (self._check_begin, self._on_begin),
            ev.Tick: (None, _no_apply),
            ev.ExecutionFinished: (None, self._on_finished),  # checks first itself (most events are finishes)
            ev.HarnessStopped: (self._check_harness_stopped, self._on_harness_stopped),
            ev.GroupReady: (self._check_group_ready, self._on_group_ready),
            ev.GroupDropped: (self._check_group_dropped, self._on_group_dropped),
            ev.GroupWanted: (self._check_wanted, self._on_wanted),
            ev.TransitionDone: (self._check_transition_done, self._on_transition_done),
            ev.StepDone: (self._check_step_done, self._on_step_done),
            ev.PublishDone: (self._check_publish_done, self._on_publish_done),
        }

    # ---- the one entry point ------------------------------------------------
    def handle(self, event: ev.Event) -> list[act.Action]:
        """Apply one event; return the actions the driver must carry out, in order."""
        handlers = self._handlers.get(type(event))
        if handlers is None:
            raise PolicyError(f"unknown event {event!r}")
        previous = self.now
        if previous is None:
            if not isinstance(event, ev.Begin):
                raise PolicyError(f"{event.kind} before Begin")
        elif event.now < previous:
            raise PolicyError(f"{event.kind} at t={event.now} is earlier than t={previous}")
        check, apply = handlers
        if check is not None:
            check(event)
        self.now = now = event.now
        out: list[act.Action] = []
        try:  # (costs nothing unless it raises)
            apply(event, out)
        except PolicyError:  # a change that checks first itself refused the event: it changed nothing, nor the time
            self.now = previous
            raise
        # the follow-ups common to every event (written here, not in a method of their own: once per event);
        # each guard below is the first test of the method it skips
        if self.d > self.p:
            self._start_queued(out)
        batch_open = self.batch_open
        if not batch_open and self._core_training is not False:  # known out of training: no batch opens
            self._open_batch(out)
            batch_open = self.batch_open
        # _feed's first tests: streaming feeds nothing without a group both wanted and ready (most events)
        if batch_open and (self.wants and self._ready or not self._streaming) and self._feed(out) and self._continuous:
            self._start_queued(out)
        # the supply timer runs while the supply suffices (_supply_ok, inlined)
        B = self._batch_size
        ready, need = len(self._ready), B - self.fed if batch_open else B
        if ready != self._supply_ready or need != self._supply_need:  # a pure function of these two
            self._supply_ready, self._supply_need = ready, need
            self._supply_value = rules.supply_sufficient(self.cfg, rules.supply(ready, need))
        if self._supply_value:
            since = self.supply_since
            if since is None:
                self.supply_since = since = now
            if now - since >= self._tau_elapsed:  # rules.timer_elapsed, inlined: false after most events
                self._maybe_transition(out)
        else:
            self.supply_since = None
        return out

    # ---- read-only views ----------------------------------------------------
    def snapshot(self) -> SchedulerSnapshot:
        """A frozen copy of the state that readers outside the core use (``gyre.snapshot``)."""
        groups = {g: GroupView(s.v_d, s.v_t, s.closed, s.ready, s.dropped) for g, s in self.groups.items()}
        return SchedulerSnapshot(
            now=self.now, d=self.d, p=self.p, f=self.f, version=self.version, published=self.published,
            burst=self.burst, steps_in_burst=self.steps_in_burst, roles=tuple(self.roles),
            batch_open=self.batch_open, fed=self.fed, wants=self.wants, awaiting_publish=self.awaiting_publish,
            supply_since=self.supply_since, holding=self.holding, capacity=self.capacity,
            ready_unclaimed=self.ready_unclaimed, training_cells=self.training_cells(),
            placements=read_only(self.placements()), stopped=self.stopped_executions(),
            groups=read_only(groups))

    @property
    def holding(self) -> int:
        """Running executions that hold a rollout slot (the start rule's occupancy; never above C_R)."""
        return self._ledger.running

    def stopped_executions(self) -> frozenset[int]:
        """Running executions whose harness stopped (evaluation pending): they hold no slot."""
        return frozenset(self._stopped)

    @property
    def capacity(self) -> int:
        """C_R(t): capacity of the rollout engines that accept work now."""
        return self._ledger.capacity

    @property
    def ready_unclaimed(self) -> int:
        return len(self._ready)

    def training_cells(self) -> tuple[int, ...]:
        """Cells in or entering the training role (excluding ones bound to return)."""
        return tuple(c for c, role in enumerate(self.roles)
                     if role in (R.TRAINING, R.TO_TRAINING) and c not in self._returning)

    def placements(self) -> dict[int, int]:
        """Execution holding a rollout slot -> engine serving it (stopped harnesses hold none)."""
        return self._ledger.placements()

    def engine_load(self, engine: int) -> int:
        """Running executions on one engine (a cell index or SEPARATE)."""
        return self._ledger.load(engine)

    def executions_of(self, group: int) -> range:
        size = self.cfg.group_size
        return range(group * size, (group + 1) * size)

    def group_of(self, execution: int) -> int:
        return execution // self._group_size

    def next_deadline(self) -> float | None:
        """When a Tick could trigger a transition (supply timer expiry), else None."""
        if self.supply_since is None:
            return None
        unit = self._candidate_unit()
        if unit is None or not self._eq2_holds(unit):
            return None
        deadline = self.supply_since + self.cfg.tau
        return deadline if self.now is None or deadline > self.now else None

    # ---- validation (no state change) ---------------------------------------
    def _check_begin(self, event: ev.Begin) -> None:
        if self.now is not None:
            raise PolicyError("Begin received twice")

    def _check_harness_stopped(self, event: ev.HarnessStopped) -> None:
        x = event.execution
        if x < 0 or self.group_of(x) not in self.groups:
            raise PolicyError(f"harness of execution {x} stopped but it was never dispatched")
        if x in self._queued:
            raise PolicyError(f"harness of execution {x} stopped but it never started")
        if x in self._stopped:
            raise PolicyError(f"harness of execution {x} stopped twice")
        if not self._ledger.holds(x):
            raise PolicyError(f"harness of execution {x} stopped but the execution already finished")

    def _dispatched(self, g: int) -> GroupState:
        if g not in self.groups:
            raise PolicyError(f"group {g} was never dispatched")
        return self.groups[g]

    def _check_group_ready(self, event: ev.GroupReady) -> None:
        group = self._dispatched(event.group)
        if group.ready:
            raise PolicyError(f"group {event.group} reported ready twice")
        if group.dropped:
            raise PolicyError(f"group {event.group} reported ready after it was dropped")
        if group.closed < self.cfg.N:
            raise PolicyError(f"group {event.group} ready with only {group.closed} of {self.cfg.N} executions closed")

    def _check_group_dropped(self, event: ev.GroupDropped) -> None:
        group = self._dispatched(event.group)
        if group.ready:
            raise PolicyError(f"group {event.group} is ready and cannot be dropped")
        if group.dropped:
            raise PolicyError(f"group {event.group} dropped twice")

    def _check_wanted(self, event: ev.GroupWanted) -> None:
        if not self.cfg.streaming:
            raise PolicyError("GroupWanted without streaming: batches are fed whole")
        if not self.batch_open:
            raise PolicyError("GroupWanted while no batch is open")
        if self.fed + self.wants >= self.cfg.B:
            raise PolicyError(f"GroupWanted beyond the batch size B={self.cfg.B}")

    def _check_transition_done(self, event: ev.TransitionDone) -> None:
        if not 0 <= event.cell < self.cfg.K:
            raise PolicyError(f"cell {event.cell} does not exist (K={self.cfg.K})")
        change = {R.TRAINING: "done_training", R.ROLLOUT: "done_rollout"}.get(event.role)
        if change is None:
            raise PolicyError(f"unknown role {event.role!r}")
        if R.next_role(self.roles[event.cell], change) is None:
            raise PolicyError(f"cell {event.cell} finished a switch to {event.role} "
                              f"but is {self.roles[event.cell]}")

    def _check_step_done(self, event: ev.StepDone) -> None:
        if not self.batch_open:
            raise PolicyError(f"StepDone({event.version}) while no batch is open")
        if event.version != self.version:
            raise PolicyError(f"StepDone({event.version}) but the open batch trains version {self.version}")
        if self.fed < self.cfg.B:
            raise PolicyError(f"StepDone({event.version}) after only {self.fed} of {self.cfg.B} groups were fed")

    def _check_publish_done(self, event: ev.PublishDone) -> None:
        if not self.awaiting_publish or event.version != self.version:
            raise PolicyError(f"PublishDone({event.version}) but no publication of that version is pending")

    # ---- state changes ------------------------------------------------------
    def _on_begin(self, event: ev.Begin, out: list[act.Action]) -> None:
        for cell in range(self.cfg.K):
            if cell < self.cfg.static_train_cells:
                self._set_role(cell, R.TRAINING)
            else:
                self._ledger.open(cell)
        self._dispatch(self.cfg.initial_groups, out)

    def _on_finished(self, event: ev.ExecutionFinished, out: list[act.Action]) -> None:
        x = event.execution
        # its check first, in the same tests (an illegal finish changes nothing): one call per event fewer
        if x in self._queued:
            raise PolicyError(f"execution {x} finished but never started")
        stopped = self._stopped
        if x in stopped:
            stopped.discard(x)  # its slot went back at HarnessStopped
        elif self._ledger.holds(x):
            self._ledger.release(x)
        else:
            raise PolicyError(f"execution {x} finished but is not running")
        self.f += 1
        self.groups[x // self._group_size].closed += 1  # group_of, inlined: once per execution

    def _on_harness_stopped(self, event: ev.HarnessStopped, out: list[act.Action]) -> None:
        self._ledger.release(event.execution)
        self._stopped.add(event.execution)

    def _on_group_ready(self, event: ev.GroupReady, out: list[act.Action]) -> None:
        group = self.groups[event.group]
        group.ready = True
        heapq.heappush(self._ready, (group.v_d, event.group))
        if group.closed < self._group_size:  # else every execution of it has closed: nothing to cancel
            self._cancel_group(event.group, out)  # the oversampled surplus

    def _on_group_dropped(self, event: ev.GroupDropped, out: list[act.Action]) -> None:
        self.groups[event.group].dropped = True
        self._cancel_group(event.group, out)
        self._dispatch(1, out)

    def _cancel_group(self, g: int, out: list[act.Action]) -> None:
        """Cancel a group's running executions (stopped harnesses too); its queued ones never start (p and f)."""
        running, dropped = [], []
        for x in self.executions_of(g):
            if x in self._queued:
                self._queued.discard(x)
                dropped.append(x)
            elif self._ledger.holds(x) or x in self._stopped:
                running.append(x)
        self.p += len(dropped)
        self.f += len(dropped)
        self.groups[g].closed += len(dropped)
        if running or dropped:
            out.append(act.CancelExecutions(tuple(running), tuple(dropped)))

    def _on_wanted(self, event: ev.GroupWanted, out: list[act.Action]) -> None:
        self.wants += 1

    def _on_transition_done(self, event: ev.TransitionDone, out: list[act.Action]) -> None:
        cell = event.cell
        self._set_role(cell, R.DESTINATION[self.roles[cell]])
        if event.role == R.ROLLOUT:
            self._ledger.open(cell)
        elif cell in self._returning:
            self._returning.discard(cell)
            self._begin_transition((cell,), R.ROLLOUT, out)
        unit = self._units[self._unit_of[cell]]
        if all(self.roles[c] == self.roles[cell] for c in unit):
            self._restart_timer()

    def _on_step_done(self, event: ev.StepDone, out: list[act.Action]) -> None:
        self.version += 1
        self.steps_in_burst += 1
        self.batch_open = False
        self.fed = self.wants = 0
        # is_satellite(cfg, c) (not static, not in the core unit), with both read once per core
        satellites = () if self._static else tuple(c for c, role in enumerate(self.roles)
                                                   if role == R.TRAINING and c not in self._core_unit)
        if self.steps_in_burst < self.cfg.mu:
            if satellites:
                out.append(act.Broadcast(self.version, satellites))
            return
        self._end_burst(satellites, out)

    def _end_burst(self, satellites: tuple[int, ...], out: list[act.Action]) -> None:
        """docs/scheduler.md#end-of-a-burst: satellites return, the core publishes, the core stays or returns."""
        self.steps_in_burst = 0
        self._set_awaiting_publish(True)
        out.append(act.Publish(self.version))
        if satellites:
            self._begin_transition(satellites, R.ROLLOUT, out)
        self._returning.update(c for c, role in enumerate(self.roles) if role == R.TO_TRAINING)
        if self.cfg.static:
            return
        stays = rules.core_stays_in_training(self.cfg, self.waterlevel, self.ready_unclaimed)
        if not stays:
            self._begin_transition(self.cfg.core_unit, R.ROLLOUT, out)

    def _on_publish_done(self, event: ev.PublishDone, out: list[act.Action]) -> None:
        self._set_awaiting_publish(False)
        self.published = event.version
        self.burst += 1
        if self.cfg.dispatch == "boundary":
            self._dispatch(self.cfg.mu * self.cfg.B, out)

    def _set_role(self, cell: int, role: str) -> None:
        self.roles[cell] = role
        self._candidate, self._core_training = _UNKNOWN, None

    def _set_awaiting_publish(self, awaiting: bool) -> None:
        self.awaiting_publish = awaiting
        self._candidate = _UNKNOWN

    def _dispatch(self, n_groups: int, out: list[act.Action]) -> None:
        first = len(self.groups)
        ids = tuple(range(first, first + n_groups))
        for g in ids:
            self.groups[g] = GroupState(v_d=self.published)
            for x in self.executions_of(g):
                self._queue.append(x)
                self._queued.add(x)
        self.d += n_groups * self.cfg.group_size
        out.append(act.DispatchGroups(ids, self.published))

    def _start_queued(self, out: list[act.Action]) -> None:
        ledger = self._ledger
        n = rules.startable(self.d - self.p, ledger.running, ledger.capacity)  # queued, holding, capacity
        placements: list[tuple[int, int]] = []
        popleft, queued, place = self._queue.popleft, self._queued, ledger.place  # once per started execution
        while len(placements) < n:
            x = popleft()
            if x in queued:
                queued.discard(x)
                placements.append((x, place(x)))
        if placements:
            self.p += len(placements)
            out.append(act.StartExecutions(tuple(placements)))

    def _core_in_training(self) -> bool:
        if self._core_training is None:
            self._core_training = all(self.roles[c] == R.TRAINING for c in self._core_unit)
        return self._core_training

    def _open_batch(self, out: list[act.Action]) -> None:
        if self.batch_open or self.awaiting_publish or not self._core_in_training():
            return
        self.batch_open = True
        self.fed = self.wants = 0
        out.append(act.StartBatch(self.version, final=self.steps_in_burst + 1 == self.cfg.mu))
        self._restart_timer()

    def _feed(self, out: list[act.Action]) -> int:
        """Hand ready groups to the open batch; under continuous dispatch refill their slots."""
        if not self.batch_open:
            return 0
        if self.cfg.streaming:
            n = min(self.wants, len(self._ready))
            if n == 0:
                return 0  # (after most events of an open batch)
            fed = tuple(heapq.heappop(self._ready)[1] for _ in range(n))
        else:
            fed = self._take_from_burst_reserve()
            n = len(fed)
        if n == 0:
            return 0
        for g in fed:
            self.groups[g].v_t = self.version
        self.fed += n
        if self.cfg.streaming:
            self.wants -= n
        out.append(act.FeedGroups(self.version, fed))
        if self._continuous:
            self._dispatch(n, out)
        return n

    def _take_from_burst_reserve(self) -> tuple[int, ...]:
        """Streaming off: B groups of the burst's reserve, reserving mu * B at the burst's first update."""
        if self.fed > 0:
            return ()
        burst_size = self.cfg.mu * self.cfg.B
        if self.steps_in_burst == 0 and not self._burst_reserve:
            if len(self._ready) < burst_size:
                return ()
            self._burst_reserve.extend(heapq.heappop(self._ready)[1] for _ in range(burst_size))
        return tuple(self._burst_reserve.popleft() for _ in range(min(self.cfg.B, len(self._burst_reserve))))

    # ---- the supply timer and the transition test ---------------------------
    def _batch_need(self) -> int:
        return self.cfg.B - self.fed if self.batch_open else self.cfg.B

    def _supply_ok(self) -> bool:
        need = self.cfg.B - self.fed if self.batch_open else self.cfg.B  # _batch_need, inlined: once per event
        ready = len(self._ready)
        if ready != self._supply_ready or need != self._supply_need:  # a pure function of these two: asked
            self._supply_ready, self._supply_need = ready, need  # when one changed
            self._supply_value = rules.supply_sufficient(self.cfg, rules.supply(ready, need))
        return self._supply_value

    def _restart_timer(self) -> None:
        self.supply_since = self.now if self._supply_ok() else None

    def _candidate_unit(self) -> tuple[int, ...] | None:
        """The next unit allowed to switch into training, if any (serial, prefix)."""
        if self._candidate is _UNKNOWN:
            self._candidate = self._find_candidate_unit()
        return self._candidate  # type: ignore[return-value]  # not _UNKNOWN by now

    def _find_candidate_unit(self) -> tuple[int, ...] | None:
        if self._static or self.awaiting_publish or R.TO_TRAINING in self.roles:
            return None
        for unit in self._units:
            if all(self.roles[c] == R.TRAINING for c in unit):
                continue
            if any(self.roles[c] != R.ROLLOUT for c in unit):
                return None
            return unit
        return None

    def _eq2_holds(self, unit: tuple[int, ...]) -> bool:
        unit_capacity = len(unit) * self.cfg.C_e  # below: the waterlevel d - f and C_R, read without a call
        return rules.waterlevel_allows(self.cfg, self.d - self.f, self._ledger.capacity, unit_capacity)

    def _maybe_transition(self, out: list[act.Action]) -> None:
        """The supply timer has elapsed (``handle`` checks): switch the candidate unit if Eq. 2 holds."""
        unit = self._candidate_unit() if self._candidate is _UNKNOWN else self._candidate
        if unit is not None and self._eq2_holds(unit):  # type: ignore[arg-type]  # a unit, once known
            self._begin_transition(unit, R.TRAINING, out)  # type: ignore[arg-type]

    def _begin_transition(self, cells: tuple[int, ...], role: str, out: list[act.Action]) -> None:
        change = "begin_training" if role == R.TRAINING else "begin_rollout"
        if role == R.TRAINING:
            for source, execution, dest in ((s, x, d) for x, s, d in self._ledger.evacuate(frozenset(cells))):
                out.append(act.Reroute(execution, source, dest))
            for cell in cells:
                self._ledger.close(cell)
        for cell in cells:
            new_role = R.next_role(self.roles[cell], change)
            assert new_role is not None  # only cells whose role allows the change are offered
            self._set_role(cell, new_role)
            out.append(act.BeginTransition(cell, role))


_UNKNOWN = object()  # a cached value not computed since what it derives from last changed


def _no_apply(event: ev.Event, out: list[act.Action]) -> None:
    return None
