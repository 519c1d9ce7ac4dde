"""Engine supervision for a run: a dead SGLang engine is found, restarted and put back in its cell's role.

``EngineWatch`` lives as long as the job (``runtime.job``). Its ``supervise``
task asks the engine manager every ``poll_s`` which engines exited
(``EngineManager.exited``); each dead engine is *revived*: a progress line
names it and its exit status, it is marked down (publishes skip it: the
backend asks ``unavailable()``), ``EngineManager.restart`` relaunches it on
the same port (the proxy's engine entry stays valid; meanwhile the proxy
moves its calls to a live engine in the rollout role, or, with none, holds
them until one takes calls again (``RetryPolicy.hold_s``, ``runtime.job.ENGINE_HOLD_S``);
the core, which knows
nothing of the death, keeps placing work on the engine's cell), and it is
brought back into the state the backend left it in.

The proxy's *gate* (``gate(name, serving)``, the backend's ``gate_engine``)
keeps a dead engine out of the proxy's routing: it is *held* there when its
revive begins (``proxy.routing``: its calls go to another rollout engine or
wait, while routes to it are still taken, since the core keeps placing work
on it) and released only once it is back, in the rollout role with the
newest weights, so no call reaches it between its first healthy answer and
that load (the restart brings it up on the initial weights first). The hold
is apart from the backend's drains (its cell's role): an engine back in the
training role is released too, still drained until its cell's transition
back loads the newest weights. Each restart is recorded in ``restarts``
(engine, exit code, when, seconds to come back, weight version loaded);
``gyre run`` puts them in summary.json as ``engine_restarts``.
``engines.json`` in the run folder names each engine's process group (pid),
URL and log, rewritten after every restart.

Restarts block for up to minutes, so they run off the event loop, on ONE
dedicated thread (``RestartThread``) that lives from ``start`` to ``close``:
an engine is launched with a parent-death signal tied to the launching
thread (``runtime.lifetime``), so a thread that ended early would kill the
engines it launched.

An engine whose cell is in the training role (its memory released) is
restarted at once and its memory released again (quiesce, then
release_memory), not deferred until its cell returns to rollout. So the
backend's transition back (resume_memory, load the newest weights, undrain)
finds the engine exactly as if it had never died, and the minutes a restart
takes are spent while the cell trains instead of on a transition's critical
path. ``role`` holds, per engine, the role its last completed transition left
it in; the backend's transitions call their engine operations through
``engine_ops``, which sets it.

Invariants:
- one revive per death: an engine is revived only while ``exited()`` lists it,
  under its own lock, and the restart replaces the dead process;
- a revive and the backend's engine operations on the same engine never
  overlap (one ``asyncio.Lock`` per engine); an operation that finds its
  engine dead, or fails because it died, revives it first and runs again,
  except on the way to training: then nothing waits for the engine, whose
  revive (under way or to come) reads the new role and releases its memory;
- every restart runs on the restart thread, never on the event loop;
- an engine in the rollout role leaves ``down`` only on the event loop and
  only once it holds the newest published weights (``latest()`` is read again
  after each load and after any publication under way has ended, with no await
  between the last check and the discard), so a publish that skipped it cannot
  leave it on older weights;
- a revived engine takes no proxy call before it is back: ``gate(name, False)``
  runs before its restart, ``gate(name, True)`` only after it left ``down``
  (in the rollout role, with the newest weights), and never for a lost engine;
- a failed restart (``EngineError``) is recorded in ``errors`` with the engine
  and its log, never raised into the run; the engine is then shut down and
  *lost*: never restarted again, skipped by transitions and publishes;
- once the run is over (``stop``) nothing waits for an engine to come back:
  revives under way are abandoned, operations on an engine not back are
  skipped; nothing is restarted after ``stop`` or ``close``, and an engine the
  job shut down is never restarted (``exited()`` excludes it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gyre.real.engines.manager import EngineError

ROLLOUT, TRAINING = "rollout", "training"


class RestartThread:
    """One long-lived thread that runs submitted calls in order (engine restarts, and their follow-ups)."""

    def __init__(self, name: str = "gyre-engine-restart") -> None:
        self._jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> RestartThread:
        self.thread.start()
        return self

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)

    def close(self, timeout: float) -> bool:
        """Ask the thread to end after its queued calls; True when it has ended within ``timeout``."""
        self._jobs.put(None)
        if self.thread.is_alive():
            self.thread.join(timeout)
        return not self.thread.is_alive()


def describe_exit(code: int) -> str:
    """``-9`` -> ``"killed by signal 9 (SIGKILL)"``; ``1`` -> ``"exit code 1"``."""
    if code >= 0:
        return f"exit code {code}"
    import signal

    try:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"killed by signal {-code}"


class EngineWatch:
    """Finds dead engines of ``manager`` and revives them; see the module docstring."""

    def __init__(self, manager: Any, *, latest: Callable[[], tuple[int, str] | None] = lambda: None,
                 publishing: Callable[[], Any] = lambda: None, progress: Callable[[str], None] | None = None,
                 gate: Callable[[str, bool], None] = lambda name, serving: None,
                 poll_s: float = 1.0, restart_timeout_s: float = 300.0, roster: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.manager, self.latest, self.publishing, self.poll_s = manager, latest, publishing, poll_s
        self.gate = gate  # the proxy's routing of an engine: False holds it, True releases it (see above)
        self.progress = progress or (lambda line: None)
        self.restart_timeout_s, self.roster = restart_timeout_s, None if roster is None else Path(roster)
        self.clock, self.wall = clock, wall
        self.role: dict[str, str] = {name: ROLLOUT for name in manager.engines}
        self.down: set[str] = set()    # dead or restarting
        self.lost: set[str] = set()    # restart failed: shut down, never restarted again
        self.restarts: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.closing = False
        self._locks: dict[str, asyncio.Lock] = {}
        self._reviving: dict[str, asyncio.Task] = {}  # per engine: its revive under way (on the loop)
        self.thread = RestartThread()

    def serve(self, backend: Any) -> EngineWatch:
        """Revive engines for ``backend`` (``runtime.backend.RealBackend``): its newest publication, the
        publication in flight, and its proxy gate. Called once both exist, before the watch supervises."""
        self.latest = lambda: backend.latest
        self.publishing = lambda: backend.publisher.publishing
        self.gate = backend.gate_engine
        return self

    def start(self) -> EngineWatch:
        self.thread.start()
        self.write_roster()
        return self

    # ---- for the backend --------------------------------------------------------------
    def unavailable(self) -> set[str]:
        """Engines a publish must skip: down, lost, or found dead and not yet picked up."""
        return self.down | self.lost | set(self.manager.exited())

    async def engine_ops(self, name: str, role: str, *ops: Callable[[str], Any], attempts: int = 3) -> bool:
        """Run the blocking ``ops(name)`` in order off the loop, then record ``role``; revive a dead engine
        first. False when nothing ran: the engine is lost, or dead on the way to training (a dead engine
        holds no memory: it is revived with its memory released, and the cell need not wait for that).
        Raises what a live engine raised."""
        if role == TRAINING and (name in self.down or name in self.manager.exited()):
            self.role[name] = TRAINING  # a revive under way reads it when its engine is back
            return False
        async with self._lock(name):
            for _ in range(attempts):
                code = self.manager.exited().get(name)
                down = code is not None or name in self.down
                if name in self.lost or (down and (self.closing or role == TRAINING)):
                    self.role[name] = role
                    return False  # given up; not back and the run is over; or not needed for training
                if code is not None:
                    await self._revive_task(name, code)
                    continue
                try:
                    for op in ops:
                        await asyncio.to_thread(op, name)
                except EngineError:
                    if not await self._died(name):
                        raise
                    continue  # it died under the operation: revive it and run them again
                self.role[name] = role
                return True
        names = [getattr(op, "__name__", repr(op)) for op in ops]
        raise EngineError(f"engine {name!r} died {attempts} times during {names}")

    async def _died(self, name: str, grace_s: float = 2.0) -> bool:
        """Whether ``name`` has exited, allowing ``grace_s`` for a process killed a moment ago to be reaped."""
        deadline = self.clock() + grace_s
        while name not in self.manager.exited():
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    # ---- supervision ------------------------------------------------------------------
    async def supervise(self) -> None:
        """Every ``poll_s``: revive each engine that exited (runs until cancelled or ``close``)."""
        reviving: dict[str, asyncio.Task] = {}
        try:
            while not self.closing:
                for name, code in self.manager.exited().items():
                    if name not in self.lost and (name not in reviving or reviving[name].done()):
                        reviving[name] = asyncio.ensure_future(self.revive(name, code))
                await asyncio.sleep(self.poll_s)
        finally:  # the run is over: a restart still under way is ended by close()
            for task in reviving.values():
                task.cancel()

    async def revive(self, name: str, code: int) -> None:
        async with self._lock(name):
            if self.closing or name in self.lost or self.manager.exited().get(name) is None:
                return  # already back (an operation revived it), lost, or the job is ending
            await self._revive_task(name, code)

    async def _revive_task(self, name: str, code: int) -> None:
        """Revive ``name`` (its lock held) as a task that ``stop`` can abandon."""
        task = self._reviving[name] = asyncio.ensure_future(self._revive_locked(name, code))
        await task

    async def _revive_locked(self, name: str, code: int) -> None:
        role, t0, at = self.role.get(name, ROLLOUT), self.clock(), self.wall()
        self.down.add(name)
        self.gate(name, False)  # on the loop: the backend's own drains and undrains are ordered with it
        dead = self.manager.engines[name]
        self.progress(f"engine {name} (pid {dead.process.pid}) exited: {describe_exit(code)}; "
                      f"restarting it in the {role} role")
        run = lambda fn, *args: asyncio.wrap_future(self.thread.submit(fn, *args))  # noqa: E731
        try:
            if self.closing:
                raise EngineError(f"engine {name!r} not restarted: the job is ending")
            version = await run(self._relaunch, name, role)
            while self.role[name] == ROLLOUT and (newest := await self._newest()) is not None \
                    and str(newest[0]) != version:
                version = await run(self._load, name, newest)
            if role == ROLLOUT and self.role[name] == TRAINING:  # its cell went to training meanwhile
                await run(self._release, name)
        except (EngineError, OSError) as exc:
            self.lost.add(name)
            self.down.discard(name)
            log = self.manager.engines[name].log_path
            self.errors.append(f"engine {name} ({describe_exit(code)}) could not be restarted (log {log}): {exc}")
            self.progress(f"engine {name} could not be restarted; the run continues on the other engines "
                          f"(log {log})")
            await run(self.manager.shutdown, name)
            return
        self.down.discard(name)  # no await since the last latest() check: no publish can slip between
        self.gate(name, True)  # rollout: the newest weights are in; training: drained until its cell returns
        back_s = self.clock() - t0
        self.restarts.append({"engine": name, "exit_code": code, "at_unix": at, "back_s": back_s,
                              "back_unix": at + back_s, "role": self.role[name], "version": version,
                              "pid": self.manager.engines[name].process.pid})
        self.write_roster()
        self.progress(f"engine {name} back after {back_s:.1f} s ({self.role[name]} role, "
                      f"weights version {version})")

    async def _newest(self) -> tuple[int, str] | None:
        """The newest published weights once no publication is under way (one under way skipped this
        engine while it was down)."""
        while (pending := self.publishing()) is not None and not pending.done():
            await asyncio.wait({pending})
        return self.latest()

    def _relaunch(self, name: str, role: str) -> str:
        """On the restart thread: restart ``name``; rollout: with the newest weights; training: memory
        released again. The weight version it holds ("0": the initial model)."""
        newest = self.latest() if role == ROLLOUT else None
        self.manager.restart(name, timeout=self.restart_timeout_s,
                             weights=None if newest is None else (newest[1], str(newest[0])))
        if role == TRAINING:
            self._release(name)
        return "0" if newest is None else str(newest[0])

    def _release(self, name: str) -> None:
        """As the backend's transition to training: quiesce (idle, so the release cannot race), release."""
        self.manager.quiesce(name)
        self.manager.release_memory(name)

    def _load(self, name: str, newest: tuple[int, str]) -> str:
        self.manager.update_weights_from_disk(name, newest[1], weight_version=str(newest[0]))
        return str(newest[0])

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def stop(self) -> None:
        """The run is over (on the loop): revive nothing more and abandon revives under way, so nothing
        waits for an engine to come back; ``close`` ends the restarts they left on the thread."""
        self.closing = True
        for task in self._reviving.values():
            task.cancel()

    # ---- records and shutdown ---------------------------------------------------------
    def write_roster(self) -> None:
        """``engines.json``: engine -> pid (its process group), url, log, restarts."""
        if self.roster is None:
            return
        data = {name: {"pid": e.process.pid, "url": e.url, "log": str(e.log_path), "restarts": e.restarts}
                for name, e in self.manager.engines.items()}
        tmp = self.roster.with_name(self.roster.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.roster)

    def close(self, timeout: float = 60.0) -> None:
        """Restart nothing more, stop every engine, end the restart thread. A restart in progress is ended
        by shutting its new engine down (its health wait then fails at once)."""
        self.closing = True
        deadline = time.monotonic() + timeout
        while True:
            self.manager.shutdown_all()  # also catches an engine the thread launched a moment ago
            if self.thread.close(1.0) or time.monotonic() >= deadline:
                break
        self.manager.shutdown_all()
