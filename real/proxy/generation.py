"""One model call's generation, kept alive across reroutes and engine failures.

``generate`` submits the prompt to the execution's engine and yields the new
output tokens as they stream in. Two things can interrupt a submission:

- a *move* (admin reroute or drain evacuation): the source response is closed,
  ``/abort_request`` is sent to the source, and the call is resubmitted to the
  new route with ``input_ids + tokens generated so far`` and the remaining
  token budget. Moves do not count against the retry budget;
- an *engine failure* (refused, reset, 5xx, timeout, error chunk, truncated
  stream): the engine is excluded for this call, the execution is routed to
  another engine, and the call is resubmitted the same way, within
  ``RetryPolicy.attempts`` failures and ``budget_s`` seconds. When nothing is
  left, ``Overloaded`` is raised and the API answers its own overload error.
  An engine that rejects the request itself (non-retryable: invalid sampling
  values, too long for its context) raises ``EngineRejected`` at once (a 400,
  not counted as an engine failure).

With ``RetryPolicy.hold_s`` > 0, a call that finds no engine to take it (all
draining, or all others failed for it) is held instead of answered with the
overload error: every ``hold_poll_s`` it tries again, every engine included
(a dead engine may be back under its id), with a fresh failure budget, until
``hold_s`` has passed without a token (then ``Overloaded``). ``log.holds``
counts the waits, ``log.held_s`` their total.

Invariants:
- the consumer sees one continuous token sequence: tokens are yielded once,
  in order, and a resubmission continues exactly after the last yielded token;
- every yielded token has its behaviour log-probability from the engine that
  sampled it (continuations are conditioned on the same prefix, so the
  recorded call is one call, never a fragment or a duplicate);
- the flight is registered with the router for exactly the lifetime of each
  submission, so ``Router.reroute`` reaches every in-flight request;
- the total number of output tokens never exceeds ``max_new_tokens``;
- ``log.move_stalls_s`` has one entry per move after which a chunk reached the
  consumer: the time from the last chunk before the move (or the call's start)
  to the first chunk after it, i.e. the pause a harness sees in its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Sequence

import numpy as np

from gyre.real.proxy.config import RetryPolicy
from gyre.real.proxy.engine_client import EngineCallError, EngineClient, TokenChunk
from gyre.real.proxy.ids_json import IdsJson
from gyre.real.proxy.request import EngineRejected, Overloaded
from gyre.real.proxy.routing import Flight, Router

__all__ = ["EngineRejected", "Generation", "GenerationLog", "Overloaded"]
FAILURES_KEPT = 20


@dataclass
class GenerationLog:
    """What happened to one call: engines used, failures, moves, finish."""

    engines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    moves: int = 0
    move_stalls_s: list[float] = field(default_factory=list)  # per move: last token before -> first after
    finish: dict[str, Any] | None = None
    weight_version: str | None = None
    holds: int = 0
    held_s: float = 0.0


async def _abort_later(client: EngineClient, router: Router, engine_id: str, rid: str) -> None:
    state = router.engines.get(engine_id)
    if state is not None:
        await client.abort(state.spec, rid)


class Generation:
    """Async iterator of ``TokenChunk``s for one call; see the module invariants."""

    def __init__(self, router: Router, client: EngineClient, retry: RetryPolicy, *, execution_id: str,
                 request_id: str, input_ids: Sequence[int], sampling: dict[str, Any],
                 ids_json: IdsJson | None = None) -> None:
        self.router, self.client, self.retry = router, client, retry
        self.flight = Flight(execution_id, request_id)
        self.input_ids = np.asarray(input_ids, dtype=np.int32)  # never copied into a Python list
        self.ids_json = ids_json  # the execution's encoded id lists (``proxy.ids_json``)
        self.sampling = dict(sampling)
        self.max_new = int(sampling["max_new_tokens"])
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.log = GenerationLog()
        self._background: set[asyncio.Task] = set()
        self._last_token_at = time.monotonic()  # the call's start until its first token
        self._stall_from: float | None = None   # set by a move, closed by the next token
        self._failed = 0  # engine failures since the call's start or its last hold (the ``attempts`` budget)
        self._deadline = 0.0  # end of the current retry budget (``budget_s``)
        self._hold_until: float | None = None  # a hold's end; cleared when a token arrives

    async def __aiter__(self) -> AsyncGenerator[TokenChunk, None]:
        self._deadline = time.monotonic() + self.retry.budget_s
        excluded: set[str] = set()
        submission = 0
        while self.log.finish is None:
            if len(self.output_ids) >= self.max_new:
                self.log.finish = {"type": "length", "length": self.max_new}
                break
            engine = self.router.engine_for(self.flight.execution_id, excluded)
            if engine is None:
                if await self._hold(excluded):
                    continue
                raise Overloaded(f"no engine available for execution {self.flight.execution_id} "
                                 f"({self._held()}failures: {'; '.join(self.log.failures[-3:]) or 'none'})")
            rid = f"{self.flight.request_id}.{submission}"
            submission += 1
            self.router.begin(self.flight, engine)
            self.log.engines.append(engine.spec.id)
            failed = finished = rejected = False
            try:
                async with contextlib.aclosing(self._submit(engine.spec, rid)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                finished = self.log.finish is not None
            except EngineCallError as exc:
                if self.flight.moved:
                    self._on_move(engine.spec.id, rid)
                    continue
                failed, rejected = exc.retryable, not exc.retryable  # a rejection is the client's fault
                self._on_failure(exc, engine.spec.id, excluded)
                await asyncio.sleep(self.retry.backoff_s)
            finally:
                self.router.end(self.flight, failed=failed, finished=finished)
                if self.log.finish is None and not (failed or rejected or self.flight.moved):
                    self._schedule_abort(engine.spec.id, rid)  # the consumer went away
            if self.flight.moved and self.log.finish is None:
                self._on_move(engine.spec.id, rid)

    async def _submit(self, engine, rid: str) -> AsyncGenerator[TokenChunk, None]:
        sampling = dict(self.sampling, max_new_tokens=self.max_new - len(self.output_ids))
        context = self.input_ids if not self.output_ids else np.concatenate(
            [self.input_ids, np.asarray(self.output_ids, dtype=np.int32)])
        stream = self.client.stream(engine, rid, context, sampling,
                                    attach=self.flight.attach, ids_json=self.ids_json)
        try:
            async for chunk in stream:
                if self.flight.moved:
                    break  # tokens of a moved submission after the move are dropped
                chunk = self._clip(chunk)
                self.output_ids.extend(chunk.ids)
                self.logprobs.extend(chunk.logprobs)
                if chunk.weight_version is not None:
                    self.log.weight_version = chunk.weight_version
                if chunk.finish is not None:
                    self.log.finish = chunk.finish
                if chunk.ids or chunk.finish is not None:
                    self._mark_delivery()
                    yield chunk
                if chunk.finish is not None:
                    return
        finally:
            await stream.aclose()

    def _clip(self, chunk: TokenChunk) -> TokenChunk:
        room = self.max_new - len(self.output_ids)
        if len(chunk.ids) <= room:
            return chunk
        return TokenChunk(chunk.ids[:room], chunk.logprobs[:room], {"type": "length", "length": self.max_new},
                          chunk.weight_version)

    async def _hold(self, excluded: set[str]) -> bool:
        """No engine can take the call: wait ``hold_poll_s`` and let it try every engine again (False: the
        hold is off or over)."""
        now = time.monotonic()
        if self.retry.hold_s <= 0:
            return False
        if self._hold_until is None:
            self._hold_until = now + self.retry.hold_s
            self.log.holds += 1
        if now >= self._hold_until:
            return False
        pause = min(self.retry.hold_poll_s, self._hold_until - now)
        await asyncio.sleep(pause)
        self.log.held_s += pause
        excluded.clear()
        self._failed, self._deadline = 0, time.monotonic() + self.retry.budget_s
        return True

    def _held(self) -> str:
        return f"held {self.log.held_s:.1f} s, " if self.log.holds else ""

    def _mark_delivery(self) -> None:
        """A chunk reaches the consumer: close the stall a move opened (the wait a harness sees)."""
        now = time.monotonic()
        self._hold_until = None  # served again: a later outage gets a whole hold
        if self._stall_from is not None:
            self.log.move_stalls_s.append(now - self._stall_from)
            self._stall_from = None
        self._last_token_at = now

    def _on_move(self, engine_id: str, rid: str) -> None:
        if self._stall_from is None:
            self._stall_from = self._last_token_at
        self.log.moves += 1
        self.flight.reroutes += 1
        self._schedule_abort(engine_id, rid)

    def _schedule_abort(self, engine_id: str, rid: str) -> None:
        task = asyncio.ensure_future(_abort_later(self.client, self.router, engine_id, rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_failure(self, exc: EngineCallError, engine_id: str, excluded: set[str]) -> None:
        self.log.failures.append(str(exc))
        del self.log.failures[:-FAILURES_KEPT]  # a long hold on a dead engine fails every poll
        if not exc.retryable:  # the engine found the request itself invalid: a client error
            raise EngineRejected(str(exc)) from None
        excluded.add(engine_id)
        self._failed += 1
        if self._failed >= self.retry.attempts or time.monotonic() >= self._deadline:
            if self.retry.hold_s > 0 and (self._hold_until is None or time.monotonic() < self._hold_until):
                excluded.update(self.router.engines)  # nothing left to try now: the call holds
                return
            raise Overloaded(f"gave up after {self._failed} engine failures ({self._held()}"
                             f"{len(self.log.failures)} in all): {exc}") from None
        if len(excluded) >= len(self.router.engines):
            excluded.clear()  # every engine failed once: try them again while budget remains
            excluded.add(engine_id)
