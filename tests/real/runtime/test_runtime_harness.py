"""Harness runner + scripted harness + toy evaluator, against a loopback chat server.

The model server here is the outer edge (a stdlib HTTP server speaking the
OpenAI Chat Completions shape); the harness is a real process making real
HTTP calls, and the runner's sandboxes, budgets and kills are real. The
hiding checks run the scripted harness through Gyre's real proxy: its record
store and ``keys.json`` are hidden from the harness (it lists nothing, reads
nothing, still finishes its task), and where no mount namespace can be made
the runner falls back to network isolation alone and logs why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gyre.real.harness import sandbox as runtime_sandbox
from gyre.real.harness.runner import Budgets, HarnessRunner, ScriptedHarness, Task
from gyre.real.harness.scripted import MAIN_SYSTEM, SUB_SYSTEM, SUMMARY_REQUEST
from gyre.real.harness.tasks import artifact_version
from gyre.real.toy.tasks import EmitTokenTask

try:
    from sandboxing import READ_PATHS, NoMountNamespace
except ImportError:
    from ..sandboxing import READ_PATHS, NoMountNamespace


class ChatServer:
    def __init__(self, fail_first: int = 0, always_fail: bool = False) -> None:
        self.requests: list[dict] = []
        self.fail_left, self.always_fail = fail_first, always_fail
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if server.always_fail or server.fail_left > 0:
                    server.fail_left -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                server.requests.append({"auth": self.headers["Authorization"], **body})
                reply = {"choices": [{"message": {"role": "assistant", "content": "gyre gyre other"}}]}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = ChatServer()
    yield s
    s.close()


def run_one(runner: HarnessRunner, execution: int = 7):
    return asyncio.run(runner.run(execution, EmitTokenTask().task("q0"), key=f"key-{execution}"))


@pytest.mark.timeout(60)
def test_scripted_harness_runs_a_multi_call_execution(tmp_path, server):
    adapter = ScriptedHarness(calls=6, compact_every=3, subagent_at=(2,))
    result = run_one(HarnessRunner(tmp_path, server.url, adapter))
    assert result.outcome == "completed" and result.returncode == 0
    systems = [r["messages"][0]["content"] for r in server.requests]
    assert systems.count(SUB_SYSTEM) == 2 and systems.count(MAIN_SYSTEM) == 6 + 1  # 6 calls + 1 summary
    summaries = [r for r in server.requests if r["messages"][-1]["content"] == SUMMARY_REQUEST]
    assert len(summaries) == 1
    after = server.requests[server.requests.index(summaries[0]) + 1]
    assert len(after["messages"]) < len(summaries[0]["messages"])  # compaction shrank the context
    assert {r["auth"] for r in server.requests} == {"Bearer key-7"}
    evaluation = EmitTokenTask().evaluate("7", result.workspace)
    assert evaluation.valid and evaluation.score == pytest.approx(2 / 3)
    assert evaluation.binding.artifact_version == artifact_version(result.workspace)


@pytest.mark.timeout(60)
def test_transient_errors_are_retried_inside_the_harness(tmp_path):
    server = ChatServer(fail_first=3)
    try:
        result = run_one(HarnessRunner(tmp_path, server.url, ScriptedHarness(calls=2, subagent_at=())))
    finally:
        server.close()
    assert result.outcome == "completed" and len(server.requests) == 2


@pytest.mark.timeout(60)
def test_dead_engine_fails_the_execution_after_the_retry_budget(tmp_path):
    server = ChatServer(always_fail=True)
    try:
        result = run_one(HarnessRunner(tmp_path, server.url, ScriptedHarness(calls=2, subagent_at=())))
    finally:
        server.close()
    assert result.outcome == "failed" and result.returncode == 3
    assert "HTTP 503" in (tmp_path / "exec-7" / "harness.log").read_text()
    assert EmitTokenTask().evaluate("7", result.workspace) is None  # no evaluable work: placeholder


@pytest.mark.timeout(60)
def test_harness_timeout_kills_the_group_and_keeps_partial_work(tmp_path, server):
    adapter = ScriptedHarness(calls=50, compact_every=0, subagent_at=(), sleep_s=0.2)
    result = run_one(HarnessRunner(tmp_path, server.url, adapter, Budgets(harness_timeout_s=3.0, grace_s=1.0)))
    assert result.outcome == "harness_timeout"
    assert 0 < len(server.requests) < 50
    evaluation = EmitTokenTask().evaluate("7", result.workspace)
    assert evaluation.valid and evaluation.score > 0  # partial scoring after a timeout


@pytest.mark.timeout(60)
def test_cancel_ends_the_execution_as_cancelled(tmp_path, server):
    runner = HarnessRunner(tmp_path, server.url, ScriptedHarness(calls=50, subagent_at=(), sleep_s=0.2))

    async def scenario():
        task = asyncio.create_task(runner.run(3, EmitTokenTask().task("q"), key="k"))
        await asyncio.sleep(0.8)
        await runner.cancel(3)
        return await task

    assert asyncio.run(scenario()).outcome == "cancelled"


class StdinReader:
    """A harness that reads stdin to its end, as ``codex exec`` does when stdin is not a terminal."""

    name = "stdin-reader"

    def command(self, task, base_url, key, home):
        code = "import sys, pathlib; pathlib.Path('stdin.txt').write_text(repr(sys.stdin.read()))"
        return [sys.executable, "-c", code], {}


@pytest.mark.timeout(60)
def test_harness_stdin_is_closed_even_when_the_runner_has_an_open_pipe(tmp_path, server):
    read_end, write_end = os.pipe()  # never written to, never closed while the harness runs
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        result = run_one(HarnessRunner(tmp_path, server.url, StdinReader(), Budgets(harness_timeout_s=10.0)))
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert result.outcome == "completed", (tmp_path / "exec-7" / "harness.log").read_text()
    assert (result.workspace / "stdin.txt").read_text() == "''"


def test_missing_harness_binary_is_a_failed_start(tmp_path, server):
    from gyre.real.harness.runner import ClaudeCode

    result = run_one(HarnessRunner(tmp_path, server.url, ClaudeCode(binary=str(tmp_path / "no-claude"))))
    assert result.outcome == "failed" and result.returncode is None
    assert "could not start" in (tmp_path / "exec-7" / "harness.log").read_text()


def test_workspace_hash_changes_with_content(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    before = artifact_version(tmp_path)
    (tmp_path / "a.txt").write_text("y")
    assert artifact_version(tmp_path) != before
    assert Task(task_id="t", prompt="p").files == {}


@pytest.mark.timeout(120)
def test_scripted_harness_through_the_real_proxy_builds_its_tree(tmp_path_factory, tmp_path):
    """The same runner and harness, now through Gyre's proxy in front of a /generate engine."""
    pytest.importorskip("aiohttp")
    try:
        from proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, check_records, echo_script,
                                    new_key, proxy_config, shared_tiny_dir, start_proxy)
    except ImportError:
        from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, check_records, echo_script,
                                     new_key, proxy_config, shared_tiny_dir, start_proxy)
    from gyre.trajectory.tree import TrajectoryTree

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    records = tmp_path / "records"
    engine = ServerThread(ScriptedEngine(model, echo_script).application).start()
    proxy, _server = start_proxy(proxy_config(model, records, {"e0": engine.url}))
    try:
        key = new_key(proxy.url, "exec-9")
        adapter = ScriptedHarness(calls=5, compact_every=3, subagent_at=(2,))
        result = asyncio.run(HarnessRunner(tmp_path / "runs", proxy.url, adapter).run(
            9, EmitTokenTask().task("q"), key=key))
    finally:
        proxy.stop()
        engine.stop()
    assert result.outcome == "completed"
    recorded = check_records(records, "exec-9", model)
    assert len(recorded) == 5 + 2 + 1  # main calls, sub-agent calls, one compaction summary
    tree = TrajectoryTree.from_records(recorded)
    roots = {tree.request_sequence(i)[:8].tobytes() for i in range(len(recorded))}
    assert len(roots) >= 2  # the sub-agent's context starts apart from the main agent's


SNOOP = r"""
import json, os, sys
paths, argv = sys.argv[1].split(os.pathsep), sys.argv[2:]
""" + READ_PATHS + r"""
json.dump(seen, open("snooped.json", "w"))
os.execv(argv[0], argv)
"""


class SnoopingScripted:
    """The scripted harness, started after its process tried to list/read ``paths`` (what it saw: snooped.json)."""

    name = "snooping-scripted"

    def __init__(self, *paths) -> None:
        self.paths, self.inner = [str(p) for p in paths], ScriptedHarness(calls=3, compact_every=0, subagent_at=())

    def command(self, task, base_url, key, home):
        argv, env = self.inner.command(task, base_url, key, home)
        return [sys.executable, "-c", SNOOP, os.pathsep.join(self.paths), *argv], env


@pytest.fixture
def real_proxy(model, tmp_path):
    """Gyre's proxy (records under tmp_path/records) in front of a scripted /generate engine."""
    pytest.importorskip("aiohttp")
    try:
        from proxy_fixtures import ScriptedEngine, ServerThread, echo_script, proxy_config, start_proxy
    except ImportError:
        from .proxy_fixtures import ScriptedEngine, ServerThread, echo_script, proxy_config, start_proxy
    records = tmp_path / "records"
    engine = ServerThread(ScriptedEngine(model, echo_script).application).start()
    proxy, _server = start_proxy(proxy_config(model, records, {"e0": engine.url}))
    yield proxy, records
    proxy.stop()
    engine.stop()


def run_and_close(runner: HarnessRunner, execution: int, key: str):
    async def scenario():
        try:
            return await runner.run(execution, EmitTokenTask().task("q"), key=key)
        finally:
            await runner.close()

    return asyncio.run(scenario())


def secrets_of(proxy, records):
    try:
        from proxy_fixtures import new_key
    except ImportError:
        from .proxy_fixtures import new_key
    key = new_key(proxy.url, "exec-9")  # the proxy writes records/keys.json (digests) now
    keys_file = records / "keys.json"
    assert keys_file.is_file()
    return key, keys_file


@pytest.mark.skipif(runtime_sandbox.mountns_problem() is not None,
                    reason=f"no mount namespace: {runtime_sandbox.mountns_problem()}")
@pytest.mark.timeout(120)
def test_the_runner_hides_the_record_store_and_keys_from_a_scripted_harness(model, real_proxy, tmp_path):
    proxy, records = real_proxy
    key, keys_file = secrets_of(proxy, records)
    before = keys_file.read_bytes()
    runner = HarnessRunner(tmp_path / "runs", proxy.url, SnoopingScripted(records, keys_file), isolate="always",
                           hide=[records, keys_file])
    assert runner.isolated and runner.hiding
    result = run_and_close(runner, 9, key)
    assert result.outcome == "completed", (tmp_path / "runs" / "exec-9" / "harness.log").read_text()
    seen = json.loads((result.workspace / "snooped.json").read_text())
    assert seen == {str(records): [], str(keys_file): "FileNotFoundError"}
    evaluation = EmitTokenTask().evaluate("9", result.workspace)  # its workspace worked: the answer is there
    assert evaluation is not None and evaluation.valid
    try:
        from proxy_fixtures import check_records
    except ImportError:
        from .proxy_fixtures import check_records
    assert len(check_records(records, "exec-9", model)) == 3  # the proxy still recorded every call on the host
    assert keys_file.read_bytes() == before  # the host's files are untouched


@pytest.mark.skipif(runtime_sandbox.netns_problem() is not None, reason="no network namespace")
@pytest.mark.timeout(120)
def test_without_a_mount_namespace_the_runner_falls_back_and_says_why(model, real_proxy, tmp_path, monkeypatch,
                                                                      caplog):
    proxy, records = real_proxy
    key, keys_file = secrets_of(proxy, records)
    with caplog.at_level(logging.WARNING, logger="gyre.real.harness.runner"):
        plain = HarnessRunner(tmp_path / "plain", proxy.url, ScriptedHarness(), isolate="never", hide=[records])
    assert not plain.hiding and "stay visible to harnesses: the harnesses are not sandboxed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gyre.real.harness.runner"):
        runner = HarnessRunner(tmp_path / "runs", proxy.url, SnoopingScripted(records, keys_file), isolate="always",
                               hide=[records, keys_file], namespaces=NoMountNamespace())
    assert runner.isolated and not runner.hiding
    assert f"{records}, {keys_file} stay visible to harnesses: no mount namespaces in this test" in caplog.text
    result = run_and_close(runner, 9, key)
    assert result.outcome == "completed" and result.isolated  # network isolation still holds
    seen = json.loads((result.workspace / "snooped.json").read_text())
    assert "keys.json" in seen[str(records)] and seen[str(keys_file)].startswith("{")


class Quick:
    """A harness that exits at once."""

    def command(self, task, base_url, key, home):
        return [sys.executable, "-c", "pass"], {}


class CountedQuick(Quick):
    """``Quick``, counting the command lines it was asked for: the runner spawns each right after asking."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def command(self, task, base_url, key, home):
        self.asked.append(key)
        return super().command(task, base_url, key, home)


@pytest.mark.timeout(60)
def test_runs_start_one_at_a_time_and_the_loop_serves_others_between_starts(tmp_path):
    """A burst of starts must not hold the event loop: something due on the loop right after 8 runs were
    started (the step waiting for its groups, in a job) runs after at most one spawn, not after all 8."""
    adapter, seen = CountedQuick(), []
    spawned = adapter.asked
    runner = HarnessRunner(tmp_path, "http://127.0.0.1:9", adapter, Budgets(harness_timeout_s=30.0), isolate="never")

    async def burst():
        runs = [asyncio.ensure_future(runner.run(x, EmitTokenTask().task("q0"), key=f"k{x}")) for x in range(8)]
        asyncio.get_running_loop().call_soon(lambda: seen.append(len(spawned)))
        return await asyncio.gather(*runs)

    results = asyncio.run(burst())
    assert [r.outcome for r in results] == ["completed"] * 8 and len(spawned) == 8
    assert seen[0] <= 1, f"the loop ran nothing else until {seen[0]} of 8 harnesses were spawned"


class SlowSetUp(Quick):
    """``Quick``, with a task set-up that waits (a slow disk, a slow adapter) until ``go`` is set."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.turns = 0  # the loop's turns so far (the test's ticker counts them)
        self.turns_at_set_up: int | None = None

    def command(self, task, base_url, key, home):
        self.go.wait(5.0)  # on the loop nothing could set it: the test fails after 5 s instead of hanging
        self.turns_at_set_up = self.turns
        return super().command(task, base_url, key, home)


@pytest.mark.timeout(60)
def test_a_slow_task_set_up_holds_its_start_not_the_loop(tmp_path):
    """While a run's workspace and command are being made, a ticker on the loop keeps turning: the set-up
    is let through only once the ticker turned ``turns_needed`` times (on the loop it would turn 0 times)."""
    adapter, turns_needed = SlowSetUp(), 5
    runner = HarnessRunner(tmp_path, "http://127.0.0.1:9", adapter, Budgets(harness_timeout_s=30.0), isolate="never")

    async def main():
        run = asyncio.ensure_future(runner.run(1, EmitTokenTask().task("q0"), key="k1"))
        while not run.done():
            adapter.turns += 1
            if adapter.turns == turns_needed:
                adapter.go.set()
            await asyncio.sleep(0.005)
        return run.result()

    result = asyncio.run(main())
    assert result.outcome == "completed" and (result.workspace / "TASK.md").is_file()
    assert adapter.turns_at_set_up >= turns_needed, \
        f"the loop turned {adapter.turns_at_set_up} times while the task was set up"
