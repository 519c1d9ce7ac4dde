"""The supervisor daemon: one per run folder and node, it owns processes that must outlive the driver.

``python -m gyre.real.supervisor FOLDER --grace-s G`` (started by
``supervisor.client.start_or_reuse``, in its own session and with no
parent-death signal, so a ``kill -9`` of ``gyre run`` leaves it running)
serves a line-per-request JSON protocol on 127.0.0.1 (a random port, a
random token: both in ``FOLDER/supervisor.json``, owner-only, written once
it listens). Requests (``{"token", "op", ...}``), one answer line each:

| op      | fields                         | answer                                                   |
|---------|--------------------------------|----------------------------------------------------------|
| renew   |                                | the lease is renewed                                     |
| spawn   | key, argv, env, cwd, log, again? | the key's entry, and whether it started now (below)    |
| status  | key                            | the key's entry, or null                                 |
| list    |                                | every entry                                              |
| wait    | key, timeout_s                 | the entry once it is no longer running, or at timeout    |
| kill    | key, grace_s                   | the entry once its process group is gone (TERM, then KILL) |
| signal  | key, pid, sig                  | whether running ``pid`` of key got ``sig`` on its group (then: killed) |
| stop    |                                | every process group stopped, then the daemon exits       |

``spawn`` starts a key unknown, lost or killed (with ``again``: any key not
running, a service such as the proxy restarted after a crash); a key running
or ended by itself is answered as it is (a resumed driver attaches to it). Each spawned
process runs in its own session (its process group id is its pid) with a
parent-death signal tied to the daemon, so a killed daemon takes its
processes with it (a lost supervisor's executions are re-run, never left
running unseen). Every start and exit is in the ledger (``supervisor.ledger``)
before it is answered.

Lease: a driver renews it every few seconds (``client.LeaseRenewer``); when no
renewal came for ``lease_s + grace_s`` (``LEASE_S`` unless ``--lease-s``) the daemon stops everything it owns
and exits, so nothing outlives a driver that never comes back by more than
that. One daemon per folder: it holds ``FOLDER/supervisor.lock`` (``flock``,
released by any death) for its life; a second one exits at once. A new
daemon marks ``lost`` every key its dead predecessor left running.

Invariants: a key has at most one live process; every process the daemon
started is stopped before it exits (stop, lease expiry, SIGTERM); the
ledger's last word on a key is the truth about its process.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gyre.real.runtime.lifetime import die_with_parent
from gyre.real.supervisor.ledger import LEDGER_NAME, LOST, RUNNING, Entry, Ledger, LedgerError

LEASE_S = 10.0          # a lease lasts this long after a renewal; the grace comes on top
STATE_NAME = "supervisor.json"
LOCK_NAME = "supervisor.lock"
LOG_NAME = "supervisor.log"
KILL_GRACE_S = 5.0
REQUEST_LIMIT = 1 << 22  # one request line (a spawn carries the harness's environment); longer: refused


class Supervisor:
    def __init__(self, folder: Path, grace_s: float, lease_s: float = LEASE_S) -> None:
        self.folder, self.grace_s, self.lease_s = Path(folder), grace_s, lease_s
        self.ledger = Ledger(self.folder / LEDGER_NAME)
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.ended: dict[str, asyncio.Event] = {}
        self.killing: set[str] = set()  # keys a driver's kill is ending
        self.renewed = time.monotonic()
        self.token = secrets.token_hex(16)
        self.done = asyncio.Event()

    def mark_lost(self) -> None:
        """Keys a dead predecessor left running: nobody can wait for them now."""
        for key, entry in list(self.ledger.entries.items()):
            if entry.state == RUNNING:
                self.ledger.append({"kind": "lost", "key": key,
                                    "reason": f"its supervisor is gone (pid {entry.pid} started under it)"})

    # ---- serving -------------------------------------------------------------------------
    async def serve(self) -> None:
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0, limit=REQUEST_LIMIT)
        port = server.sockets[0].getsockname()[1]
        _write_private(self.folder / STATE_NAME, {"pid": os.getpid(), "port": port, "token": self.token,
                                                  "grace_s": self.grace_s, "lease_s": self.lease_s})
        print(f"supervisor {os.getpid()} listening on 127.0.0.1:{port}", flush=True)
        watch = asyncio.ensure_future(self._watch_lease())
        async with server:
            await self.done.wait()
        watch.cancel()
        (self.folder / STATE_NAME).unlink(missing_ok=True)

    async def _watch_lease(self) -> None:
        while not self.done.is_set():
            idle = time.monotonic() - self.renewed
            if idle > self.lease_s + self.grace_s:
                print(f"supervisor: lease not renewed for {idle:.1f} s (lease {self.lease_s} s + grace "
                      f"{self.grace_s} s): stopping {len(self.procs)} processes", flush=True)
                await self.stop_all()
                return
            await asyncio.sleep(0.2)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await reader.readline()
                request = json.loads(line)
                if not isinstance(request, dict) or request.get("token") != self.token:
                    raise PermissionError("bad or missing token")
                answer: Any = {"ok": True, "result": await self._dispatch(request)}
            except (ValueError, KeyError, TypeError, PermissionError, OSError, LedgerError) as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            writer.write((json.dumps(answer) + "\n").encode())
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _dispatch(self, request: dict[str, Any]) -> Any:
        op = request.get("op")
        if op == "renew":
            self.renewed = time.monotonic()
            return {"lease_s": self.lease_s, "grace_s": self.grace_s}
        if op == "spawn":
            entry, started = await self.spawn(request)
            return {"entry": entry.as_dict(), "started": started}
        if op == "status":
            entry = self.ledger.entries.get(str(request["key"]))
            return entry.as_dict() if entry else None
        if op == "list":
            return {key: e.as_dict() for key, e in self.ledger.entries.items()}
        if op == "wait":
            return (await self.wait(str(request["key"]), float(request.get("timeout_s", 60.0)))).as_dict()
        if op == "kill":
            return (await self.kill(str(request["key"]), float(request.get("grace_s", KILL_GRACE_S)))).as_dict()
        if op == "signal":
            return self.signal(str(request["key"]), int(request["pid"]), int(request["sig"]))
        if op == "stop":
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self.stop_all()))
            return {"stopping": sorted(self.procs)}
        raise ValueError(f"unknown op {op!r}")

    # ---- processes -------------------------------------------------------------------------
    async def spawn(self, request: dict[str, Any]) -> tuple[Entry, bool]:
        """Start the request's process unless its key runs or ended (then: its entry, False: an attach)."""
        key = str(request["key"])
        known = self.ledger.entries.get(key)
        again = bool(request.get("again", False)) and known is not None and known.state != RUNNING
        if known is not None and known.state != LOST and not known.killed and not again:
            return known, False  # idempotent: a resumed driver asking again attaches to the same process
        argv, env, cwd = [str(a) for a in request["argv"]], dict(request["env"]), str(request["cwd"])
        with open(request["log"], "ab") as log:
            proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                        start_new_session=True, preexec_fn=die_with_parent)
        entry = self.ledger.append({"kind": "started", "key": key, "pid": proc.pid, "started_unix_s": time.time(),
                                    "started_mono_s": time.monotonic(), "supervisor": os.getpid()})
        self.procs[key] = proc
        self.ended[key] = asyncio.Event()
        asyncio.ensure_future(self._reap(key, proc))
        return entry, True

    async def _reap(self, key: str, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.ledger.append({"kind": "ended", "key": key, "exit_code": code, "ended_unix_s": time.time(),
                            "ended_mono_s": time.monotonic(), "killed": key in self.killing})
        self.killing.discard(key)
        self.procs.pop(key, None)
        self.ended[key].set()

    async def wait(self, key: str, timeout_s: float) -> Entry:
        if key not in self.ledger.entries:
            raise KeyError(f"no process {key!r} in this supervisor's ledger")
        event = self.ended.get(key)
        if event is not None:
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except TimeoutError:
                pass
        return self.ledger.entries[key]

    async def kill(self, key: str, grace_s: float) -> Entry:
        proc = self.procs.get(key)
        if proc is not None:
            self.killing.add(key)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                if await self._ended_within(key, grace_s):
                    break
        return await self.wait(key, grace_s)

    def signal(self, key: str, pid: int, sig: int) -> bool:
        """Send ``sig`` to the key's process group if ``pid`` runs under it (a driver stopping it step by step,
        as the engine manager does); its exit is then recorded as killed."""
        proc = self.procs.get(key)
        if proc is None or proc.pid != pid:
            return False
        self.killing.add(key)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    async def _ended_within(self, key: str, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.ended[key].wait(), seconds)
            return True
        except TimeoutError:
            return False

    async def stop_all(self) -> None:
        """Stop every process group it owns (TERM, then KILL), then let ``serve`` return."""
        await asyncio.gather(*(self.kill(key, KILL_GRACE_S) for key in list(self.procs)))
        self.done.set()


def _write_private(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def hold_lock(folder: Path) -> int | None:
    """The folder's supervisor lock for this process's life; None when a live supervisor holds it."""
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


async def _main(folder: Path, grace_s: float, lease_s: float) -> int:
    supervisor = Supervisor(folder, grace_s, lease_s)
    supervisor.mark_lost()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # stop what it owns, as `stop` does
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(supervisor.stop_all()))
    await supervisor.serve()
    supervisor.ledger.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.real.supervisor")
    parser.add_argument("folder", help="the run's supervisor folder (RUN_DIR/supervisor)")
    parser.add_argument("--grace-s", type=float, required=True, help="seconds past an expired lease before it stops")
    parser.add_argument("--lease-s", type=float, default=LEASE_S, help="how long one renewal holds the lease")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(folder)
    if lock is None:
        print(f"supervisor: {folder} already has a live supervisor ({folder / LOCK_NAME} is held)", file=sys.stderr)
        return 3
    return asyncio.run(_main(folder, args.grace_s, args.lease_s))
