"""A read-only copy of the policy core's state: what tests, metrics and resume read.

``Scheduler.snapshot()`` returns a ``SchedulerSnapshot``: frozen, holding only
immutable values (tuples, frozensets, read-only mappings of frozen records), so
a reader can keep it, compare two of them or hand it on without reaching into
the scheduler or changing it. Like h11's ``Connection.states``, it is a view
the machine gives out, not a door into it.

Invariants: a snapshot never changes after it is taken and shares no mutable
object with the scheduler; ``groups[g].staleness`` is ``gyre.staleness``'s
v_t - v_d (None until the group is fed); the counters satisfy
d >= p >= f and waterlevel = d - f, queued = d - p, running = p - f.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

from gyre import roles as R
from gyre.staleness import group_staleness


@dataclass(frozen=True)
class GroupView:
    """One dispatched group: its dispatch version v_d, training version v_t (None: not fed yet),
    executions closed, and whether it is ready or dropped."""

    v_d: int
    v_t: int | None
    closed: int
    ready: bool
    dropped: bool

    @property
    def staleness(self) -> int | None:
        return None if self.v_t is None else group_staleness(self.v_d, self.v_t)


class CounterViews:
    """What the counters d, p, f and the cells' roles give, defined once for the scheduler and its
    snapshot (both hold ``d``, ``p``, ``f`` and ``roles``)."""

    d: int
    p: int
    f: int
    roles: Sequence[str]

    @property
    def waterlevel(self) -> int:
        return self.d - self.f

    @property
    def queued(self) -> int:
        return self.d - self.p

    @property
    def running(self) -> int:
        """p - f: started and not terminated (holding a slot or with a stopped harness)."""
        return self.p - self.f

    def switching(self) -> bool:
        """Some cell is between roles."""
        return any(role in (R.TO_TRAINING, R.TO_ROLLOUT) for role in self.roles)


@dataclass(frozen=True)
class SchedulerSnapshot(CounterViews):
    now: float | None
    d: int
    p: int
    f: int
    version: int                  # the policy version the open (or next) batch trains
    published: int                # the newest published version
    burst: int                    # bursts completed (publications done)
    steps_in_burst: int
    roles: tuple[str, ...]        # cell -> role (``gyre.roles``)
    batch_open: bool
    fed: int                      # groups fed to the open batch
    wants: int                    # streaming asks not answered yet
    awaiting_publish: bool
    supply_since: float | None    # the supply timer's start (None: supply too low)
    holding: int                  # executions holding a rollout slot
    capacity: int                 # C_R now
    ready_unclaimed: int
    training_cells: tuple[int, ...]
    placements: Mapping[int, int]       # execution holding a slot -> engine (a cell, or SEPARATE)
    stopped: frozenset[int]             # harness stopped, evaluation pending (holding no slot)
    groups: Mapping[int, GroupView]

    def staleness(self) -> dict[int, int]:
        """Group -> v_t - v_d of every group fed so far, in group order."""
        return {g: view.staleness for g, view in sorted(self.groups.items()) if view.staleness is not None}


def read_only(mapping: dict) -> Mapping:
    """A read-only view of a private copy of ``mapping``."""
    return MappingProxyType(dict(mapping))
