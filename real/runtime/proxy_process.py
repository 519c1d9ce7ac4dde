"""The job's proxy as its own supervised process: started, watched, restarted on the same port.

``ProxyProcess(config, folder)`` writes the proxy's configuration to
``folder/proxy.json`` (owner-only: it holds the admin token) and runs
``python -m gyre.real.proxy.cli`` on it, in its own session (its process
group id, the pid, in ``folder/proxy.pid``), tied to this process by a
parent-death signal (``runtime.lifetime``), its output in ``folder/proxy.log``.
``start`` returns once the proxy prints its listening line. The port is fixed
in the configuration (chosen once by the job), so ``url`` never changes:
harnesses, their sandbox bridges and the backend keep talking to the same
address across restarts.

``supervise(on_restart)`` (a task for the job's event loop) has a thread of its
own check the process every ``poll_s``; when it has exited without ``stop``,
the thread logs the exit and starts a new process on the same configuration
and port (never on the event loop, which the backend's admin calls block while
they wait out the restart), then ``on_restart()`` runs on the loop so the backend can put back what the proxy held
only in memory (engine drains, execution routes, the policy version:
``RealBackend.reapply_proxy_state``). Keys (``keys.json``, hashed) and
records live in the record folder and are read back by the new process; a
call in flight at the crash is cut (its harness retries it: agent CLIs retry
connection errors) and, never completed, was never recorded. Each restart is
kept in ``restarts`` (exit code, when, seconds to come back); one that cannot
come back within ``start_timeout_s`` is raised from ``supervise``.

Invariants: at most one proxy process per ``ProxyProcess`` at a time; ``url``
is constant; ``stop`` ends the process (SIGTERM, then SIGKILL) and no restart
follows it, nor one after ``detach`` (stop watching, leave it running); every
restart is recorded before ``on_restart`` runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gyre.real.runtime.lifetime import die_with_parent


class ProxyStartError(RuntimeError):
    """The proxy process did not come up; the message has its exit code and log tail."""


def config_mapping(config: Any) -> dict[str, Any]:
    """A ``ProxyConfig`` as the JSON mapping ``proxy.config.config_from_mapping`` reads back."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


class ProxyProcess:
    def __init__(self, config: Any, folder: str | Path, *, poll_s: float = 0.5, start_timeout_s: float = 60.0,
                 progress: Callable[[str], None] | None = None) -> None:
        if not config.port:
            raise ValueError("the job's proxy needs a fixed port (it must come back on the same address)")
        self.config, self.folder = config, Path(folder)
        self.url = f"http://{config.host}:{config.port}"
        self.poll_s, self.start_timeout_s = poll_s, start_timeout_s
        self.progress = progress or (lambda line: None)
        self.restarts: list[dict[str, Any]] = []
        self._proc: subprocess.Popen | None = None
        self._stopped = False
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> ProxyProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "proxy.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(config_mapping(self.config), fh)
        self._launch(path)
        return self

    def _launch(self, path: Path) -> None:
        with self._lock:
            log = open(self.folder / "proxy.log", "ab")
            env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
            self._proc = subprocess.Popen([sys.executable, "-m", "gyre.real.proxy.cli", "--config", str(path)],
                                          stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                                          start_new_session=True,
                                          preexec_fn=die_with_parent)
            log.close()
        line = _read_line(self._proc, self.start_timeout_s)
        if not line or '"listening"' not in line:
            code = self._proc.poll()
            self._kill()
            raise ProxyStartError(f"the proxy did not start (exit {code}): {self.log_tail()}")
        threading.Thread(target=_drain, args=(self._proc.stdout,), daemon=True).start()
        (self.folder / "proxy.pid").write_text(f"{self._proc.pid}\n")  # its process group, for operators and tests

    def log_tail(self, lines: int = 8) -> str:
        path = self.folder / "proxy.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def exited(self) -> int | None:
        """The exit code of a proxy that ended without ``stop`` (None: running, or stopped on purpose)."""
        proc = self._proc
        return None if self._stopped or proc is None else proc.poll()

    async def supervise(self, on_restart: Callable[[], None] = lambda: None) -> None:
        """Restart the proxy whenever it exits on its own, until ``stop``.

        The watching and relaunching happen on a thread of their own, never on the event loop: the
        backend's admin calls block the loop while they wait out a restart, so a restart driven from the
        loop would never come. ``on_restart`` runs on the loop once the proxy is back."""
        loop = asyncio.get_running_loop()
        failed: list[BaseException] = []

        def back() -> None:
            try:
                loop.call_soon_threadsafe(on_restart)
            except RuntimeError:  # the run's loop is gone: nothing to put back
                pass

        if self._watcher is None:  # lives until ``stop`` (the relaunched proxy's parent-death signal is tied to it)
            self._watcher = threading.Thread(target=self._watch, args=(back, failed), daemon=True,
                                             name="gyre-proxy-watch")
            self._watcher.start()
        while self._watcher.is_alive() and not failed:
            await asyncio.sleep(self.poll_s)
        if failed:
            raise failed[0]

    def _watch(self, back: Callable[[], None], failed: list[BaseException]) -> None:
        while not self._stopped:
            time.sleep(self.poll_s)
            code = self.exited()
            if code is None or self._stopped:  # stopped or detached while asked: an ordered stop, no crash
                continue
            died = time.monotonic()
            self.progress(f"proxy exited ({_describe(code)}); restarting it on {self.url}")
            try:
                self._launch(self.folder / "proxy.json")
            except BaseException as exc:  # noqa: BLE001 - handed to ``supervise``
                failed.append(exc)
                return
            self.restarts.append({"exit_code": code, "at_s": died - self._t0, "back_s": time.monotonic() - died})
            self.progress(f"proxy back after {time.monotonic() - died:.1f} s")
            back()

    def detach(self) -> None:
        """Stop watching it and leave it running: whatever ends it next (a supervisor's stop, a resume's
        adoption) is not a crash to restart."""
        self._stopped = True

    def stop(self) -> None:
        self._stopped = True
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            self._kill()

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The process's first stdout line, or "" if it exits or stays silent for ``timeout`` seconds."""
    stdout = proc.stdout
    if stdout is None:
        raise ValueError("the proxy process was started without stdout=PIPE: its listening line cannot be read")
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


def _drain(stream) -> None:
    for _ in stream:  # keep the pipe from filling; the proxy prints only its listening line
        pass


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
