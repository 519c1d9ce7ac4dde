"""A stream's last step goes out with its end, once the record is durable (``proxy.app``, ``proxy.model_call``).

The engine sends the whole answer in one chunk that carries its finish reason, so every event of the
answer belongs to the generation's last step. The commit journal's write (the seam every durable
record passes) is held: the record was handed to the writer, and the client has received nothing,
not even the response head; once the write is released, the whole stream arrives, intact. The same
with only the journal's sync held, after the record was written: a written record is not a durable one.
"""

from __future__ import annotations

import json
import socket

import pytest

from gyre.real.store.durable import Disk

try:
    from held_calls import held
    from proxy_fixtures import build_tiny_tokenizer, parse_sse, scripted_proxy_stack, shared_tiny_dir
except ImportError:
    from ..held_calls import held
    from .proxy_fixtures import build_tiny_tokenizer, parse_sse, scripted_proxy_stack, shared_tiny_dir

pytestmark = pytest.mark.timeout(60)
ANSWER = "all of it in one chunk"


@pytest.fixture()
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    with scripted_proxy_stack(model, lambda prompt: ANSWER, tmp_path_factory.mktemp("records"),
                              {"chunk_tokens": 1000}, fsync=True) as stack:
        yield stack


def _send_stream_request(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "max_tokens": 64, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: key-a\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _dechunk(body: bytes) -> bytes:
    out, at = b"", 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if not size:
            return out
        out += body[end + 2:end + 2 + size]
        at = end + 2 + size + 2


@pytest.mark.parametrize("seam", ["append", "fdatasync"])
def test_the_last_step_is_held_until_the_record_is_durable_then_sent_whole(stack, seam):
    journal = stack["server"].recorder.group.journal
    journal.disk = Disk()  # this journal's own syncs (``held`` replaces a method of this object only)
    with held(journal if seam == "append" else journal.disk, seam) as (reached, release):
        sock = _send_stream_request(stack["url"])
        try:
            assert reached.wait(10), "the record never reached the commit journal"
            sock.settimeout(0.3)
            with pytest.raises(socket.timeout):
                early = sock.recv(65536)
                pytest.fail(f"sent before the record was durable: {early[:200]!r}")
            release.set()
            sock.settimeout(10)
            raw = _read_all(sock)
        finally:
            sock.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    events = parse_sse(_dechunk(body))
    assert [name for name, _ in events][0] == "message_start" and events[-1][0] == "message_stop"
    text = "".join(data["delta"].get("text", "") for name, data in events if name == "content_block_delta")
    assert text == ANSWER
