"""The driver's side of the supervisor: find or start it, renew its lease, spawn, attach, kill, stop.

``start_or_reuse(folder, grace_s)`` returns a ``SupervisorClient`` to the
folder's live supervisor, or starts one (``python -m gyre.real.supervisor``,
its own session, no parent-death signal: it outlives the driver by design)
and waits for it to listen. ``LeaseRenewer`` renews the lease from a thread of
its own (the driver's event loop can be busy for seconds). ``stop_run(RUN_DIR)``
is ``gyre stop``: it stops the run's driver (SIGTERM: the same ordered stop
as Ctrl-C) and its supervisor, with everything the supervisor owns.

Every call opens one connection to 127.0.0.1 and sends one JSON line with
the token of ``supervisor.json``; a supervisor that does not answer raises
``SupervisorGone`` (its processes died with it: their executions are re-run).

Invariants: a client never starts a second supervisor for a folder whose
supervisor answers; ``spawn`` with a key the supervisor runs returns that
process (same pid) and starts nothing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.real.runtime.lifetime import die_with_parent
from gyre.real.supervisor.daemon import LEASE_S, LOG_NAME, REQUEST_LIMIT, STATE_NAME
from gyre.real.supervisor.ledger import Entry

SUPERVISOR_DIR = "supervisor"  # under the run folder
CALL_TIMEOUT_S = 30.0


class SupervisorGone(RuntimeError):
    """The supervisor does not answer (killed, or its node rebooted); the message names the folder."""


@dataclass(frozen=True)
class SupervisorClient:
    folder: Path
    pid: int
    port: int
    token: str

    @classmethod
    def find(cls, folder: str | os.PathLike) -> SupervisorClient | None:
        """The client of ``folder``'s supervisor if one is alive and answers; else None."""
        folder = Path(folder)
        try:
            state = json.loads((folder / STATE_NAME).read_text())
            client = cls(folder, int(state["pid"]), int(state["port"]), str(state["token"]))
            client.call("list", timeout=5.0)
        except (OSError, ValueError, KeyError, SupervisorGone):
            return None
        return client

    # ---- calls -----------------------------------------------------------------------------
    def _request(self, op: str, fields: dict[str, Any]) -> bytes:
        return (json.dumps({"token": self.token, "op": op, **fields}) + "\n").encode()

    def _answer(self, op: str, line: bytes) -> Any:
        if not line:
            raise SupervisorGone(f"the supervisor of {self.folder} (pid {self.pid}) closed the connection on {op}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(f"supervisor of {self.folder}: {op}: {answer['error']}")
        return answer["result"]

    def call(self, op: str, timeout: float = CALL_TIMEOUT_S, **fields: Any) -> Any:
        """One request, blocking (for threads and start-up); SupervisorGone if it does not answer."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
                sock.sendall(self._request(op, fields))
                line = sock.makefile("rb").readline()
        except OSError as exc:
            raise SupervisorGone(f"the supervisor of {self.folder} (pid {self.pid}) does not answer: {exc}") from None
        return self._answer(op, line)

    async def acall(self, op: str, timeout: float = CALL_TIMEOUT_S, **fields: Any) -> Any:
        """One request on the event loop; SupervisorGone if it does not answer within ``timeout``."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port,
                                                                            limit=REQUEST_LIMIT), timeout)
            try:
                writer.write(self._request(op, fields))
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), timeout)
            finally:
                writer.close()
        except (TimeoutError, OSError) as exc:
            raise SupervisorGone(f"the supervisor of {self.folder} (pid {self.pid}) does not answer: {exc}") from None
        return self._answer(op, line)

    # ---- what the driver asks --------------------------------------------------------------
    async def spawn(self, key: str, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> tuple[Entry, bool]:
        """Start ``argv`` under ``key`` (True), or the entry of the key's process running or ended (False)."""
        answer = await self.acall("spawn", key=key, argv=argv, env=env, cwd=str(cwd), log=str(log))
        return Entry(**answer["entry"]), bool(answer["started"])

    async def status(self, key: str) -> Entry | None:
        """The key's entry (None: never started under this supervisor's ledger)."""
        answer = await self.acall("status", key=key)
        return None if answer is None else Entry(**answer)

    async def wait(self, key: str, poll_s: float = 20.0) -> Entry:
        """The key's entry once its process is no longer running."""
        while True:
            entry = Entry(**await self.acall("wait", timeout=poll_s + CALL_TIMEOUT_S, key=key, timeout_s=poll_s))
            if entry.state != "running":
                return entry

    async def kill(self, key: str, grace_s: float) -> Entry:
        return Entry(**await self.acall("kill", timeout=2 * grace_s + CALL_TIMEOUT_S, key=key, grace_s=grace_s))

    def entries(self) -> dict[str, Entry]:
        return {key: Entry(**e) for key, e in self.call("list").items()}

    def renew(self) -> None:
        self.call("renew", timeout=5.0)

    def stop(self, timeout: float = 30.0) -> bool:
        """Ask it to stop what it owns and exit; True once its process is gone."""
        try:
            self.call("stop")
        except SupervisorGone:
            return True
        return _gone_within(self.pid, timeout)


def _gone_within(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child: reap it
                return True
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def start_or_reuse(folder: str | os.PathLike, grace_s: float, timeout: float = 30.0, lease_s: float = LEASE_S,
                   parent_death_signal: int | None = None) -> tuple[SupervisorClient, bool]:
    """The folder's live supervisor (reused: True) or a new one (False); RuntimeError names why it did not start.
    A new one outlives this process, unless ``parent_death_signal`` ties it to the calling thread (a Ray
    node supervisor's host actor: ``cluster.node_supervisor``)."""
    folder = Path(folder)
    found = SupervisorClient.find(folder)
    if found is not None:
        return found, True
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STATE_NAME).unlink(missing_ok=True)
    with open(folder / LOG_NAME, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gyre.real.supervisor", str(folder), "--grace-s", str(grace_s),
                                 "--lease-s", str(lease_s)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=folder,
                                preexec_fn=None if parent_death_signal is None
                                else functools.partial(die_with_parent, parent_death_signal))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = SupervisorClient.find(folder)
        if found is not None and found.pid == proc.pid:
            return found, False
        if proc.poll() is not None:
            tail = (folder / LOG_NAME).read_text()[-2000:]
            raise RuntimeError(f"the supervisor of {folder} exited ({proc.returncode}) as it started: {tail}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the supervisor of {folder} did not listen within {timeout} s")


class LeaseRenewer:
    """Renews a supervisor's lease from its own thread every ``LEASE_S / 4`` seconds until ``stop``."""

    def __init__(self, client: SupervisorClient, every_s: float = LEASE_S / 4) -> None:
        self.client, self.every_s = client, every_s
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor-lease", daemon=True)

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.client.renew()
            except (SupervisorGone, RuntimeError) as exc:
                self.failures.append(str(exc))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def stop_run(run_dir: str | os.PathLike, timeout: float = 60.0) -> list[str]:
    """``gyre stop RUN_DIR``: SIGTERM to the driver holding the folder (if any), then stop its supervisor and
    everything it owns, and on a Ray cluster every node's supervisor; one line per thing done."""
    from gyre.real.runtime.resume import LOCK_FILE, ResumeError, refuse_if_held

    work, done = Path(run_dir), []
    if not work.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    try:
        refuse_if_held(work)
    except ResumeError:
        text = (work / LOCK_FILE).read_text().strip()
        if text.isdigit():
            os.kill(int(text), signal.SIGTERM)
            done.append(f"driver {text}: SIGTERM (it stops its engines, cells, proxy and harnesses in order)")
    client = SupervisorClient.find(work / SUPERVISOR_DIR)
    if client is not None:
        gone = client.stop(timeout)
        done.append(f"supervisor {client.pid}: {'stopped with everything it owned' if gone else 'still stopping'}")
    from gyre.real.cluster.node_supervisor import stop_on_cluster  # a Ray run's node supervisors (none: [])

    done.extend(stop_on_cluster(work, timeout))
    if not done:
        done.append(f"{run_dir}: no live driver or supervisor")
    return done


def executions_view(folder: str | os.PathLike) -> tuple[dict[int, Entry], int | None]:
    """Each execution (key ``x{n}``) the folder's supervisor ledger holds, as it stands now, and the live
    supervisor's pid (None: none answers). With no live supervisor, a running entry is read as lost:
    its process died with its supervisor (parent-death signal)."""
    from gyre.real.supervisor.daemon import LEDGER_NAME
    from gyre.real.supervisor.ledger import LOST, RUNNING, read_ledger

    folder = Path(folder)
    live = SupervisorClient.find(folder)
    view = {}
    for key, entry in read_ledger(folder / LEDGER_NAME).items():
        if not (key.startswith("x") and key[1:].isdigit()):
            continue
        if entry.state == RUNNING and live is None:
            entry = Entry(**{**entry.as_dict(), "state": LOST,
                             "reason": f"its supervisor is gone (no supervisor answers for {folder})"})
        view[int(key[1:])] = entry
    return view, (live.pid if live is not None else None)
