"""A client that half-closes its connection after sending a streaming request is served whole.

``shutdown(SHUT_WR)`` after the request (what some raw-socket clients do) used to end the
connection before any answer. Now the whole stream arrives, the connection closes after it,
and the call is recorded; a non-streaming call still counts the end of its client's input as a
disconnect (``proxy.app``: it cannot be told apart before the answer is written).
"""

from __future__ import annotations

import json
import socket

import pytest

try:
    from proxy_fixtures import ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir
    from proxy_fixtures import start_proxy
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config,  # noqa: F401
                                 shared_tiny_dir, start_proxy)

pytestmark = pytest.mark.timeout(60)
BODIES = {"/v1/messages": {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
          "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    engine = ScriptedEngine(model, lambda prompt: "one two three four five six", token_delay=0.01)
    engine_thread = ServerThread(engine.application).start()
    proxy_thread, server = start_proxy(proxy_config(model, tmp_path_factory.mktemp("records"),
                                                    {"e0": engine_thread.url}))
    yield {"port": proxy_thread.port, "server": server}
    proxy_thread.stop()
    engine_thread.stop()


def half_closed_call(port: int, path: str, body: dict) -> bytes:
    """Send the request, shut the sending side, read until the proxy closes the connection."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nx-api-key: key-a\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(data)}\r\n\r\n".encode() + data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_half_closed_streaming_client_gets_the_whole_stream(stack, path):
    before = stack["server"].recorder.state("exec-a").requests
    received = half_closed_call(stack["port"], path, dict(BODIES[path], stream=True))
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    text = received.decode()
    assert "one two three four five six" in "".join(
        json.loads(line[6:]).get("delta", {}).get("text", "") or
        (json.loads(line[6:]).get("choices") or [{}])[0].get("delta", {}).get("content", "") or ""
        for line in text.split("\n") if line.startswith("data: {"))
    assert stack["server"].recorder.state("exec-a").requests == before + 1
