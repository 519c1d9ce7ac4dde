"""Designated outcomes and group readiness (docs/trajectories.md#evaluation-and-outcomes), one rule for both worlds.

Every execution of a group ends with exactly one designated outcome:

- ``VALID``: a score (possibly zero: a valid zero is trainable);
- ``PLACEHOLDER``: total failure with no evaluable work; one dummy trajectory
  with reward 0 keeps the group's counts whole (nothing of it is trained);
- ``EXCLUDED``: the budget ran out with no valid reward; no trajectories, no
  reward.

``GroupOutcomes`` is the bookkeeping of one group. The real trajectory buffer
(``groups.TrajectoryBuffer``) and the simulator (``gyre.sim.driver``) both
keep one per group, so both compute readiness, the advantages' participants
and the batch denominator identically.

Rules (our reading of docs/trajectories.md#evaluation-and-outcomes, stated there):
- a group is *ready* once N executions have a designated outcome; the first
  N to resolve are the designated ones (without oversampling: all N);
  outcomes resolved after that (oversampled surplus) are ignored;
- an excluded execution never blocks its group;
- advantages are computed over the designated VALID and PLACEHOLDER rewards
  (``participants``); an excluded execution contributes zero loss but still
  counts in the batch mean's B x N raw executions (``denominator`` = N).

Trace outcomes map onto designated outcomes with ``designated_outcome``:
``completed`` and ``harness_timeout`` (partial work scored) are VALID,
``failed`` is a PLACEHOLDER, ``overall_timeout`` is EXCLUDED.

Invariants: an execution resolves at most once; the designated list never
changes once the group is ready; participants + excluded == N when ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Hashable, TypeVar

#: how a driver names its executions: the real buffer's string ids, the simulator's integers
ExecutionKey = TypeVar("ExecutionKey", bound=Hashable)


class Designated(Enum):
    VALID = "valid"
    PLACEHOLDER = "placeholder"
    EXCLUDED = "excluded"


_FROM_TRACE = {
    "completed": Designated.VALID,
    "harness_timeout": Designated.VALID,
    "failed": Designated.PLACEHOLDER,
    "overall_timeout": Designated.EXCLUDED,
}


def designated_outcome(trace_outcome: str) -> Designated:
    """The designated outcome of an execution that ended as ``trace_outcome`` (a trace's outcome column)."""
    try:
        return _FROM_TRACE[trace_outcome]
    except KeyError:
        raise ValueError(f"no designated outcome for {trace_outcome!r}; known: {', '.join(_FROM_TRACE)}") from None


class OutcomeError(ValueError):
    """An execution resolved twice, or an unknown one; the group is unchanged."""


@dataclass
class GroupOutcomes(Generic[ExecutionKey]):
    """Designated outcomes of one group of ``N`` (see the module docstring), its executions named by any
    hashable key (the simulator resolves its integers, without building a string id per execution)."""

    N: int
    resolved: list[tuple[ExecutionKey, Designated]] = field(default_factory=list)
    _seen: set[ExecutionKey] = field(default_factory=set, repr=False)

    def resolve(self, execution_id: ExecutionKey, outcome: Designated) -> bool:
        """Record an execution's outcome; True when this made the group ready."""
        if execution_id in self._seen:
            raise OutcomeError(f"execution {execution_id!r} already has a designated outcome")
        self._seen.add(execution_id)
        self.resolved.append((execution_id, outcome))
        return len(self.resolved) == self.N

    def has(self, execution_id: ExecutionKey) -> bool:
        return execution_id in self._seen

    @property
    def ready(self) -> bool:
        return len(self.resolved) >= self.N

    @property
    def designated(self) -> list[tuple[ExecutionKey, Designated]]:
        """The first N resolved executions and their outcomes."""
        return self.resolved[: self.N]

    @property
    def participants(self) -> list[ExecutionKey]:
        """Designated executions whose rewards enter the advantages (valid and placeholder)."""
        return [e for e, o in self.designated if o is not Designated.EXCLUDED]

    @property
    def excluded(self) -> list[ExecutionKey]:
        return [e for e, o in self.designated if o is Designated.EXCLUDED]

    @property
    def denominator(self) -> int:
        """Raw executions this group adds to the batch mean's B x N."""
        return self.N
