"""Nothing slow on the event loop: listing 200 executions on disk, and a long execution's first
call after a restart (its log replayed), leave other calls undelayed.

``GET /admin/executions`` replayed every log on the event loop after a restart (172 executions:
974 ms during which every model call waited). Now logs not loaded are counted (frames checked,
not decoded) on a worker thread, and a first replay runs on a worker too. Measured here as the
event loop's longest stall while the listing runs (a 5 ms ticker on the proxy's loop), beside a
model call of another execution made at the same time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import urllib.request

import pytest

try:
    from proxy_fixtures import (ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, proxy_config,
                                shared_tiny_dir, start_proxy)
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, admin, build_tiny_tokenizer,  # noqa: F401
                                 proxy_config, shared_tiny_dir, start_proxy)

from gyre.real.store.tito_log import ExecutionStore

pytestmark = pytest.mark.timeout(180)
EXECUTIONS = 200
CALLS_EACH = 40
STALL_BOUND_S = 0.25  # a listing that replays 200 x 40 records on the loop stalls it for seconds


def call(url: str, key: str, history: list) -> str:
    body = json.dumps({"model": "m", "max_tokens": 16, "messages": history}).encode()
    request = urllib.request.Request(url + "/v1/messages", data=body, method="POST",
                                     headers={"x-api-key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["content"][0]["text"]


async def longest_stall(stop: threading.Event) -> float:
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        worst, last = max(worst, now - last - 0.005), now
    return worst


def test_listing_200_executions_does_not_stall_the_event_loop(tmp_path_factory, tmp_path):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    records = tmp_path / "records"
    with ServerThread(ScriptedEngine(model, lambda prompt: "Fine, next.").application) as engine:
        config = proxy_config(model, records, {"e0": engine.url})
        proxy, _ = start_proxy(config)
        history: list = []
        for turn in range(CALLS_EACH):  # one long execution, copied under 200 names below
            history.append({"role": "user", "content": f"step {turn}"})
            history.append({"role": "assistant", "content": call(proxy.url, "key-a", history)})
        proxy.stop()
        store = ExecutionStore(records)
        calls = store.read("exec-a")
        for n in range(EXECUTIONS):  # the same calls under 200 execution ids
            for recorded in calls:
                store.append(dataclasses.replace(recorded, execution_id=f"copy-{n}"))
        store.close()
        proxy, _ = start_proxy(config)  # a restart: nothing loaded
        try:
            stop = threading.Event()
            ticker = asyncio.run_coroutine_threadsafe(longest_stall(stop), proxy.loop)
            time.sleep(0.05)
            started = time.perf_counter()
            status, listing = admin(proxy.url, "GET", "/admin/executions")
            listed_s = time.perf_counter() - started
            answer = call(proxy.url, "key-b", [{"role": "user", "content": "hi"}])
            _, minted = admin(proxy.url, "POST", "/admin/executions", {"execution_id": "copy-5"})
            resumed = call(proxy.url, minted["api_key"], history + [{"role": "user", "content": "more"}])
            stop.set()
            stall = ticker.result(10)
        finally:
            proxy.stop()
    assert status == 200 and answer == resumed == "Fine, next."
    rows = {row["execution_id"]: row["requests"] for row in listing["executions"]}
    assert len(rows) >= EXECUTIONS and rows["copy-7"] == CALLS_EACH == rows["exec-a"]
    print(f"listing {len(rows)} executions took {listed_s * 1e3:.0f} ms; longest event-loop stall "
          f"{stall * 1e3:.1f} ms")
    assert stall < STALL_BOUND_S, stall
