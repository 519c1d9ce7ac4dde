"""Role time lines and step spans read from an event log, the same way for a simulated and a real run.

Both worlds record every event the policy core accepted (``gyre.formats.eventlog``).
Replaying those events through a fresh core under the run's configuration
reproduces the core's state after each event, so the role of every cell and
the span of every step follow from the log alone:

- a cell's role changes exactly when the core's ``roles`` list changes after
  an event (``rollout`` -> ``to_training`` on BeginTransition, -> ``training``
  on TransitionDone, and back), at that event's time;
- step ``v`` starts at the event after which the core opened batch ``v``
  (StartBatch) and ends at its StepDone; a publication starts at Publish and
  ends at PublishDone;
- ``training_cells(v)`` are the cells whose role is ``training`` at some
  instant of step ``v`` (so a satellite that joined mid-step counts).

Invariants: pure function of (configuration, events); intervals of one cell
are contiguous, ordered and cover [first event, last event]; every completed
step has start <= end; a log that the core refuses raises the core's error
naming the event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from gyre import actions as act
from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.roles import TRAINING
from gyre.scheduler import Scheduler


@dataclass(frozen=True)
class Span:
    start_s: float
    end_s: float
    label: str  # a role, or "step v" / "publish v"


@dataclass
class Timeline:
    """Per-cell role spans, step spans (by version) and publication spans (by version)."""

    roles: dict[int, list[Span]] = field(default_factory=dict)
    steps: dict[int, Span] = field(default_factory=dict)
    publications: dict[int, Span] = field(default_factory=dict)
    end_s: float = 0.0

    def training_cells(self, version: int) -> tuple[int, ...]:
        """Cells in the training role at some instant of step ``version``."""
        step = self.steps[version]
        return tuple(sorted(c for c, spans in self.roles.items()
                            if any(s.label == TRAINING and _overlaps(s, step) for s in spans)))

    def step_durations(self) -> dict[int, float]:
        """Wall seconds between consecutive step ends (the first from the run's start)."""
        out, previous = {}, 0.0
        for version in sorted(self.steps):
            out[version] = self.steps[version].end_s - previous
            previous = self.steps[version].end_s
        return out


def _overlaps(span: Span, step: Span) -> bool:
    if step.start_s == step.end_s:
        return span.start_s <= step.start_s <= span.end_s
    return span.start_s < step.end_s and span.end_s > step.start_s


Observer = Callable[[ev.Event, list[act.Action], Scheduler], None]


def timeline(cfg: SchedulerConfig, events: Iterable[ev.Event], observe: Observer | None = None) -> Timeline:
    """Replay ``events`` through a fresh core and read roles, steps and publications off it.

    ``observe(event, actions, core)``, when given, sees each event, the actions the core returned and the
    core right after it (read-only: counters, engine loads), so other views need no second replay.
    """
    core, out = Scheduler(cfg), Timeline()
    current: list[tuple[str, float]] | None = None
    open_steps: dict[int, float] = {}
    open_publications: dict[int, float] = {}
    now = 0.0
    for event in events:
        now = float(event.now)
        actions = core.handle(event)
        if observe is not None:
            observe(event, actions, core)
        if current is None:  # roles before the first event are the core's initial ones
            current = [(role, now) for role in core.roles]
        for cell, role in enumerate(core.roles):
            if role != current[cell][0]:
                out.roles.setdefault(cell, []).append(Span(current[cell][1], now, current[cell][0]))
                current[cell] = (role, now)
        for action in actions:
            if isinstance(action, act.StartBatch):
                open_steps[action.version] = now
            elif isinstance(action, act.Publish):
                open_publications[action.version] = now
        if isinstance(event, ev.StepDone) and event.version in open_steps:
            out.steps[event.version] = Span(open_steps.pop(event.version), now, f"step {event.version}")
        if isinstance(event, ev.PublishDone) and event.version in open_publications:
            out.publications[event.version] = Span(open_publications.pop(event.version), now,
                                                   f"publish {event.version}")
    for cell, (role, since) in enumerate(current or []):
        out.roles.setdefault(cell, []).append(Span(since, now, role))
    out.end_s = now
    return out
