"""Harness executions in a loopback-only network namespace, bridged to a loopback chat server.

The model is a stdlib HTTP server in the test's namespace; the harnesses are
real processes inside ``unshare -n`` that write what they observed into their
workspace. Skipped where this machine cannot make a network namespace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gyre.real.harness import sandbox as runtime_sandbox
from gyre.real.harness.runner import Budgets, HarnessRunner, ScriptedHarness, Task
from gyre.real.harness.sandbox import HOST_NAMESPACES, SandboxUnavailable, netns_problem
from gyre.real.harness.scripted import MAIN_SYSTEM, SUB_SYSTEM

try:
    from sandboxing import READ_PATHS, NoMountNamespace, NoNamespaces
    from test_runtime_harness import ChatServer
except ImportError:
    from ..sandboxing import READ_PATHS, NoMountNamespace, NoNamespaces
    from .test_runtime_harness import ChatServer

needs_netns = pytest.mark.skipif(netns_problem() is not None, reason=f"no network namespace: {netns_problem()}")

PROBE = r"""
import json, socket, sys, urllib.request
base_url, key, other_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(base_url + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
with urllib.request.urlopen(request, timeout=10) as response:
    reply = json.loads(response.read())["choices"][0]["message"]["content"]
try:
    socket.create_connection(("127.0.0.1", other_port), timeout=2).close()
    other = "connected"
except OSError as exc:
    other = type(exc).__name__
json.dump({"reply": reply, "other": other, "interfaces": sorted(n for _, n in socket.if_nameindex())},
          open("observed.json", "w"))
"""

SLEEPER = r"""
import json, os, signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the group KILL after the grace period ends this one
json.dump({"harness": os.getpid(), "grandchild": grandchild.pid}, open("pids.json", "w"))
time.sleep(1000)
"""


@dataclass(frozen=True)
class PythonHarness:
    """A harness that is ``python -c CODE BASE_URL KEY *ARGS`` in the execution's workspace."""

    code: str
    args: tuple[str, ...] = ()
    name: str = "python"

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", self.code, base_url, key, *self.args], {}


@pytest.fixture
def server():
    s = ChatServer()
    yield s
    s.close()


def run_one(runner: HarnessRunner, execution: int = 7, key: str = "key-7"):
    async def scenario():
        try:
            return await runner.run(execution, Task(task_id="t", prompt="emit gyre"), key=key)
        finally:
            await runner.close()

    return asyncio.run(scenario())


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@needs_netns
@pytest.mark.timeout(60)
def test_scripted_harness_runs_a_multi_call_execution_isolated(tmp_path, server):
    runner = HarnessRunner(tmp_path, server.url, ScriptedHarness(calls=6, compact_every=3, subagent_at=(2,)),
                           isolate="always")
    result = run_one(runner)
    assert result.outcome == "completed" and result.returncode == 0 and result.isolated
    systems = [r["messages"][0]["content"] for r in server.requests]
    assert systems.count(SUB_SYSTEM) == 2 and systems.count(MAIN_SYSTEM) == 6 + 1  # 6 calls + 1 summary
    assert {r["auth"] for r in server.requests} == {"Bearer key-7"}
    assert (result.workspace / "answer.txt").exists()


@needs_netns
@pytest.mark.timeout(60)
def test_concurrent_executions_share_one_bridge(tmp_path, server):
    runner = HarnessRunner(tmp_path, server.url, ScriptedHarness(calls=2, subagent_at=()), isolate="always")

    async def scenario():
        try:
            return await asyncio.gather(*(runner.run(x, Task(task_id="t", prompt="p"), key=f"key-{x}")
                                          for x in range(3)))
        finally:
            await runner.close()

    results = asyncio.run(scenario())
    assert [(r.outcome, r.isolated) for r in results] == [("completed", True)] * 3
    assert sorted(r["auth"] for r in server.requests) == [f"Bearer key-{x}" for x in range(3) for _ in range(2)]


@needs_netns
@pytest.mark.timeout(60)
def test_sandbox_reaches_the_proxy_and_nothing_else(tmp_path, server):
    with socket.create_server(("127.0.0.1", 0)) as other:  # listening in the runner's namespace
        harness = PythonHarness(PROBE, (str(other.getsockname()[1]),))
        isolated = run_one(HarnessRunner(tmp_path / "in", server.url, harness, isolate="always"))
        control = run_one(HarnessRunner(tmp_path / "out", server.url, harness, isolate="never"))
    assert isolated.outcome == control.outcome == "completed"
    seen = json.loads((isolated.workspace / "observed.json").read_text())
    assert seen == {"reply": "gyre gyre other", "other": "ConnectionRefusedError", "interfaces": ["lo"]}
    assert json.loads((control.workspace / "observed.json").read_text())["other"] == "connected"
    assert [r["auth"] for r in server.requests] == ["Bearer key-7", "Bearer key-7"]


@needs_netns
@pytest.mark.timeout(60)
def test_harness_timeout_kills_sandbox_harness_and_grandchild(tmp_path, server):
    runner = HarnessRunner(tmp_path, server.url, PythonHarness(SLEEPER), Budgets(harness_timeout_s=2.0, grace_s=0.5),
                           isolate="always")
    result = run_one(runner)
    assert result.outcome == "harness_timeout" and result.isolated
    pids = json.loads((result.workspace / "pids.json").read_text())
    deadline = time.monotonic() + 5
    while not all(map(gone, pids.values())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {name: gone(pid) for name, pid in pids.items()} == {"harness": True, "grandchild": True}


@needs_netns
@pytest.mark.timeout(60)
def test_exit_status_and_death_by_signal_pass_through_the_sandbox(tmp_path, server):
    exits_3 = run_one(HarnessRunner(tmp_path / "a", server.url, PythonHarness("import sys; sys.exit(3)"),
                                    isolate="always"))
    assert (exits_3.outcome, exits_3.returncode, exits_3.isolated) == ("failed", 3, True)
    killed = PythonHarness("import os, signal; os.kill(os.getpid(), signal.SIGUSR1)")
    results = [run_one(HarnessRunner(tmp_path / m, server.url, killed, isolate=m)) for m in ("always", "never")]
    assert [r.returncode for r in results] == [-signal.SIGUSR1] * 2  # the same with and without the sandbox


def test_always_raises_with_the_reason_where_namespaces_are_unavailable(tmp_path, server):
    with pytest.raises(SandboxUnavailable, match="no namespaces in this test"):
        HarnessRunner(tmp_path, server.url, ScriptedHarness(), isolate="always", namespaces=NoNamespaces())
    assert not HarnessRunner(tmp_path, server.url, ScriptedHarness(), isolate="auto",
                             namespaces=NoNamespaces()).isolated
    with pytest.raises(SandboxUnavailable, match="'example.org'"):
        HarnessRunner(tmp_path, "http://example.org:80", ScriptedHarness(), isolate="always")
    with pytest.raises(ValueError, match="isolate must be one of"):
        HarnessRunner(tmp_path, server.url, ScriptedHarness(), isolate="sometimes")


@pytest.mark.timeout(60)
def test_never_runs_in_the_host_network(tmp_path, server):
    result = run_one(HarnessRunner(tmp_path, server.url, ScriptedHarness(calls=1, subagent_at=()), isolate="never"))
    assert result.outcome == "completed" and not result.isolated and len(server.requests) == 1


@dataclass(frozen=True)
class MissingHarness:
    name: str = "missing"

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        return ["no-such-harness", "--flag"], {}


@needs_netns
@pytest.mark.timeout(60)
def test_missing_harness_is_a_start_failure_when_isolated(tmp_path, server):
    result = run_one(HarnessRunner(tmp_path, server.url, MissingHarness(), isolate="always"))
    assert (result.outcome, result.returncode, result.isolated) == ("failed", None, True)
    assert "could not start no-such-harness" in (tmp_path / "exec-7" / "harness.log").read_text()


@needs_netns
@pytest.mark.timeout(60)
def test_bridge_failures_name_the_port_and_the_socket(tmp_path, caplog):
    with socket.create_server(("127.0.0.1", 0)) as closed:
        dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    harness = PythonHarness("import socket, sys, urllib.parse as u; "
                            "socket.create_connection(('127.0.0.1', u.urlsplit(sys.argv[1]).port)).recv(1)")
    with caplog.at_level(logging.WARNING, logger="gyre.real.harness.sandbox"):
        result = run_one(HarnessRunner(tmp_path, dead_url, harness, isolate="always"))
    assert result.outcome == "completed"  # the connection was accepted in the namespace, then closed
    assert f"cannot connect to the proxy at {dead_url[7:]}" in caplog.text
    inner = [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 8111)).recv(1)"]
    argv = runtime_sandbox.sandbox_argv(inner, tmp_path / "no.sock", 8111)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert f"cannot reach the host bridge at unix socket {tmp_path / 'no.sock'}" in done.stderr


@needs_netns
@pytest.mark.timeout(30)
def test_loopback_comes_up_without_ip(tmp_path):
    def in_namespace(code: str) -> subprocess.CompletedProcess:
        prelude = "import socket; from gyre.real.harness.sandbox import bring_loopback_up; "
        return subprocess.run([*HOST_NAMESPACES.network()[0], sys.executable, "-c", prelude + code],
                              capture_output=True, text=True, timeout=30, env={**os.environ, "PATH": str(tmp_path)})

    serve_and_connect = "s = socket.create_server(('127.0.0.1', 0)); socket.create_connection(s.getsockname())"
    assert "unreachable" in in_namespace(serve_and_connect).stderr  # control: lo starts down
    up = in_namespace("bring_loopback_up(); " + serve_and_connect)  # no ip on PATH: the ioctl path
    assert up.returncode == 0, up.stderr


READER = r"""
import json, os, sys, urllib.request
base_url, key, *paths = sys.argv[1:]
""" + READ_PATHS + r"""
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(base_url + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
with urllib.request.urlopen(request, timeout=10) as response:
    seen["reply"] = json.loads(response.read())["choices"][0]["message"]["content"]
open("workspace-note.txt", "w").write("mine")
json.dump(seen, open("observed.json", "w"))
"""


def secrets_in(tmp_path: Path) -> tuple[Path, Path]:
    records = tmp_path / "records"
    records.mkdir()
    (records / "keys.json").write_text('{"version": 2, "keys": {"digest": "exec-7"}}')
    (records / "exec-7.tito").write_bytes(b"GYR1 record bytes")
    keys_file = tmp_path / "operator-keys.txt"
    keys_file.write_text("gyre-secret-key")
    return records, keys_file


@needs_netns
@pytest.mark.skipif(runtime_sandbox.mountns_problem() is not None,
                    reason=f"no mount namespace: {runtime_sandbox.mountns_problem()}")
@pytest.mark.timeout(60)
def test_a_sandboxed_harness_cannot_read_the_record_store_or_keys(tmp_path, server, monkeypatch):
    records, keys_file = secrets_in(tmp_path)
    monkeypatch.setenv(runtime_sandbox.HIDE_ENV, os.pathsep.join([str(records), str(keys_file)]))
    harness = PythonHarness(READER, (str(records), str(records / "keys.json"), str(keys_file)))
    isolated = run_one(HarnessRunner(tmp_path / "in", server.url, harness, isolate="always"))
    control = run_one(HarnessRunner(tmp_path / "out", server.url, harness, isolate="never"))
    assert isolated.outcome == control.outcome == "completed"
    seen = json.loads((isolated.workspace / "observed.json").read_text())
    assert seen == {str(records): [], str(records / "keys.json"): "FileNotFoundError", str(keys_file): "",
                    "reply": "gyre gyre other"}
    assert (isolated.workspace / "workspace-note.txt").read_text() == "mine"  # its workspace stays writable
    plain = json.loads((control.workspace / "observed.json").read_text())
    assert plain[str(records)] == ["exec-7.tito", "keys.json"] and plain[str(keys_file)] == "gyre-secret-key"
    assert (records / "keys.json").exists() and keys_file.read_text() == "gyre-secret-key"  # host untouched


@needs_netns
@pytest.mark.skipif(runtime_sandbox.mountns_problem() is not None, reason="no mount namespace")
@pytest.mark.timeout(60)
def test_hiding_a_folder_that_holds_the_workspace_is_refused(tmp_path, server, monkeypatch):
    monkeypatch.setenv(runtime_sandbox.HIDE_ENV, str(tmp_path))
    result = run_one(HarnessRunner(tmp_path, server.url, PythonHarness(READER), isolate="always"))
    assert result.outcome == "failed" and result.returncode == runtime_sandbox.SANDBOX_FAILED
    assert "cannot hide" in (tmp_path / "exec-7" / "harness.log").read_text()
    assert not server.requests


@needs_netns
@pytest.mark.timeout(60)
def test_without_a_mount_namespace_the_harness_runs_unhidden_with_a_warning(tmp_path, server, monkeypatch, caplog):
    """The documented fallback: network isolation only, the paths stay visible, a warning says why."""
    records, keys_file = secrets_in(tmp_path)
    monkeypatch.setenv(runtime_sandbox.HIDE_ENV, str(records))
    argv = runtime_sandbox.sandbox_argv(["true"], tmp_path / "s.sock", 1, namespaces=NoMountNamespace())
    assert "--hide" not in argv and "-m" not in argv[:argv.index(sys.executable)]  # no mount namespace asked
    harness = PythonHarness(READER, (str(records),))
    with caplog.at_level(logging.WARNING, logger="gyre.real.harness.sandbox"):
        result = run_one(HarnessRunner(tmp_path / "in", server.url, harness, isolate="always",
                                       namespaces=NoMountNamespace()))
    assert result.outcome == "completed" and result.isolated
    assert json.loads((result.workspace / "observed.json").read_text())[str(records)] == ["exec-7.tito", "keys.json"]
    assert "no mount namespaces in this test" in caplog.text
