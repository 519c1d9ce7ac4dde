"""The job's proxy as a supervised process (``runtime.proxy_process``), for real: a scripted engine behind
``python -m gyre.real.proxy.cli``, killed with SIGKILL between two calls of one execution.

Checked: the proxy comes back on the same URL by itself; the execution's key still works (keys live in the
record folder); the record of the call made before the kill is intact and the call after it is recorded
beside it; ``on_restart`` runs after the proxy is back (its admin call succeeds) and after the restart is
recorded; a stopped proxy is not restarted, nor a detached one that something else ended; a proxy that
cannot start names its exit and its log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest

try:
    from proxy_fixtures import ScriptedEngine, ServerThread, admin, check_records, new_key, proxy_config
except ImportError:
    from .proxy_fixtures import ScriptedEngine, ServerThread, admin, check_records, new_key, proxy_config

from gyre.real.runtime.ports import free_port
from gyre.real.runtime.proxy_process import ProxyProcess, ProxyStartError, config_mapping

pytestmark = pytest.mark.timeout(180)


def _call(url: str, key: str, text: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": key, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _alive(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/", timeout=30) as response:
        return json.loads(response.read())


async def _on_loop(blocking):
    return blocking()  # runs on the loop itself, blocking it


class Supervisor:
    """``ProxyProcess.supervise`` on its own event loop in a thread (the job runs it on the controller's)."""

    def __init__(self, proxy: ProxyProcess, on_restart) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.task = asyncio.run_coroutine_threadsafe(proxy.supervise(on_restart), self.loop)

    def close(self) -> None:
        self.task.cancel()
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), self.loop).result(10)  # the cancellation lands
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_killed_proxy_comes_back_on_its_address_with_keys_and_records(model, tmp_path):
    engine = ScriptedEngine(model, lambda prompt: f"echo {prompt}", engine_id="e0")  # answers with its prompt
    with ServerThread(engine.application) as engine_thread:
        config = proxy_config(model, tmp_path / "records", {"e0": engine_thread.url}, port=free_port(), fsync=False)
        proxy = ProxyProcess(config, tmp_path / "proxy", poll_s=0.1).start()
        restarted: list[tuple[int, int]] = []

        def on_restart() -> None:  # what the backend does: put back a drain the old process held in memory
            status, _ = admin(proxy.url, "POST", "/admin/engines/e0/undrain")
            restarted.append((len(proxy.restarts), status))

        supervisor = Supervisor(proxy, on_restart)
        try:
            assert oct(os.stat(tmp_path / "proxy" / "proxy.json").st_mode & 0o777) == "0o600"  # the admin token
            key = new_key(proxy.url, "survivor")
            assert _alive(proxy.url)["loop"] == "uvloop"  # the job's proxy runs on uvloop (installed with [real])
            assert _call(proxy.url, key, "one")[0] == 200
            first_pid = proxy.pid
            assert int((tmp_path / "proxy" / "proxy.pid").read_text()) == first_pid
            os.killpg(first_pid, signal.SIGKILL)

            def blocked_until_back() -> bool:  # what an admin call does: wait out the restart, blocking the loop
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    try:
                        admin(proxy.url, "GET", "/admin/engines")
                        return True
                    except OSError:
                        time.sleep(0.1)
                return False

            blocked = asyncio.run_coroutine_threadsafe(asyncio.to_thread(lambda: None), supervisor.loop)
            came_back = asyncio.run_coroutine_threadsafe(_on_loop(blocked_until_back), supervisor.loop)
            assert came_back.result(90), "the proxy never came back while the loop was blocked"
            blocked.result(10)
            deadline = time.monotonic() + 60
            while not restarted and time.monotonic() < deadline:
                time.sleep(0.1)
            assert restarted == [(1, 200)], proxy.log_tail()
            assert proxy.pid != first_pid and proxy.restarts[0]["exit_code"] == -signal.SIGKILL
            assert proxy.restarts[0]["back_s"] > 0
            status, answer = _call(proxy.url, key, "two")  # the same key, the same URL
            assert status == 200 and "two" in answer["content"][0]["text"]
        finally:
            supervisor.close()
            proxy.stop()
        assert proxy.exited() is None and len(proxy.restarts) == 1  # stopped on purpose: no restart
    records = check_records(tmp_path / "records", "survivor", model)
    assert len(records) == 2  # the call before the kill is intact beside the one after it


def test_a_detached_proxy_ended_by_someone_else_is_not_restarted(model, tmp_path):
    """The job's ordered stop: the watcher lets go first, then whoever owns the process ends it."""
    config = proxy_config(model, tmp_path / "records", {"e0": "http://127.0.0.1:9"}, port=free_port(), fsync=False)
    proxy = ProxyProcess(config, tmp_path / "proxy", poll_s=0.05).start()
    supervisor = Supervisor(proxy, lambda: None)
    try:
        pid = proxy.pid
        proxy.detach()
        assert _alive(proxy.url)  # detached: still serving
        os.killpg(pid, signal.SIGTERM)
        time.sleep(1.0)  # twenty of the watcher's polls
        assert proxy.restarts == [] and proxy.pid == pid and proxy.exited() is None
    finally:
        supervisor.close()
        proxy.stop()


def test_a_proxy_that_cannot_start_names_its_exit_and_log(model, tmp_path):
    config = proxy_config(model, tmp_path / "records", {"e0": "http://127.0.0.1:9"}, port=free_port())
    broken = config.with_overrides(model_path=str(tmp_path / "no-such-model"))
    with pytest.raises(ProxyStartError) as info:
        ProxyProcess(broken, tmp_path / "proxy", start_timeout_s=60).start()
    assert "exit" in str(info.value) and "no-such-model" in str(info.value)


def test_the_written_configuration_reads_back_as_the_same_config(model, tmp_path):
    from gyre.real.proxy.config import RetryPolicy, config_from_mapping

    config = proxy_config(model, tmp_path / "records", {"e0": "http://127.0.0.1:9"}, port=free_port(),
                          retry=RetryPolicy(hold_s=600.0))
    assert config_from_mapping(config_mapping(config)) == config
    with pytest.raises(ValueError, match="fixed port"):
        ProxyProcess(config.with_overrides(port=0), tmp_path / "proxy")


@pytest.mark.parametrize("loop, gc_mode", [("asyncio", "default"), ("uvloop", "tuned")])
def test_the_proxy_serves_on_the_event_loop_asked_for(model, tmp_path, loop, gc_mode):
    """``gyre proxy --loop --gc``: both loops and both collector set-ups serve a recorded call, and
    ``GET /`` names the loop and reports the collector (``proxy.collector``)."""
    import subprocess
    import sys

    engine = ScriptedEngine(model, lambda prompt: "fine", engine_id="e0")
    with ServerThread(engine.application) as engine_thread:
        config = proxy_config(model, tmp_path / "records", {"e0": engine_thread.url}, port=free_port(), fsync=True)
        (tmp_path / "proxy.json").write_text(json.dumps(config_mapping(config)))
        command = [sys.executable, "-m", "gyre.real.proxy.cli", "--config", str(tmp_path / "proxy.json"),
                   "--loop", loop, "--gc", gc_mode]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1"))
        try:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            url = json.loads(line)["url"]
            alive = _alive(url)
            assert alive["loop"] == loop and alive["gc"]["mode"] == gc_mode, alive
            if gc_mode == "tuned":  # what startup built is frozen out of collection, the young collected less often
                assert alive["gc"]["frozen"] > 10_000 and alive["gc"]["threshold0"] == 50_000, alive
            else:
                assert alive["gc"]["frozen"] == 0 and alive["gc"]["threshold0"] == 700, alive
            status, answer = _call(url, new_key(url, f"on-{loop}"), "hi")
            assert status == 200 and answer["content"][0]["text"] == "fine", answer
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
    assert len(check_records(tmp_path / "records", f"on-{loop}", model)) == 1
