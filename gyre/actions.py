"""Actions the policy core returns; drivers (sim/, real/) apply them.

Engines are named by integers: ``0..K-1`` are the cells' rollout engines and
``SEPARATE`` (-1) is the separate rollout pool. Actions are frozen dataclasses
that export themselves as flat dicts, so two drivers' action sequences can be
compared row by row. Their fields are immutable scalars and tuples, so
``as_dict`` is a shallow copy of the fields (equal to ``dataclasses.asdict``,
key for key and in the same order, without its recursive deep copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

SEPARATE = -1


@dataclass(frozen=True)
class Action:
    kind: ClassVar[str] = "action"

    def as_dict(self) -> dict[str, Any]:
        # a frozen dataclass's __dict__ holds exactly its fields, in declaration order
        return {"kind": self.kind, **self.__dict__}


@dataclass(frozen=True)
class DispatchGroups(Action):
    """Admit these groups; each group's executions are ``executions_of(group)``."""

    groups: tuple[int, ...]
    version: int
    kind: ClassVar[str] = "dispatch_groups"


@dataclass(frozen=True)
class StartExecutions(Action):
    """Start each execution on its engine: ``placements`` of (execution, engine)."""

    placements: tuple[tuple[int, int], ...]
    kind: ClassVar[str] = "start_executions"


@dataclass(frozen=True)
class CancelExecutions(Action):
    """Cancel a ready group's surplus executions (oversampling).

    ``executions`` are running (a stopped harness's pending evaluation
    included): the driver cancels them and reports each as
    ExecutionFinished. ``dropped`` were still queued: they never start and
    are already counted as started and terminated.
    """

    executions: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    kind: ClassVar[str] = "cancel_executions"


@dataclass(frozen=True)
class Reroute(Action):
    """Move a running execution's requests from engine ``source`` to ``dest``."""

    execution: int
    source: int
    dest: int
    kind: ClassVar[str] = "reroute"


@dataclass(frozen=True)
class BeginTransition(Action):
    """Switch ``cell`` into ``role``; the driver answers with TransitionDone."""

    cell: int
    role: str
    kind: ClassVar[str] = "begin_transition"


@dataclass(frozen=True)
class StartBatch(Action):
    """A new batch (training version ``version``) opens on the training cells.

    ``final``: this is the burst's last update, so the core publishes after it
    (drivers never compute burst boundaries themselves).
    """

    version: int
    final: bool = False
    kind: ClassVar[str] = "start_batch"


@dataclass(frozen=True)
class FeedGroups(Action):
    """Hand these ready groups to the batch of ``version`` (oldest version first)."""

    version: int
    groups: tuple[int, ...]
    kind: ClassVar[str] = "feed_groups"


@dataclass(frozen=True)
class Broadcast(Action):
    """After a non-final update, send new parameters to the satellites."""

    version: int
    cells: tuple[int, ...]
    kind: ClassVar[str] = "broadcast"


@dataclass(frozen=True)
class Publish(Action):
    """After a burst's final update, publish ``version`` to the rollout engines."""

    version: int
    kind: ClassVar[str] = "publish"


ACTION_TYPES: dict[str, type[Action]] = {
    cls.kind: cls
    for cls in (DispatchGroups, StartExecutions, CancelExecutions, Reroute, BeginTransition, StartBatch,
                FeedGroups, Broadcast, Publish)
}
