"""Routing table execution -> engine, drains and reroutes (docs/scheduler.md#role-transitions).

The router is driven by the admin API (the scheduler's ``Reroute`` actions)
and by engine failures. It holds no I/O: moving an in-flight request only
closes that request's engine response; the generation loop
(``proxy.generation``) notices, aborts the source request and resubmits to
the new route with the tokens already generated.

Invariants:
- a draining engine is never chosen for a new submission; an execution routed
  to it keeps its route until rerouted, but its new requests go elsewhere (and
  the route follows them);
- a *held* engine (not ready: restarting, or loading the newest weights; set
  by the job's engine watch) is never chosen for a new submission either, but
  it still takes routes, and an execution routed to it keeps its route: its
  new requests go to another engine for now, or wait (``proxy.generation``
  holds them) when none is left, and come back to it once it is released;
- ``reroute`` changes the route first and then moves every in-flight request of
  the execution that runs elsewhere, so a resubmission always finds the new route;
- a flight is moved at most once per route change, and a flight moved before
  its response is attached closes that response as soon as it attaches;
- an execution with a route always names a known engine (engines are never
  removed while routed; ``remove_engine`` refuses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from gyre.real.proxy.config import EngineSpec


class RoutingError(ValueError):
    """An admin routing command that cannot be applied; the message says why."""


@dataclass
class EngineState:
    spec: EngineSpec
    draining: bool = False
    held: bool = False
    in_flight: int = 0
    failures: int = 0
    served: int = 0

    def as_dict(self, routed: int) -> dict[str, Any]:
        return {"id": self.spec.id, "url": self.spec.url, "draining": self.draining, "held": self.held,
                "in_flight": self.in_flight, "routed_executions": routed,
                "failures": self.failures, "served": self.served}


@dataclass(eq=False)
class Flight:
    """One in-flight model call: which engine serves it now, and its engine response."""

    execution_id: str
    request_id: str
    engine_id: str = ""
    moved: bool = False
    reroutes: int = 0
    _response: Any = field(default=None, repr=False)

    def attach(self, response: Any) -> None:
        self._response = response
        if self.moved:
            response.close()

    def detach(self) -> None:
        self._response = None

    def move(self) -> None:
        """Ask the generation loop to leave the current engine (closes its stream)."""
        self.moved = True
        if self._response is not None:
            self._response.close()


class Router:
    """Routes, drains and in-flight bookkeeping; see the module invariants."""

    def __init__(self, engines: Iterable[EngineSpec]) -> None:
        self.engines: dict[str, EngineState] = {e.id: EngineState(e) for e in engines}
        self.routes: dict[str, str] = {}
        self._flights: dict[str, set[Flight]] = {}

    # -- choosing engines -----------------------------------------------------

    def routed_count(self, engine_id: str) -> int:
        return sum(1 for e in self.routes.values() if e == engine_id)

    def _least_loaded(self, exclude: Iterable[str]) -> EngineState | None:
        excluded = set(exclude)
        candidates = [s for s in self.engines.values()
                      if not (s.draining or s.held) and s.spec.id not in excluded]
        if not candidates:
            return None
        load = {s.spec.id: 0 for s in candidates}
        for engine_id in self.routes.values():
            if engine_id in load:
                load[engine_id] += 1
        return min(candidates, key=lambda s: (load[s.spec.id] + s.in_flight, s.spec.id))

    def engine_for(self, execution_id: str, exclude: Iterable[str] = ()) -> EngineState | None:
        """The engine for a new submission of ``execution_id`` (None: no engine left)."""
        excluded = set(exclude)
        current = self.engines.get(self.routes.get(execution_id, ""))
        if current is not None and not (current.draining or current.held) and current.spec.id not in excluded:
            return current
        chosen = self._least_loaded(excluded)
        if chosen is not None and (current is None or not current.held):  # a held route stays: it comes back
            self.routes[execution_id] = chosen.spec.id
        return chosen

    # -- in-flight bookkeeping -------------------------------------------------

    def begin(self, flight: Flight, engine: EngineState) -> None:
        flight.engine_id, flight.moved = engine.spec.id, False
        engine.in_flight += 1
        self._flights.setdefault(flight.execution_id, set()).add(flight)

    def end(self, flight: Flight, *, failed: bool = False, finished: bool = False) -> None:
        engine = self.engines.get(flight.engine_id)
        if engine is not None:
            engine.in_flight -= 1
            engine.failures += int(failed)
            engine.served += int(finished)
        flights = self._flights.get(flight.execution_id)
        if flights is not None:
            flights.discard(flight)
            if not flights:
                del self._flights[flight.execution_id]
        flight.detach()

    def in_flight(self, execution_id: str) -> list[Flight]:
        return list(self._flights.get(execution_id, ()))

    # -- admin commands --------------------------------------------------------

    def _engine(self, engine_id: str) -> EngineState:
        try:
            return self.engines[engine_id]
        except KeyError:
            raise RoutingError(f"unknown engine {engine_id!r}; known: {sorted(self.engines)}") from None

    def drain(self, engine_id: str, draining: bool = True) -> None:
        self._engine(engine_id).draining = draining

    def hold(self, engine_id: str, held: bool = True) -> None:
        """Hold (or release) ``engine_id``: see the module invariants."""
        self._engine(engine_id).held = held

    def check_destination(self, dest_id: str) -> None:
        """RoutingError unless ``dest_id`` is a known engine that takes new requests."""
        if self._engine(dest_id).draining:
            raise RoutingError(f"engine {dest_id!r} is draining and takes no new requests")

    def reroute(self, execution_id: str, dest_id: str) -> int:
        """Route ``execution_id`` to ``dest_id`` and move its in-flight requests there."""
        self.check_destination(dest_id)
        self.routes[execution_id] = dest_id
        moved = 0
        for flight in self.in_flight(execution_id):
            if flight.engine_id != dest_id and not flight.moved:
                flight.move()
                moved += 1
        return moved

    def evacuate(self, source_id: str, dest_id: str | None = None) -> dict[str, str]:
        """Reroute every execution routed to (or running on) ``source_id``; returns the new routes."""
        self._engine(source_id)
        affected = {e for e, r in self.routes.items() if r == source_id}
        affected |= {f.execution_id for fs in self._flights.values() for f in fs if f.engine_id == source_id}
        moves = {}
        for execution_id in sorted(affected):
            dest = self._engine(dest_id) if dest_id else self._least_loaded({source_id})
            if dest is None:
                raise RoutingError(f"no engine left to take the executions of {source_id!r}")
            self.reroute(execution_id, dest.spec.id)
            moves[execution_id] = dest.spec.id
        return moves

    def add_engine(self, spec: EngineSpec) -> None:
        if spec.id in self.engines:
            raise RoutingError(f"engine {spec.id!r} already exists")
        self.engines[spec.id] = EngineState(spec)

    def remove_engine(self, engine_id: str) -> None:
        state = self._engine(engine_id)
        if self.routed_count(engine_id) or state.in_flight:
            raise RoutingError(f"engine {engine_id!r} still has routed executions or requests in flight")
        del self.engines[engine_id]

    def snapshot(self) -> dict[str, Any]:
        return {"engines": [s.as_dict(self.routed_count(i)) for i, s in sorted(self.engines.items())],
                "routes": dict(sorted(self.routes.items()))}
