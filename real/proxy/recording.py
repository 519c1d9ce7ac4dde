"""Per-execution state of the proxy: durable TITO records, trees and caches.

Every completed model call becomes one ``ModelCall`` appended to its
execution's log (``gyre.real.store.tito_log``) and added to its in-memory
``TrajectoryTree``. Beside them each execution keeps what the proxy needs to
re-encode the next request exactly:

- a ``ToolCallCache`` (``gyre.trajectory.tool_calls``) of the tool-call blocks
  the proxy returned, in the API's own shape, restored into later histories;
- an *echo map* from the ids of those tool calls (or from the visible text of
  an output without tool calls) to the raw output text the model wrote, so the
  history is rendered with the model's own text and the prefix cache
  (``proxy.tokenize.PrefixCache``) reuses the sampled token ids verbatim.

All of it is rebuilt from the log when a restarted proxy first sees the
execution again (``Recorder.state`` replays the log through
``ExecutionState.learn``), so a restart changes nothing a
harness can observe.

Invariants:
- a record reaches the log before the harness receives the end of its
  response (the API layers commit first), so a call the harness saw complete
  is on disk, and a call cut short is never recorded;
- with ``fsync`` the records of concurrent calls are committed in groups
  (``group_commit.GroupCommit``): a commit returns only after the batch holding
  its record is synced in the records folder's commit journal (one
  ``fdatasync`` per batch), so nothing acknowledged is lost to a kill -9 or a
  machine crash (the group commit opened at the next start replays it);
  a commit marked ``alone`` (no other model call in flight) waits for the
  writer on the event loop's thread, for at most ``ALONE_WAIT_S``, instead of
  through the loop: the writer releases a lock, and neither wakes the loop
  nor settles a future (a future, and a wake-up through
  ``call_soon_threadsafe``, are made only for a commit awaited through the
  loop). Past ``ALONE_WAIT_S`` it waits through the loop as every other
  commit does. A lone commit's ``begin`` first waits, also on the loop's thread and
  for at most ``ALONE_WAIT_S``, until the writer has written the record and only
  the journal's ``fdatasync`` is left (``GroupCommit.submit``'s ``written``): the
  GIL keeps the writer from running while the loop works, so without this the
  writer would start only once the loop blocks in ``wait``, and the loop would idle
  through the whole commit; so the caller's last work runs during the sync.
  The sync itself never runs on the loop's thread, lone or not
  (``GroupCommit.commit_here`` would spare the hand-offs, but a stalled disk
  would then stall every call: see the next point);
- no disk I/O of a commit runs on the event loop's thread (without ``fsync`` too: records are
  appended by one writer thread), and a commit waits
  at most ``write_timeout_s`` for its record to be durable: a stalled disk
  (a write or sync that does not return) fails the calls whose records it
  holds with a 503 ``RecordsStalled`` while the loop serves everything else
  (streams, the admin API, ``GET /``). Every call's record goes through the
  one commit journal, so while the disk stalls no call can be acknowledged;
  a stalled record that lands later stays (durable, never acknowledged: the
  harness may retry it, as after a cut stream), and joins its tree;
- one execution's state is only reachable through that execution's key; the
  admin API reads all of them;
- commits of one execution are serialized (one lock per execution), so the
  log order equals the tree order;
- a committed call joins its execution's tree and caches on the event loop's
  next turn (unless a write to a slow client waits, after the answer's last
  bytes went to the socket), or sooner:
  ``Recorder.state`` learns every queued call first, so no reader of an
  execution's state (the next call, the admin API) sees it without them.
"""

from __future__ import annotations

import _thread
import asyncio
import errno
import hashlib
import json
import logging
import os
import secrets
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gyre.real.proxy.config import ProxyConfigError, check_id, valid_id
from gyre.real.proxy.ids_json import IdsJson
from gyre.real.proxy.rendering import RenderCache
from gyre.real.proxy.request import ApiError
from gyre.real.proxy.tokenize import ChatTokenizer, PrefixCache
from gyre.real.proxy.toolcalls import parse_output, trim_stop
from gyre.real.store.durable import SYSTEM_DISK, Disk
from gyre.real.store.group_commit import GroupCommit
from gyre.real.store.tito_log import ExecutionStore
from gyre.trajectory.records import ModelCall
from gyre.trajectory.tool_calls import ToolCallCache
from gyre.trajectory.tree import TrajectoryTree
from gyre.trajectory.tree_stats import tree_stats

log = logging.getLogger("gyre.proxy")
ALONE_WAIT_S = 0.002  # how long a lone call's commit may hold the event loop's thread (module invariants)


def api_tool_block(api: str, call: Mapping[str, Any]) -> dict[str, Any]:
    """The tool-call block the proxy returned for ``call`` (id, name, arguments) in ``api``'s shape."""
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    if api == "anthropic":
        return {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["arguments"]}
    if api == "responses":
        return {"type": "function_call", "call_id": call["id"], "name": call["name"], "arguments": arguments}
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": arguments}}


def api_output_message(api: str, calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    blocks = [api_tool_block(api, c) for c in calls]
    if api == "anthropic":
        return {"role": "assistant", "content": blocks}
    if api == "responses":
        return {"role": "assistant", "content": blocks}  # items are matched one by one on restore
    return {"role": "assistant", "tool_calls": blocks}


class ExecutionState:
    """Tree, tool-call cache, echo map and prefix cache of one execution."""

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.tree = TrajectoryTree(execution_id)
        self.tool_cache = ToolCallCache()
        self.prefix = PrefixCache(self.tree.request_sequence)
        self.rendered = RenderCache()
        self.ids_json = IdsJson()  # the JSON of the id lists sent to the engine, extended call to call
        self.echo: dict[Any, str] = {}
        self.lock = asyncio.Lock()
        self.requests = 0
        self.unlearned: deque[tuple[ModelCall, str]] = deque()  # committed, not yet learned (``Recorder.state``)

    def learn(self, call: ModelCall, chat: ChatTokenizer, prompt_text: str | None = None) -> None:
        """Update the caches with a committed call (also used when replaying a log)."""
        placement = self.tree.add(call)
        self.requests += 1
        if prompt_text is None:
            prompt_text = chat.decode(call.input_ids.tolist())
        output_ids = call.output_ids.tolist()
        output_text = chat.decode(output_ids)
        self.prefix.add(prompt_text, output_text, len(call.input_ids), placement.request)
        stopped = bool(output_ids) and output_ids[-1] in chat.stop_token_ids
        raw = chat.decode(output_ids[:-1]) if stopped else output_text  # decoded once when nothing is cut
        calls = [dict(c) for c in call.tool_calls]
        for payload in calls:
            self.echo[("call", payload["id"])] = raw
        if calls:
            api = str(call.role_hints.get("api", "anthropic"))
            self.tool_cache.remember(api_output_message(api, calls))
        else:
            visible = trim_stop(raw, call.role_hints.get("stop_sequence"))  # what the harness received
            self.echo[("text", parse_output(visible).text)] = raw

    def raw_for(self, call_ids: list[str], text: str) -> str | None:
        """The raw output that produced an assistant message with these call ids (or this text)."""
        if call_ids:
            raws = {self.echo.get(("call", i)) for i in call_ids}
            return raws.pop() if len(raws) == 1 and None not in raws else None
        return self.echo.get(("text", text.strip()))


class RecordsUnreadable(ApiError):
    """The records of one execution cannot be read (a directory in place of its log, no permission, a
    disk error): that execution's calls are answered 503; every other execution is served."""

    def __init__(self, execution_id: str, exc: OSError) -> None:
        super().__init__(503, "storage", f"the records of execution {execution_id!r} cannot be read: {exc}")
        self.execution_id = execution_id


class RecordsStalled(ApiError):
    """The records disk did not make a record durable within the write timeout: a 503 for its call."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(503, "storage", f"the records disk did not finish writing this call's record within "
                                         f"{timeout_s:g} s; the call is not acknowledged (retry it)")


class _Landing:
    """Where a record handed to the group commit stands: the writer thread releases ``synced`` once the
    record's batch is durable (``error``: why not). ``landed`` and ``future`` (made only for a caller
    that awaits the record through the loop instead of waiting on its thread) change under
    ``Recorder._landings``."""

    __slots__ = ("synced", "written", "landed", "error", "future")

    def __init__(self, lone: bool = False) -> None:
        self.synced = _thread.allocate_lock()  # a plain lock: the cheapest wait with a timeout
        self.synced.acquire()
        # a lone commit's: released once the record is written and only the journal's sync is left
        self.written = _thread.allocate_lock() if lone else None
        if self.written is not None:
            self.written.acquire()
        self.landed = False
        self.error: BaseException | None = None
        self.future: asyncio.Future | None = None


@dataclass
class PendingCommit:
    """A record handed to the writer by ``Recorder.begin``, holding its execution's commit turn."""

    state: ExecutionState
    call: ModelCall
    prompt_text: str
    landing: _Landing | None  # None: appended without a sync (``fsync`` off) ...
    appended: asyncio.Future | None  # ... by the appender thread, into this future


class Recorder:
    """Durable TITO records of every execution, plus their in-memory states."""

    def __init__(self, records_dir: str | os.PathLike, chat: ChatTokenizer, *, fsync: bool = True,
                 write_timeout_s: float = 10.0, disk: Disk = SYSTEM_DISK) -> None:
        self.write_timeout_s = write_timeout_s
        self.waited_here = 0  # lone commits waited for on the loop's thread (``commit_stats``)
        self.alone = 0  # commits made with no other model call in flight (each first waited for here)
        self.root = Path(records_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.chat = chat
        # no preallocated log tails: a log is synced only at the journal's checkpoints, not per batch
        self.store = ExecutionStore(self.root, fsync=fsync, preallocate=False, disk=disk)  # logs and journal
        self.fsync = fsync
        self.group = GroupCommit(self.store) if fsync else None
        # without ``fsync``, records are still written off the loop (a write can block on a stalled disk)
        self._appender = None if fsync else ThreadPoolExecutor(1, thread_name_prefix="gyre-append")
        self._states: dict[str, ExecutionState] = {}
        self._loading: dict[str, asyncio.Future] = {}  # first replays running off the loop (``state_async``)
        self._learning = threading.Lock()
        self._landings = threading.Lock()  # a landing's ``landed`` and ``future`` (``_Landing``)

    def state(self, execution_id: str) -> ExecutionState:
        """The state of ``execution_id``, replayed from its log on first use (``state_async``: off the loop)."""
        state = self._states.get(execution_id)
        if state is not None and state.unlearned:
            self._learn_queued(state)
        if state is None:
            state = self._states.setdefault(execution_id, self._replay(execution_id))
        return state

    async def state_async(self, execution_id: str, pool: Any) -> ExecutionState:
        """``state``, with a first replay run on ``pool`` (a long log must not stall every other call);
        callers that ask while it runs share it."""
        if execution_id in self._states or not self.store.path_for(execution_id).exists():
            return self.state(execution_id)
        loading = self._loading.get(execution_id)
        if loading is None:
            loading = asyncio.ensure_future(self._load(execution_id, pool))
            self._loading[execution_id] = loading
        await asyncio.shield(loading)
        return self.state(execution_id)

    async def _load(self, execution_id: str, pool: Any) -> None:
        try:
            replayed = await asyncio.get_running_loop().run_in_executor(pool, self._replay, execution_id)
            self._states.setdefault(execution_id, replayed)  # a state built meanwhile on the loop wins
        finally:
            self._loading.pop(execution_id, None)

    def _replay(self, execution_id: str) -> ExecutionState:
        """A new state of ``execution_id`` learned from its log (touches no shared state: any thread)."""
        state = ExecutionState(execution_id)
        if self.store.path_for(execution_id).exists():
            try:
                calls = self.store.read(execution_id)
            except OSError as exc:  # not cached: the next call reads again (the fault may be mended)
                raise RecordsUnreadable(execution_id, exc) from None
            for call in calls:
                state.learn(call, self.chat)
        return state

    def request_counts(self, execution_ids: list[str]) -> dict[str, int | str]:
        """Requests of each execution (an error message for one whose log cannot be read), without replaying
        the logs not loaded yet: their intact records are counted (any thread)."""
        counts: dict[str, int | str] = {}
        for execution_id in execution_ids:
            state = self._states.get(execution_id)
            if state is not None:
                counts[execution_id] = state.requests
                continue
            try:
                counts[execution_id] = self.store.count(execution_id)
            except OSError as exc:
                counts[execution_id] = RecordsUnreadable(execution_id, exc).message
        return counts

    async def commit(self, call: ModelCall, prompt_text: str, *, alone: bool = False) -> None:
        """Append ``call`` durably; its tree and caches follow (``_learn_soon``). ``alone``: no other
        model call is in flight, so a wait on this thread holds up no one (see the module invariants)."""
        await self.wait(await self.begin(call, prompt_text), alone=alone)

    async def begin(self, call: ModelCall, prompt_text: str, *, alone: bool = False) -> PendingCommit:
        """Take the execution's commit turn and hand ``call`` to the writer: its sync starts now, so the
        caller's own work overlaps it. ``wait`` (or, for a caller that goes away, ``abandon``) ends it.
        ``alone``: first wait (at most ``ALONE_WAIT_S``, on this thread) until the writer has written
        the record and only its sync is left, so that the caller's work runs during the sync."""
        state = self.state(call.execution_id)
        await state.lock.acquire()
        try:
            if self.group is None:  # one writer thread: records land in the order they were begun
                appended = asyncio.get_running_loop().run_in_executor(self._appender, self.store.append, call)
                return PendingCommit(state, call, prompt_text, None, appended)
            landing = _Landing(lone=alone)
            pending = PendingCommit(state, call, prompt_text, landing, None)
            self._submit(self.group, call, landing)
            if landing.written is not None:
                landing.written.acquire(True, ALONE_WAIT_S)
        except BaseException:
            state.lock.release()
            raise
        return pending

    async def wait(self, pending: PendingCommit, *, alone: bool = False) -> None:
        """Return once ``pending``'s record is durable (``RecordsStalled`` past ``write_timeout_s``)."""
        landing = pending.landing
        try:
            self.alone += alone and landing is not None
            if alone and landing is not None and landing.synced.acquire(True, ALONE_WAIT_S):
                if landing.error is not None:
                    raise landing.error
                self.waited_here += 1
                self._learn_soon(pending.state, pending.call, pending.prompt_text)
                return
            if landing is not None and landing.landed and landing.error is None:
                # durable already (the writer got there while the caller answered): what awaiting it
                # would end in, without a future, a shield and a timer (``landed`` is final once set)
                self._learn_soon(pending.state, pending.call, pending.prompt_text)
                return
            durable = pending.appended if landing is None else self._future(landing)
            assert durable is not None
            try:
                async with asyncio.timeout(self.write_timeout_s):
                    await asyncio.shield(durable)
            except (asyncio.CancelledError, TimeoutError) as exc:  # a record that lands later joins the tree
                self._learn_on_landing(pending, durable)
                if isinstance(exc, TimeoutError):
                    log.error("records of %s: not durable within %s s (stalled disk?)", pending.call.execution_id,
                              self.write_timeout_s)
                    raise RecordsStalled(self.write_timeout_s) from None
                raise
            self._learn_soon(pending.state, pending.call, pending.prompt_text)
        finally:
            pending.state.lock.release()

    def abandon(self, pending: PendingCommit) -> None:
        """The caller of ``begin`` will not ``wait``: the record, if it lands, joins the tree unacknowledged."""
        landing = pending.landing
        self._learn_on_landing(pending, pending.appended if landing is None else self._future(landing))
        pending.state.lock.release()

    def _learn_on_landing(self, pending: PendingCommit, durable: asyncio.Future | None) -> None:
        assert durable is not None
        durable.add_done_callback(
            lambda f: None if f.cancelled() or f.exception()
            else self._learn_soon(pending.state, pending.call, pending.prompt_text))

    def _learn_soon(self, state: ExecutionState, call: ModelCall, prompt_text: str) -> None:
        """Queue ``call`` for ``state.learn``: done on the loop's next turn, or at the next ``state()``
        of the execution if that comes first, so the caller's answer goes out before the caches'
        upkeep while no reader ever sees them without the call, and calls are learned in commit order."""
        state.unlearned.append((call, prompt_text))
        if len(state.unlearned) == 1:
            asyncio.get_running_loop().call_soon(self._learn_queued, state)

    def _learn_queued(self, state: ExecutionState) -> None:
        # a thread that is not the loop's may call ``state()`` (tests, an embedding program): the lock,
        # and a call leaving the queue only once learned, make it wait for a learn in progress
        with self._learning:
            while state.unlearned:
                call, prompt_text = state.unlearned[0]
                try:
                    state.learn(call, self.chat, prompt_text)
                finally:
                    state.unlearned.popleft()  # learned, or failed for good: never learned twice

    def _submit(self, group: GroupCommit, call: ModelCall, landing: _Landing) -> None:
        """Queue ``call`` for ``group`` (``self.group``: there with ``fsync``); ``landing`` follows its batch
        (``_Landing``). The loop is woken only when someone awaits the record through it (``_future``): a
        caller that waited on the loop's thread, or one the record reached first, needs no wake-up."""
        loop = asyncio.get_running_loop()

        def written() -> None:  # on the writer thread, before ``landed``
            if landing.written is not None and landing.written.locked():
                landing.written.release()

        def landed(error: BaseException | None) -> None:  # on the writer thread
            written()  # a record whose write failed is never written: its caller stops waiting
            landing.error = error
            with self._landings:
                landing.landed = True
                future = landing.future
            landing.synced.release()
            if future is not None and not loop.is_closed():
                loop.call_soon_threadsafe(_settle, future, error)

        group.submit(call, landed, written if landing.written is not None else None)

    def _future(self, landing: _Landing) -> asyncio.Future:
        """A future of this loop resolved once ``landing``'s batch is durable (or failed)."""
        future = asyncio.get_running_loop().create_future()
        with self._landings:
            landed = landing.landed
            if not landed:
                landing.future = future
        if landed:
            _settle(future, landing.error)
        return future

    def commit_stats(self) -> dict[str, int]:
        """Durable commits so far: records, the batches that held them, and the lone commits waited for on
        the event loop's thread (``alone``); all zero without ``fsync``."""
        group = self.group
        if group is None:
            return {"records": 0, "batches": 0, "here": 0, "alone": 0}
        return {"records": group.records, "batches": group.batches, "here": self.waited_here, "alone": self.alone}

    def executions(self) -> list[str]:
        return sorted(set(self.store.executions()) | set(self._states))

    def stats(self, execution_id: str) -> dict[str, Any]:
        state = self.state(execution_id)
        return tree_stats(state.tree).as_dict() if state.requests else {"execution_id": execution_id, "requests": 0}

    def close(self) -> None:
        if self._appender is not None:
            self._appender.shutdown(wait=True)
        if self.group is not None and not self.group.close(timeout_s=self.write_timeout_s):
            log.error("records: the disk did not finish a write within %s s; closing without a checkpoint "
                      "(the commit journal is replayed at the next start)", self.write_timeout_s)
            return
        self.store.close()


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyRegistry:
    """API key -> execution id. Keys added at run time persist in ``keys.json`` as
    SHA-256 digests (never the key itself), in a file only its owner can read (0600);
    any key can be revoked, configured ones included (the revocation persists).

    File shape: ``{"version": 2, "keys": {digest: execution_id}, "revoked": [digest]}``.
    A version-1 file (plain ``{key: execution_id}``) is converted on load; entries
    whose execution id breaks ``config.ID_RULE`` are dropped with a warning, so one
    bad entry never breaks the proxy for everyone. ``disk`` (``store.durable.Disk``)
    writes the file: a full one fails the change, which then changes nothing.
    """

    def __init__(self, path: str | os.PathLike, static: Mapping[str, str],
                 make_key: Callable[[], str] = lambda: "gyre-" + secrets.token_urlsafe(24),
                 disk: Disk = SYSTEM_DISK) -> None:
        self.path = Path(path)
        self.make_key = make_key
        self.disk = disk
        self._dynamic, self._revoked = self._load()
        self._static = {key_digest(k): e for k, e in static.items()}
        self._rebuild()

    def _load(self) -> tuple[dict[str, str], set[str]]:
        if not self.path.exists():
            return {}, set()
        try:
            data = json.loads(self.path.read_bytes())
        except (ValueError, RecursionError) as exc:  # truncated, empty, not JSON: named, never guessed at
            raise ProxyConfigError(f"{self.path}: damaged key file, not JSON ({exc}); restore it from a "
                                   f"backup or remove it (its run-time keys are then lost)") from None
        legacy = not isinstance(data, dict) or data.get("version") != 2
        entries = data if legacy else data.get("keys", {})
        revoked_list = [] if legacy else data.get("revoked", [])
        if not isinstance(entries, dict) or not isinstance(revoked_list, list) \
                or not all(isinstance(k, str) for k in entries) or not all(isinstance(d, str) for d in revoked_list):
            raise ProxyConfigError(f"{self.path}: damaged key file, expected "
                                   f'{{"version": 2, "keys": {{digest: execution_id}}, "revoked": [digest]}}')
        keys = {}
        for key, execution_id in entries.items():
            if not valid_id(execution_id):
                log.warning("keys.json: dropping a key of the invalid execution id %r", str(execution_id)[:140])
                continue
            keys[key_digest(key) if legacy else key] = execution_id
        revoked = set(revoked_list)
        if legacy or len(keys) != len(entries):
            self._save(keys, revoked)  # never leave plain keys (or bad ids) on disk
        return keys, revoked

    def _save(self, keys: dict[str, str], revoked: set[str]) -> None:
        """Replace the key file (an ``OSError`` leaves the old one, and no temporary file)."""
        tmp = self.path.with_suffix(".tmp")
        data = json.dumps({"version": 2, "keys": keys, "revoked": sorted(revoked)}, indent=1, sort_keys=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                blob = data.encode()
                if self.disk.pwrite(fd, blob, 0) != len(blob):
                    raise OSError(errno.ENOSPC, f"short write to {tmp}")
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _rebuild(self) -> None:
        merged = {**self._dynamic, **self._static}
        self._keys = {d: e for d, e in merged.items() if d not in self._revoked}
        self._seen: dict[str, str] = {}  # valid keys already looked up (no SHA-256 per call); rebuilt with _keys

    def execution_for(self, key: str | None) -> str | None:
        if not key:
            return None
        execution = self._seen.get(key)
        if execution is None:
            execution = self._keys.get(key_digest(key))
            if execution is not None and len(self._seen) < len(self._keys):  # only valid keys: bounded
                self._seen[key] = execution
        return execution

    def register(self, execution_id: str) -> str:
        """A new key for ``execution_id`` (an execution may hold several keys)."""
        return self.register_many([execution_id])[0]

    def register_many(self, execution_ids: list[str]) -> list[str]:
        """A new key for each of ``execution_ids``, in order, with one write of the key file."""
        for execution_id in execution_ids:
            check_id("execution_id", execution_id)
        keys = [self.make_key() for _ in execution_ids]
        dynamic = dict(self._dynamic)
        dynamic.update((key_digest(key), execution_id) for key, execution_id in zip(keys, execution_ids))
        self._save(dynamic, self._revoked)  # nothing changes in memory unless the file was written
        self._dynamic = dynamic
        self._rebuild()
        return keys

    def revoke(self, execution_id: str, key: str | None = None) -> int:
        """Revoke one key of ``execution_id`` (or all of them); returns how many were revoked."""
        digests = [d for d, e in self._keys.items() if e == execution_id]
        if key is not None:
            digests = [d for d in digests if d == key_digest(key)]
        dynamic = {d: e for d, e in self._dynamic.items() if d not in digests}
        revoked = self._revoked | {d for d in digests if d in self._static}
        self._save(dynamic, revoked)  # nothing changes in memory unless the file was written
        self._dynamic, self._revoked = dynamic, revoked
        self._rebuild()
        return len(digests)

    def executions(self) -> set[str]:
        return set(self._keys.values())
