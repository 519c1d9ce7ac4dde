"""The supervisor daemon with real processes: it outlives its driver, re-attaches, and never orphans.

Each test starts a real ``python -m gyre.real.supervisor`` (``client.start_or_reuse``;
a short lease where the test waits for it) and real child processes:
- a key spawned twice is one process (same pid, started once); a key that ended by
  itself is answered with its true exit code and not started again; a killed one is;
- a stand-in driver that started the supervisor and a process under it is killed
  with SIGKILL: both live on (only the supervisor and what it owns remain) and a
  new client re-attaches to the same pid; once the lease has been expired for its
  grace, the process and the supervisor are gone;
- a SIGKILLed supervisor takes its processes with it; the next one marks them
  lost, and ``executions_view`` reads them as lost with the reason;
- ``gyre stop RUN_DIR`` sends SIGTERM to the driver holding the folder and stops the supervisor and
  what it owns;
- a second daemon on the same folder refuses to start; a request without the
  token is refused and starts nothing; a malformed or oversized line gets an error answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from gyre.cli import main
from gyre.real.supervisor.client import SupervisorClient, executions_view, start_or_reuse
from gyre.real.supervisor.daemon import REQUEST_LIMIT
from gyre.real.supervisor.ledger import read_ledger

try:
    from processes import alive, wait_until
except ImportError:
    from ..processes import alive, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def spawn(client: SupervisorClient, key: str, argv: list[str], tmp_path):
    return asyncio.run(client.spawn(key, argv, dict(os.environ), tmp_path, tmp_path / f"{key}.log"))


@pytest.fixture
def supervisors():
    """Every supervisor a test started; each is stopped (SIGKILL if need be) afterwards."""
    started: list[SupervisorClient] = []
    yield started
    for client in started:
        if alive(client.pid):
            os.kill(client.pid, signal.SIGKILL)


def test_spawn_is_idempotent_and_an_ended_key_keeps_its_true_end(tmp_path, supervisors):
    client, reused = start_or_reuse(tmp_path / "sup", grace_s=60)
    supervisors.append(client)
    assert not reused
    first, started = spawn(client, "x1", SLEEPER, tmp_path)
    again, started_again = spawn(client, "x1", ["false"], tmp_path)
    assert started and not started_again and again.pid == first.pid and alive(first.pid)
    assert os.getpgid(first.pid) == first.pid  # its own process group
    quick, _ = spawn(client, "x2", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path)
    ended = asyncio.run(client.wait("x2"))
    assert (ended.state, ended.exit_code, ended.killed) == ("ended", 3, False)
    assert ended.started_mono_s <= ended.ended_mono_s <= time.monotonic()
    attached, restarted = spawn(client, "x2", SLEEPER, tmp_path)
    assert not restarted and attached == ended  # its end is the truth: nothing runs it again
    killed = asyncio.run(client.kill("x1", 2.0))
    assert (killed.state, killed.exit_code, killed.killed) == ("ended", -signal.SIGTERM, True)
    assert not alive(first.pid)
    rerun, started = spawn(client, "x1", SLEEPER, tmp_path)
    assert started and rerun.pid != first.pid and rerun.starts == 2  # cut by a driver: run again
    assert client.stop() and not alive(rerun.pid)
    assert read_ledger(tmp_path / "sup" / "ledger.jsonl")["x1"].killed


DRIVER = """
import asyncio, os, sys, time
from pathlib import Path
from gyre.real.supervisor.client import LeaseRenewer, start_or_reuse
folder = Path(sys.argv[1])
client, _ = start_or_reuse(folder, grace_s=1.0, lease_s=1.0)
entry, _ = asyncio.run(client.spawn("x7", [sys.executable, "-c", "import time; time.sleep(120)"],
                                    dict(os.environ), folder.parent, folder.parent / "x7.log"))
LeaseRenewer(client, every_s=0.2).start()
print(client.pid, entry.pid, flush=True)
time.sleep(120)
"""


def test_a_killed_driver_leaves_the_supervisor_and_what_it_owns_until_the_lease_expires(tmp_path, supervisors):
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "sup")],
                              stdout=subprocess.PIPE, text=True)
    try:
        supervisor_pid, harness = map(int, driver.stdout.readline().split())
        supervisors.append(SupervisorClient(tmp_path / "sup", supervisor_pid, 0, ""))
        driver.kill()  # kill -9: no finally, no stop
        driver.wait(timeout=10)
        time.sleep(0.5)
        assert alive(supervisor_pid) and alive(harness)  # what survives a driver crash
        again = SupervisorClient.find(tmp_path / "sup")  # a resumed driver finds it and re-attaches
        assert again is not None and again.pid == supervisor_pid
        assert asyncio.run(again.status("x7")).pid == harness
        # nobody renews: lease (1 s) + grace (1 s) later everything it owned is stopped, and it exits
        assert wait_until(lambda: not alive(harness) and not alive(supervisor_pid), timeout=15)
        entry = read_ledger(tmp_path / "sup" / "ledger.jsonl")["x7"]
        assert (entry.state, entry.killed) == ("ended", True)
        assert "lease not renewed" in (tmp_path / "sup" / "supervisor.log").read_text()
    finally:
        driver.kill()


def test_a_killed_supervisor_takes_its_processes_and_its_successor_marks_them_lost(tmp_path, supervisors):
    client, _ = start_or_reuse(tmp_path / "sup", grace_s=60)
    supervisors.append(client)
    entry, _ = spawn(client, "x4", SLEEPER, tmp_path)
    os.kill(client.pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(entry.pid), timeout=10)  # parent-death signal: nothing left unseen
    view, live = executions_view(tmp_path / "sup")
    assert live is None and view[4].state == "lost" and "supervisor is gone" in view[4].reason
    successor, reused = start_or_reuse(tmp_path / "sup", grace_s=60)
    supervisors.append(successor)
    assert not reused and successor.pid != client.pid
    lost = read_ledger(tmp_path / "sup" / "ledger.jsonl")["x4"]
    assert lost.state == "lost" and str(entry.pid) in lost.reason
    view, live = executions_view(tmp_path / "sup")
    assert live == successor.pid and view[4].state == "lost"
    rerun, started = spawn(successor, "x4", SLEEPER, tmp_path)  # a lost key runs again
    assert started and rerun.starts == 2
    successor.stop()


HOLDING_DRIVER = """
import sys, time
from pathlib import Path
from gyre.real.runtime.resume import hold_run_lock
lock = hold_run_lock(Path(sys.argv[1]))  # what a live gyre run holds
print("holding", flush=True)
time.sleep(120)
"""


def test_gyre_stop_stops_the_driver_the_supervisor_and_what_it_owns(tmp_path, supervisors, capsys):
    client, _ = start_or_reuse(tmp_path / "run" / "supervisor", grace_s=60)
    supervisors.append(client)
    entries = [spawn(client, f"x{n}", SLEEPER, tmp_path)[0] for n in range(2)]
    driver = subprocess.Popen([sys.executable, "-c", HOLDING_DRIVER, str(tmp_path / "run")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert driver.stdout.readline().strip() == "holding"
        assert main(["stop", str(tmp_path / "run")]) == 0
        out = capsys.readouterr().out
        assert f"driver {driver.pid}: SIGTERM" in out and f"supervisor {client.pid}: stopped" in out
        assert driver.wait(timeout=10) == -signal.SIGTERM
    finally:
        driver.kill()
    assert not alive(client.pid) and not any(alive(e.pid) for e in entries)
    assert main(["stop", str(tmp_path / "run")]) == 0 and "no live driver or supervisor" in capsys.readouterr().out
    assert main(["stop", str(tmp_path / "nowhere")]) == 2


def test_one_supervisor_per_folder_and_hostile_requests_are_refused(tmp_path, supervisors):
    client, _ = start_or_reuse(tmp_path / "sup", grace_s=60)
    supervisors.append(client)
    second = subprocess.run([sys.executable, "-m", "gyre.real.supervisor", str(tmp_path / "sup"), "--grace-s", "1"],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 3 and "already has a live supervisor" in second.stderr
    assert start_or_reuse(tmp_path / "sup", grace_s=60) == (client, True)
    for line in (json.dumps({"op": "spawn", "key": "x1", "argv": SLEEPER, "env": {}, "cwd": "/", "log": "/dev/null"}),
                 "not json", json.dumps({"token": client.token, "op": "format-disk"}),
                 json.dumps({"token": client.token, "op": "status", "key": "x" * REQUEST_LIMIT})):  # too long
        with socket.create_connection(("127.0.0.1", client.port), timeout=10) as sock:
            sock.sendall(line.encode() + b"\n")
            answer = json.loads(sock.makefile().readline())
        assert answer["ok"] is False and answer["error"]
    assert client.entries() == {}  # nothing started
    client.stop()
