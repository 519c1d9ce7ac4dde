"""A streaming client that stops reading is cut off after ``limits.client_write_timeout_s``.

An engine speaking SGLang's ``/generate`` contract (incremental lists, so a
long answer costs linear time) answers with 20,000 long tokens; a raw-socket client
with a tiny receive buffer sends a streaming call, reads the response head and
then stops reading. Once the socket buffers are full the proxy's writes stall;
after the write timeout the proxy aborts the connection and the engine
request, records nothing for the call, and keeps serving other clients (whose
calls are recorded).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

try:
    from proxy_fixtures import ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir, start_proxy
except ImportError:
    from .proxy_fixtures import ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir, start_proxy

LONG_TOKENS, PER_CHUNK = 20_000, 50


class LongEngine:
    """``/generate``: a long answer of one long token (incremental lists) unless at most 16 tokens
    are asked for (then ``short`` and the stop token); ``/abort_request`` records the rid."""

    def __init__(self, long_id: int, short: list[int]) -> None:
        self.long_id, self.short = long_id, short
        self.aborted: list[str] = []
        self.sent = 0

    def application(self):
        from aiohttp import web

        app = web.Application()
        app.add_routes([web.post("/generate", self.generate), web.post("/abort_request", self.abort)])
        return app

    async def abort(self, request):
        from aiohttp import web

        self.aborted.append((await request.json())["rid"])
        return web.json_response({})

    async def generate(self, request):
        import asyncio

        from aiohttp import web

        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if body["sampling_params"]["max_new_tokens"] <= 16:
            chunks = [(self.short, {"type": "stop"})]
        else:
            chunks = [([self.long_id] * PER_CHUNK, None) for _ in range(LONG_TOKENS // PER_CHUNK)]
            chunks[-1] = (chunks[-1][0], {"type": "length", "length": LONG_TOKENS})
        total = 0
        for ids, finish in chunks:
            total += len(ids)
            meta = {"output_token_logprobs": [[-0.5, i, ""] for i in ids], "completion_tokens": total,
                    "finish_reason": finish}
            await response.write(b"data: " + json.dumps({"output_ids": ids, "meta_info": meta}).encode() + b"\n\n")
            self.sent = total
            await asyncio.sleep(0.001)
        await response.write(b"data: [DONE]\n\n")
        return response


def stalled_client(port: int, body: dict) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: key-a\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(payload)}\r\n\r\n".encode() + payload)
    head = sock.recv(512)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def drain(sock: socket.socket, timeout: float = 20.0) -> bytes:
    """Everything the server still sends until it closes (or resets) the connection."""
    sock.settimeout(timeout)
    chunks = []
    try:
        while data := sock.recv(65536):
            chunks.append(data)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


@pytest.mark.timeout(120)
def test_a_client_that_stops_reading_is_cut_off_and_its_engine_request_aborted(tmp_path_factory, tmp_path):
    from gyre.real.proxy.config import Limits
    from gyre.real.store.tito_log import ExecutionStore

    from gyre.real.proxy.tokenize import ChatTokenizer

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    chat = ChatTokenizer(str(model))
    long_id = chat.encode("abcdefghijklmnopqrstuvwxyz")
    assert len(long_id) == 1
    engine = LongEngine(long_id[0], chat.encode("short answer") + [chat.stop_token_ids[0]])
    with ServerThread(engine.application) as engine_thread:
        config = proxy_config(model, tmp_path / "records", {"e0": engine_thread.url}, fsync=True,
                              limits=Limits(client_write_timeout_s=1.0))
        proxy_thread, server = start_proxy(config, chat)
        try:
            body = {"model": "m", "max_tokens": LONG_TOKENS, "stream": True,
                    "messages": [{"role": "user", "content": "long please"}]}
            sock = stalled_client(proxy_thread.port, body)
            deadline = time.time() + 30
            while not engine.aborted and time.time() < deadline:
                time.sleep(0.1)
            assert engine.aborted, "the engine request of the stalled stream was not aborted"
            assert time.time() < deadline
            rest = drain(sock)
            sock.close()
            assert b"message_stop" not in rest  # cut off, never completed
            import urllib.request

            request = urllib.request.Request(
                proxy_thread.url + "/v1/messages", method="POST",
                data=json.dumps({"model": "m", "max_tokens": 16,
                                 "messages": [{"role": "user", "content": "hi"}]}).encode(),
                headers={"x-api-key": "key-b", "content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.loads(response.read())
            assert answer["content"][0]["text"] == "short answer"
        finally:
            proxy_thread.stop()
    store = ExecutionStore(tmp_path / "records")
    assert store.executions() == ["exec-b"]  # the stalled call left no record
    assert [r.request_id for r in store.read("exec-b")] == [answer["id"].removeprefix("msg_")]
