"""The proxy and the sandbox bridge as supervised services (``supervisor.services``), for real.

A scripted engine serves behind ``python -m gyre.real.proxy.cli`` started by a real supervisor. Checked:
the proxy answers with an execution's key; a second ``SupervisedProxy`` (a resumed driver) adopts the same
process, whose key and records still serve; a SIGKILLed proxy is restarted through the supervisor on the
same address (the ledger counts two starts of ``proxy``); a stopped one is not; the bridge service is
started once, listens on its fixed socket and pipes a connection through to the proxy.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import threading
import time

import pytest

try:
    from proxy_fixtures import ScriptedEngine, ServerThread, new_key, proxy_config
except ImportError:
    from ..proxy_fixtures import ScriptedEngine, ServerThread, new_key, proxy_config

from gyre.real.runtime.ports import free_port
from gyre.real.runtime.proxy_process import ProxyStartError
from gyre.real.supervisor.client import start_or_reuse
from gyre.real.supervisor.ledger import read_ledger
from gyre.real.supervisor.services import SupervisedProxy, bridge_service

pytestmark = pytest.mark.timeout(180)


def _call(url: str, key: str, text: str) -> int:
    import urllib.error
    import urllib.request

    body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": key, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _watch(proxy: SupervisedProxy) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(proxy.supervise(), loop)
    return loop, thread


def test_the_supervised_proxy_is_adopted_restarted_and_stopped(model, tmp_path):
    engine = ScriptedEngine(model, lambda prompt: f"echo {prompt}", engine_id="e0")
    client, _ = start_or_reuse(tmp_path / "supervisor", grace_s=60)
    try:
        with ServerThread(engine.application) as engine_thread:
            config = proxy_config(model, tmp_path / "records", {"e0": engine_thread.url}, port=free_port(),
                                  fsync=False)
            proxy = SupervisedProxy(config, tmp_path / "proxy", client, poll_s=0.1).start()
            key = new_key(proxy.url, "survivor")
            assert _call(proxy.url, key, "one") == 200
            adopted = SupervisedProxy(config, tmp_path / "proxy", client, poll_s=0.1).adopt()  # a resumed driver
            assert adopted.pid == proxy.pid and adopted.adopted
            assert _call(adopted.url, key, "two") == 200
            first = adopted.pid
            loop, thread = _watch(adopted)
            os.killpg(first, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not adopted.restarts and time.monotonic() < deadline:
                time.sleep(0.1)
            assert adopted.restarts and adopted.restarts[0]["exit_code"] == -signal.SIGKILL
            assert adopted.pid != first and _call(adopted.url, key, "three") == 200  # same address, same key
            assert read_ledger(tmp_path / "supervisor" / "ledger.jsonl")["proxy"].starts == 2
            adopted.stop()
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            entry = read_ledger(tmp_path / "supervisor" / "ledger.jsonl")["proxy"]
            assert entry.state == "ended" and entry.killed and adopted.exited() is None  # stopped: no restart
    finally:
        client.stop()


class _HungProxy(SupervisedProxy):
    """A proxy whose start never listens nor ends (what a stalled start looks like from outside)."""

    def _argv(self, path):
        return [sys.executable, "-c", "import time\nwhile True:\n    time.sleep(0.01)"]


def test_a_proxy_start_that_hangs_is_tried_again_then_fails_quoting_where_it_hung(model, tmp_path):
    client, _ = start_or_reuse(tmp_path / "supervisor", grace_s=60)
    said: list[str] = []
    try:
        config = proxy_config(model, tmp_path / "records", {"e0": "http://127.0.0.1:9"}, port=free_port())
        proxy = _HungProxy(config, tmp_path / "proxy", client, poll_s=0.1, start_timeout_s=1.0, progress=said.append)
        with pytest.raises(ProxyStartError) as info:
            proxy.start()
        message = str(info.value)
        assert "(2 tries)" in message, message
        assert 'File "<string>", line 3 in <module>' in message, message  # the fault handler's stack: the hang
        assert any("did not listen within 1 s" in line and "starting it again" in line for line in said), said
        entry = read_ledger(tmp_path / "supervisor" / "ledger.jsonl")["proxy"]
        assert entry.starts == 2 and entry.state == "ended"  # both tries stopped: nothing left running
    finally:
        client.stop()


def test_a_proxy_that_exits_at_start_is_not_tried_again(model, tmp_path):
    client, _ = start_or_reuse(tmp_path / "supervisor", grace_s=60)
    try:
        config = proxy_config(model, tmp_path / "records", {"e0": "http://127.0.0.1:9"}, port=free_port())
        proxy = SupervisedProxy(config, tmp_path / "proxy", client, poll_s=0.1, start_timeout_s=30.0)
        proxy._argv = lambda path: [sys.executable, "-c", "import sys; sys.exit('no such thing')"]
        with pytest.raises(ProxyStartError, match=r"\(1 try\): no such thing"):
            proxy.start()
        assert read_ledger(tmp_path / "supervisor" / "ledger.jsonl")["proxy"].starts == 1
    finally:
        client.stop()


def test_the_bridge_service_starts_once_and_pipes_to_the_proxy(tmp_path):
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen()
    port = upstream.getsockname()[1]
    client, _ = start_or_reuse(tmp_path / "run" / "supervisor", grace_s=60)
    try:
        address = bridge_service(client, f"http://127.0.0.1:{port}")
        again = bridge_service(client, f"http://127.0.0.1:{port}")
        assert again == address and address.port == port and address.path.is_socket()
        assert read_ledger(tmp_path / "run" / "supervisor" / "ledger.jsonl")["bridge"].starts == 1
        with socket.socket(socket.AF_UNIX) as side:
            side.connect(str(address.path))
            side.sendall(b"ping")
            upstream.settimeout(10)
            conn, _ = upstream.accept()
            with conn:
                assert conn.recv(4) == b"ping"
    finally:
        client.stop()
        upstream.close()
    assert not address.path.exists()  # the stopped bridge removed its socket
