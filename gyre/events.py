"""Events the drivers feed into the policy core.

Every event carries ``now`` (seconds, any epoch): the core never reads a clock,
so SimPy's ``env.now`` and a wall clock are interchangeable. Events are frozen
dataclasses that export themselves as flat dicts for event tables and replay.
Their fields are immutable scalars and tuples, so ``as_dict`` is a shallow
copy of the fields (equal to ``dataclasses.asdict``, key for key and in the
same order, without its recursive deep copy: it runs once per event).

Invariant: ``now`` never decreases along the sequence a core receives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    now: float
    kind: ClassVar[str] = "event"

    def as_dict(self) -> dict[str, Any]:
        # a frozen dataclass's __dict__ holds exactly its fields, in declaration order
        return {"kind": self.kind, **self.__dict__}


@dataclass(frozen=True)
class Begin(Event):
    """The job starts: the core dispatches its initial groups."""

    kind: ClassVar[str] = "begin"


@dataclass(frozen=True)
class Tick(Event):
    """Time has advanced to ``now`` with nothing else happening (timers)."""

    kind: ClassVar[str] = "tick"


@dataclass(frozen=True)
class ExecutionFinished(Event):
    """An execution terminated: completion, failure, timeout or cancellation."""

    execution: int
    outcome: str = "completed"
    kind: ClassVar[str] = "execution_finished"

    def __init__(self, now: float, execution: int, outcome: str = "completed") -> None:
        # one per execution, the hottest event: plain stores into the fields' dict (in declaration order)
        # instead of the frozen dataclass's object.__setattr__ per field; equal, hashable and frozen as before
        fields = self.__dict__
        fields["now"] = now
        fields["execution"] = execution
        fields["outcome"] = outcome


@dataclass(frozen=True)
class HarnessStopped(Event):
    """An execution's harness process ended (its model calls are over); its evaluation may still be pending.

    The execution releases its rollout slot here (the evaluation does not use
    the model engine) but stays outstanding in the waterlevel until its
    ``ExecutionFinished``. Optional: an execution may finish without it (its
    evaluation ended with its harness), and then releases its slot at
    ``ExecutionFinished`` as before.
    """

    execution: int
    kind: ClassVar[str] = "harness_stopped"


@dataclass(frozen=True)
class GroupReady(Event):
    """A group's rewards are valid (evaluation done); it may be consumed."""

    group: int
    kind: ClassVar[str] = "group_ready"


@dataclass(frozen=True)
class GroupDropped(Event):
    """A dispatched group can never complete (its query was cancelled, its task could not be set up).

    Not for an excluded execution: that is a designated outcome and its group
    still becomes ready (docs/trajectories.md#evaluation-and-outcomes).
    """

    group: int
    kind: ClassVar[str] = "group_dropped"


@dataclass(frozen=True)
class GroupWanted(Event):
    """Streaming: the packing buffer runs short and asks for one more group."""

    kind: ClassVar[str] = "group_wanted"


@dataclass(frozen=True)
class TransitionDone(Event):
    """A cell finished switching into ``role`` ("rollout" or "training")."""

    cell: int
    role: str
    kind: ClassVar[str] = "transition_done"


@dataclass(frozen=True)
class StepDone(Event):
    """The optimizer update of training version ``version`` finished."""

    version: int
    kind: ClassVar[str] = "step_done"


@dataclass(frozen=True)
class PublishDone(Event):
    """Rollout engines now serve policy ``version``."""

    version: int
    kind: ClassVar[str] = "publish_done"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (Begin, Tick, ExecutionFinished, HarnessStopped, GroupReady, GroupDropped, GroupWanted,
                TransitionDone, StepDone, PublishDone)
}


def event_from_dict(row: dict[str, Any]) -> Event:
    """Rebuild an event from ``Event.as_dict()`` output (replay of a recorded log)."""
    data = dict(row)
    kind = data.pop("kind", None)
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown event kind {kind!r}")
    cls = EVENT_TYPES[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"event {kind!r} has unknown fields {sorted(unknown)}")
    return cls(**data)
