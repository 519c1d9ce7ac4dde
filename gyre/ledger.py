"""Rollout capacity ledger: which engine serves which running execution.

Engines are the separate pool (``SEPARATE``, capacity C_s) and each cell's
rollout engine (capacity C_e). An engine *accepts* work only while its cell is
in the rollout role (the pool always accepts when C_s > 0).

An execution leaves the ledger at its HarnessStopped or, without one, at its
ExecutionFinished; one whose harness has stopped is in no engine's members,
so ``evacuate`` never reroutes it.

Invariants:
- every placed execution sits on exactly one accepting engine;
- no engine holds more executions than its capacity;
- placement and rerouting prefer the separate pool, then rollout cells in
  reverse index order (the cell expected to stay in rollout longest), so an
  execution is not rerouted twice in one burst.
"""

from __future__ import annotations

from typing import Callable

from gyre.actions import SEPARATE
from gyre.config import SchedulerConfig


class LedgerError(RuntimeError):
    """An internal placement failure (a broken waterlevel guarantee)."""


class RolloutLedger:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self._capacity: dict[int, int] = {c: cfg.C_e for c in range(cfg.K)}
        self._capacity[SEPARATE] = cfg.C_s
        self._preference: tuple[int, ...] = (SEPARATE, *range(cfg.K - 1, -1, -1))
        self._accepting: set[int] = {SEPARATE} if cfg.C_s > 0 else set()
        self._accepting_capacity = sum(self._capacity[e] for e in self._accepting)  # kept by open/close
        self._members: dict[int, set[int]] = {e: set() for e in self._preference}
        self._where: dict[int, int] = {}
        # holds(x): the dict's own membership test, bound once (the core asks it once per finish); _where is
        # never rebound
        self.holds: Callable[[int], bool] = self._where.__contains__
        self._open_order: list[tuple[int, set[int], int]] = []  # (engine, members, capacity): accepting, in order
        self._position: dict[int, int] = {}  # accepting engine -> its position in _open_order
        self._full_below = 0  # every engine before this position of _open_order is full: place starts here
        self._order_open()

    # ---- queries ------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """C_R: total capacity of the accepting engines (a running total: read several times per event)."""
        return self._accepting_capacity

    @property
    def running(self) -> int:
        return len(self._where)

    def engine_of(self, execution: int) -> int:
        return self._where[execution]

    def accepting(self, engine: int) -> bool:
        return engine in self._accepting

    def load(self, engine: int) -> int:
        return len(self._members[engine])

    def executions_on(self, engine: int) -> tuple[int, ...]:
        return tuple(sorted(self._members[engine]))

    def placements(self) -> dict[int, int]:
        return dict(self._where)

    # ---- changes ------------------------------------------------------------
    def open(self, engine: int) -> None:
        """The engine starts accepting work (its cell is back in rollout)."""
        if engine not in self._accepting:
            self._accepting_capacity += self._capacity[engine]
            self._accepting.add(engine)
            self._order_open()

    def close(self, engine: int) -> None:
        """The engine stops accepting; it must have been emptied by ``evacuate``."""
        if self._members[engine]:
            raise LedgerError(f"engine {engine} closed while serving {len(self._members[engine])} executions")
        if engine in self._accepting:
            self._accepting_capacity -= self._capacity[engine]
            self._accepting.discard(engine)
            self._order_open()

    def place(self, execution: int, exclude: frozenset[int] = frozenset()) -> int:
        """Put an execution on the most preferred accepting engine with room."""
        order = self._open_order
        for position in range(self._full_below, len(order)):  # the engines before are full: not asked again
            engine, on_engine, capacity = order[position]
            if len(on_engine) < capacity and engine not in exclude:
                on_engine.add(execution)
                self._where[execution] = engine
                if not exclude:  # else an engine passed over may have room
                    self._full_below = position
                return engine
        raise LedgerError(f"no accepting engine has room for execution {execution}")

    def _order_open(self) -> None:
        """``place``'s list of the accepting engines in order of preference (changed only by open and close)."""
        self._open_order = [(e, self._members[e], self._capacity[e]) for e in self._preference if e in self._accepting]
        self._position = {engine: position for position, (engine, _, _) in enumerate(self._open_order)}
        self._full_below = 0

    def release(self, execution: int) -> None:
        engine = self._where.pop(execution)
        self._members[engine].discard(execution)
        position = self._position.get(engine)
        if position is not None and position < self._full_below:  # it has room again
            self._full_below = position

    def evacuate(self, engines: frozenset[int]) -> list[tuple[int, int, int]]:
        """Move every execution off ``engines``; returns (execution, source, dest)."""
        moves = []
        for source in sorted(engines):
            for execution in sorted(self._members[source]):
                self.release(execution)
                moves.append((execution, source, self.place(execution, exclude=engines)))
        return moves
