"""The one driver loop, shared by the simulator and the real backend.

Feeding an event to the core, recording it and handing each returned action
to the driver is written once, here. A driver is an ``ActionHandler``: one
``on_<action kind>`` method per action (``on_start_executions``,
``on_begin_transition``, ...). The simulator and the real backend differ
only in those methods and in where their events come from (SimPy timers or
reports from real components)::

    event ──> DriverLoop.feed ──> Scheduler.handle ──> [actions]
                   │                                       │
                   └── EventLog (events.csv, replayable)   └── handler.on_<kind>(action), in order

Invariants:
- an event the core refuses (``PolicyError``) is not recorded and changes
  nothing; every recorded event was accepted, so the log always replays;
- actions reach the handler in the order the core returned them, after the
  event and the actions are recorded;
- a handler that raises stops the loop with ``ActionFailed`` naming the
  action; the log up to and including that action is kept;
- a handler is checked when the loop is built: a missing ``on_<kind>``
  method is a ``TypeError`` naming it, never a failure mid-run.
"""

from __future__ import annotations

from gyre import actions as act
from gyre import events as ev
from gyre.formats.eventlog import EventLog
from gyre.scheduler import Scheduler

#: action class -> the handler method that applies it
HANDLER_METHODS: dict[type[act.Action], str] = {cls: f"on_{kind}" for kind, cls in act.ACTION_TYPES.items()}


class ActionHandler:
    """What a driver implements: one method per action kind. Every one must be overridden."""

    def on_dispatch_groups(self, a: act.DispatchGroups) -> None:
        raise NotImplementedError

    def on_start_executions(self, a: act.StartExecutions) -> None:
        raise NotImplementedError

    def on_cancel_executions(self, a: act.CancelExecutions) -> None:
        raise NotImplementedError

    def on_reroute(self, a: act.Reroute) -> None:
        raise NotImplementedError

    def on_begin_transition(self, a: act.BeginTransition) -> None:
        raise NotImplementedError

    def on_start_batch(self, a: act.StartBatch) -> None:
        raise NotImplementedError

    def on_feed_groups(self, a: act.FeedGroups) -> None:
        raise NotImplementedError

    def on_broadcast(self, a: act.Broadcast) -> None:
        raise NotImplementedError

    def on_publish(self, a: act.Publish) -> None:
        raise NotImplementedError


class ActionFailed(RuntimeError):
    """A driver failed to apply an action; the event log up to it is kept."""

    def __init__(self, action: act.Action, cause: BaseException) -> None:
        super().__init__(f"failed to apply {action!r}: {type(cause).__name__}: {cause}")
        self.action = action


class DriverLoop:
    def __init__(self, core: Scheduler, handler: object, log: EventLog | None = None) -> None:
        methods = {cls: getattr(type(handler), name, None) for cls, name in HANDLER_METHODS.items()}
        missing = [HANDLER_METHODS[cls] for cls, method in methods.items()
                   if method is None or method is getattr(ActionHandler, HANDLER_METHODS[cls])]
        if missing:
            raise TypeError(f"{type(handler).__name__} does not handle: {', '.join(missing)}")
        self.core = core
        self.log = log if log is not None else EventLog()
        self._apply = {cls: getattr(handler, name) for cls, name in HANDLER_METHODS.items()}

    def feed(self, event: ev.Event) -> list[act.Action]:
        """Apply one event to the core, record it, and carry out the actions it returns."""
        actions = self.core.handle(event)
        self.log.record(event, actions)
        for action in actions:
            try:
                self._apply[type(action)](action)
            except ActionFailed:
                raise  # a nested feed already named its action
            except Exception as exc:  # the driver's world is outside the core: name the action
                raise ActionFailed(action, exc) from exc
        return actions
