"""A stalled records disk holds no one but the calls whose records it holds (``proxy.recording``).

The stall: the commit journal's write (``GroupCommit.journal.append``, the seam every durable record
passes; without ``fsync``, the log's append) blocks until the test releases it, as a write to a hung disk does. While it blocks, the
proxy still answers ``GET /`` and the admin API at once; the stalled call gets a 503 in its API's
shape after ``limits.record_write_timeout_s``, not never; once the disk is back, calls are served
and the stalled record, which did land, is on disk.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

try:
    from held_calls import held
    from proxy_fixtures import ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir
    from proxy_fixtures import start_proxy
except ImportError:
    from ..held_calls import held
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config,  # noqa: F401
                                 shared_tiny_dir, start_proxy)

from gyre.real.proxy.config import Limits

pytestmark = pytest.mark.timeout(60)
TIMEOUT_S = 0.5


@pytest.fixture(params=[True, False], ids=["fsync", "no-fsync"])
def stack(tmp_path_factory, request):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    engine_thread = ServerThread(ScriptedEngine(model, lambda prompt: "ok").application).start()
    config = proxy_config(model, tmp_path_factory.mktemp("records"), {"e0": engine_thread.url}, fsync=request.param,
                          limits=Limits(record_write_timeout_s=TIMEOUT_S))
    proxy_thread, server = start_proxy(config)
    yield {"url": proxy_thread.url, "server": server}
    proxy_thread.stop()
    engine_thread.stop()


def request(url: str, path: str, body: dict | None = None, key: str = "key-a") -> tuple[int, dict, float]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"x-api-key": key, "content-type": "application/json"}
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data, headers=headers), timeout=20) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - start
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), time.perf_counter() - start


CALL = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_a_stalled_disk_fails_only_the_calls_it_holds_and_within_the_timeout(stack):
    recorder = stack["server"].recorder
    # the seam every record passes: the commit journal's write, or without fsync the log's append
    group = recorder.group.journal if recorder.group is not None else recorder.store
    outcome: dict = {}
    caller = threading.Thread(target=lambda: outcome.update(call=request(stack["url"], "/v1/messages", CALL)))
    with held(group, "append") as (stalled, release):
        caller.start()
        assert stalled.wait(10), "the call never reached the records disk"
        status, body, elapsed = request(stack["url"], "/")
        assert status == 200 and elapsed < 0.4, f"GET / waited {elapsed:.2f} s for the stalled disk"
        caller.join(10)
        assert not caller.is_alive(), "the stalled call was never answered"
        status, body, elapsed = outcome["call"]
        assert status == 503 and body["type"] == "error", body
        assert "did not finish writing" in body["error"]["message"]
        assert TIMEOUT_S * 0.8 <= elapsed < TIMEOUT_S + 3, elapsed
    status, body, _ = request(stack["url"], "/v1/messages", CALL)
    assert status == 200, body
    deadline = time.time() + 10
    while stack["server"].recorder.state("exec-a").requests < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert stack["server"].recorder.state("exec-a").requests == 2  # the stalled record landed, and joined
    assert len(stack["server"].recorder.store.read("exec-a")) == 2
