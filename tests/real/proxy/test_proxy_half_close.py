"""A client that half-closes its connection after sending its request is served whole.

``shutdown(SHUT_WR)`` after the request (what some raw-socket clients do) used to end the
connection before any answer. Now the whole stream, or the whole non-streaming answer (after
the interim ``100 Continue`` probes ``proxy.app.ClientWatch`` sends), arrives, the connection
closes after it, and the call is recorded. A client that closes for good after half-closing is
still found gone: its engine request is aborted and nothing is recorded.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time

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
    yield {"port": proxy_thread.port, "server": server, "engine": engine}
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


@contextlib.contextmanager
def slow_engine(engine, token_delay: float):
    """Tokens slower than the proxy's disconnect polls, so a call lasts long enough to be probed."""
    before, engine.token_delay = engine.token_delay, token_delay
    try:
        yield engine
    finally:
        engine.token_delay = before


def strip_interim(received: bytes) -> tuple[int, bytes]:
    """(number of ``100 Continue`` interim answers, the rest)."""
    probes = 0
    while received.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        probes, received = probes + 1, received[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
    return probes, received


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_half_closed_non_streaming_client_gets_its_answer(stack, path):
    before = stack["server"].recorder.state("exec-a").requests
    with slow_engine(stack["engine"], 0.05):
        probes, received = strip_interim(half_closed_call(stack["port"], path, BODIES[path]))
    assert probes >= 1, "the call ended before the proxy probed its half-closed client"
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    answer = json.loads(received.split(b"\r\n\r\n", 1)[1])
    text = (answer["content"][0]["text"] if path == "/v1/messages"
            else answer["choices"][0]["message"]["content"])
    assert text == "one two three four five six"
    assert stack["server"].recorder.state("exec-a").requests == before + 1


def test_a_client_that_closes_after_half_closing_is_found_gone(stack):
    engine, before = stack["engine"], stack["server"].recorder.state("exec-a").requests
    aborted = len(engine.aborted)
    data = json.dumps(BODIES["/v1/messages"]).encode()
    with slow_engine(engine, 0.3):
        sock = socket.create_connection(("127.0.0.1", stack["port"]), timeout=30)
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: key-a\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
        sock.shutdown(socket.SHUT_WR)
        time.sleep(0.4)  # generating, half-closed (probed once)
        sock.close()
        deadline = time.time() + 10
        while len(engine.aborted) == aborted and time.time() < deadline:
            time.sleep(0.05)
    assert len(engine.aborted) > aborted, "the engine request of a closed client was not aborted"
    time.sleep(0.2)
    assert stack["server"].recorder.state("exec-a").requests == before
