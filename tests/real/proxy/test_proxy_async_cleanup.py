"""Every async generator of a model call is closed by the code that opened it, in every API.

An async generator abandoned unfinished is closed by the event loop's finalizer
hook instead: when the garbage collector frees it, the hook schedules a task
to run its ``aclose`` (a wake-up of the loop and a task per call; its
``finally`` blocks then run late, in another task). The proxy closes its own
(``contextlib.aclosing``), so a call leaves nothing to the hook. The check
counts the hook's calls on the proxy's loop around real calls through a
scripted engine: Anthropic, OpenAI Chat and Responses, streaming or not,
tool calls included.
"""

from __future__ import annotations

import gc
import json
import urllib.request

import pytest

try:
    from proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir,
                                tool_loop_script)
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir,
                                 tool_loop_script)

pytestmark = pytest.mark.timeout(120)

CALLS = [
    ("/v1/messages", {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "run it"}]}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "run it"}]}),
    ("/v1/responses", {"model": "m", "max_output_tokens": 40, "input": "run it"}),
]


def call(url: str, path: str, body: dict, key: str) -> bytes:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", "x-api-key": key,
                                              "authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return response.read()


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path, body", CALLS, ids=["anthropic", "chat", "responses"])
def test_a_model_call_leaves_no_async_generator_to_the_loops_finalizer(tmp_path_factory, tmp_path, path, body,
                                                                       stream):
    from gyre.real.proxy.app import ProxyServer

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    engine_thread = ServerThread(ScriptedEngine(model, tool_loop_script()).application).start()
    config = proxy_config(model, tmp_path / "records", {"e0": engine_thread.url}, fsync=True)
    holder = {}

    def make_app():
        holder["server"] = ProxyServer(config)
        return holder["server"].application()

    proxy = ServerThread(make_app)
    finalized: list[str] = []
    hook = proxy.loop._asyncgen_finalizer_hook  # installed by run_forever, so wrap it before the start

    def counting_hook(agen):
        finalized.append(getattr(agen, "__qualname__", repr(agen)))
        hook(agen)

    proxy.loop._asyncgen_finalizer_hook = counting_hook
    proxy.start()
    try:
        for _ in range(3):  # a tool call, its result, the final answer: three turns of one execution
            answer = call(proxy.url, path, dict(body, stream=stream), "key-a")
            assert answer
            proxy.call(_collect())  # collect on the proxy's loop: an abandoned generator is freed now
        assert holder["server"].recorder.commit_stats()["records"] == 3
    finally:
        proxy.stop()
        engine_thread.stop()
    assert finalized == [], finalized


async def _collect() -> None:
    gc.collect()
