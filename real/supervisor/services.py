"""The run's long-lived services under the supervisor: the proxy and the harnesses' sandbox bridge.

A harness the supervisor keeps alive across a driver crash still needs the
model: its calls go to the proxy, and a sandboxed harness reaches the proxy
only through the host side of its bridge (``harness.sandbox.HostBridge``).
Both therefore run under the supervisor too, as keys ``proxy`` and
``bridge``, and a resumed driver adopts them instead of starting new ones:

- ``SupervisedProxy`` is ``runtime.proxy_process.ProxyProcess`` with the
  process started, watched, restarted and stopped through the supervisor
  (same configuration file, port and restart record); ``adopt()`` takes a
  proxy the supervisor still runs; a start that hangs is stopped after its
  stacks are written to its log, and tried once more;
- ``bridge_service(client, base_url)`` starts (or finds) ``python -m
  gyre.real.supervisor.bridge`` listening on a socket in a short fixed
  folder named after the run's folder, and returns its address.

The engines run under the supervisor too (``supervisor.engines``); a resumed
run adopts those still running and starts the dead ones again on the ports
the proxy knows (``proxy_engine_ports``), and meanwhile the proxy holds the
harnesses' calls (``RetryPolicy.hold_s``) until an engine answers under its id.

Invariants: at most one proxy and one bridge per supervisor (keys); a service
is started only when the supervisor does not run it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gyre.real.runtime.proxy_process import ProxyProcess, ProxyStartError
from gyre.real.supervisor.client import SupervisorClient, SupervisorGone

PROXY_KEY, BRIDGE_KEY = "proxy", "bridge"
START_TRIES = 2    # a proxy start that hangs (neither listens nor ends) is tried once more
DUMP_WAIT_S = 5.0  # how long a hung proxy is given to write its stacks
STACK_LINES = 40   # lines of the proxy's log quoted when it did not start (a stack dump's worth)


def _listening_after(log: Path, offset: int, needle: str, timeout: float, client: SupervisorClient, key: str) -> bool:
    """Whether ``needle`` appears in ``log`` past ``offset`` within ``timeout`` (False at once if it ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.is_file():
            with open(log, "rb") as f:
                f.seek(offset)
                if needle.encode() in f.read():
                    return True
        entry = client.call("status", key=key)
        if entry is not None and entry["state"] != "running":
            return False
        time.sleep(0.05)
    return False


def running(client: SupervisorClient, key: str) -> dict[str, Any] | None:
    """The key's entry if the supervisor runs it now."""
    entry = client.call("status", key=key)
    return entry if entry is not None and entry["state"] == "running" else None


class SupervisedProxy(ProxyProcess):
    """``ProxyProcess`` whose process the supervisor owns: it survives the driver (module docstring)."""

    def __init__(self, config: Any, folder: str | Path, client: SupervisorClient, **kwargs: Any) -> None:
        super().__init__(config, folder, **kwargs)
        self.client = client
        self._pid: int | None = None
        self.adopted = False

    @property
    def pid(self) -> int | None:
        return self._pid

    def adopt(self) -> SupervisedProxy:
        """Take the proxy the supervisor still runs (a resumed run; same configuration and port)."""
        entry = running(self.client, PROXY_KEY)
        if entry is None:
            raise ProxyStartError(f"the supervisor of {self.client.folder} runs no proxy to adopt")
        self._pid, self.adopted = int(entry["pid"]), True
        return self

    def _argv(self, path: Path) -> list[str]:
        return [sys.executable, "-m", "gyre.real.proxy.cli", "--config", str(path)]

    def _launch(self, path: Path) -> None:
        """Start the proxy under the supervisor and wait until it listens. A try that neither listens
        nor ends within ``start_timeout_s`` has its threads' stacks written to its log (it runs with
        ``PYTHONFAULTHANDLER``; SIGABRT), is stopped and made again, up to ``START_TRIES`` tries; the
        error then quotes the log, those stacks included."""
        log = self.folder / "proxy.log"
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        for attempt in range(1, START_TRIES + 1):
            offset = log.stat().st_size if log.is_file() else 0
            answer = self.client.call("spawn", key=PROXY_KEY, argv=self._argv(path), env=env, cwd=str(self.folder),
                                      log=str(log), again=True)
            self._pid = int(answer["entry"]["pid"])
            if _listening_after(log, offset, '"listening"', self.start_timeout_s, self.client, PROXY_KEY):
                (self.folder / "proxy.pid").write_text(f"{self._pid}\n")
                return
            hung = self._dump_stacks()
            self._kill()
            if not hung or attempt == START_TRIES:  # an exit is the proxy's answer: trying again changes nothing
                raise ProxyStartError(f"the proxy did not start under the supervisor ({attempt} "
                                      f"{'try' if attempt == 1 else 'tries'}): {self.log_tail(STACK_LINES)}")
            self.progress(f"the proxy did not listen within {self.start_timeout_s:.0f} s (its stacks are in {log}); "
                          f"starting it again")

    def _dump_stacks(self) -> bool:
        """Whether the proxy still runs (hung); if so it is sent SIGABRT, which its fault handler answers
        with every thread's stack in its log before it ends (waited for up to ``DUMP_WAIT_S``)."""
        if running(self.client, PROXY_KEY) is None or self._pid is None:
            return False
        self.client.call("signal", key=PROXY_KEY, pid=self._pid, sig=int(signal.SIGABRT))
        deadline = time.monotonic() + DUMP_WAIT_S
        while running(self.client, PROXY_KEY) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return True

    def exited(self) -> int | None:
        if self._stopped or self._pid is None:
            return None
        try:
            entry = self.client.call("status", key=PROXY_KEY)
        except SupervisorGone:  # the proxy died with it: nothing to restart here, the run stops (SupervisorLost)
            return None
        if entry is None or entry["state"] == "running":
            return None
        return entry["exit_code"] if entry["exit_code"] is not None else -9

    def stop(self) -> None:
        self._stopped = True
        self._kill()

    def _kill(self) -> None:
        try:
            self.client.call("kill", key=PROXY_KEY, grace_s=15.0, timeout=60.0)
        except Exception:  # noqa: BLE001 - the supervisor (and its proxy) already gone
            pass


def proxy_engine_ports(proxy_folder: Path) -> dict[str, int]:
    """Each engine's port in the proxy's configuration file (a resumed run starts its engines there)."""
    data = json.loads((proxy_folder / "proxy.json").read_text())
    return {str(e["id"]): int(urlsplit(e["url"]).port) for e in data["engines"]}


@dataclass(frozen=True)
class BridgeAddress:
    """What ``harness.sandbox.sandbox_argv`` needs of a bridge: its socket and the proxy's port."""

    path: Path
    port: int


def bridge_folder(run_folder: Path) -> Path:
    """A short fixed folder for the bridge's socket (a socket path must fit 108 bytes)."""
    digest = hashlib.sha256(str(Path(run_folder).resolve()).encode()).hexdigest()[:12]
    return Path("/tmp") / f"gyre-bridge-{digest}"


def bridge_service(client: SupervisorClient, base_url: str, timeout: float = 30.0) -> BridgeAddress:
    """The supervised bridge to the proxy at ``base_url``: started unless the supervisor runs it."""
    folder = bridge_folder(client.folder.parent)
    port = urlsplit(base_url).port or 80
    if running(client, BRIDGE_KEY) is None:
        log = client.folder / "bridge.log"
        offset = log.stat().st_size if log.is_file() else 0
        client.call("spawn", key=BRIDGE_KEY, argv=[sys.executable, "-m", "gyre.real.supervisor.bridge", base_url,
                                                   str(folder)],
                    env=dict(os.environ), cwd=str(client.folder), log=str(log), again=True)
        if not _listening_after(log, offset, "bridge listening", timeout, client, BRIDGE_KEY):
            raise RuntimeError(f"the sandbox bridge did not start under the supervisor: {log}")
    return BridgeAddress(folder / "proxy.sock", port)
