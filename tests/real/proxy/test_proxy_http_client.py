"""The proxy's engine-side HTTP client (``real/proxy/http_client.py``), against real sockets.

Each invariant of the module is checked here: chunked decoding under any split
(Hypothesis), connection reuse only after a whole response, the one resend on a
reused connection the server closed idle, ``close()`` aborting a waiting read,
the per-wait read timeout, and every failure as ``HttpError``. The servers are
raw asyncio servers on 127.0.0.1 scripted per test, so each can misbehave
exactly as the test needs; the same client against real SGLang and the scripted
aiohttp engine is exercised by every proxy test (``test_proxy_sglang.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.proxy.http_client import INITIAL_BUFFER, PAUSE_BYTES, HttpClient, HttpError, _Connection, _Dechunker

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def _chunked(body: bytes, sizes: list[int], extension: bool) -> bytes:
    out, at = bytearray(), 0
    for size in sizes:
        piece = body[at:at + size]
        if not piece:
            break
        out += f"{len(piece):x}{';ext=1' if extension else ''}\r\n".encode() + piece + b"\r\n"
        at += len(piece)
    if at < len(body):
        out += f"{len(body) - at:X}\r\n".encode() + body[at:] + b"\r\n"
    return bytes(out + b"0\r\nX-Trailer: 1\r\n\r\n")


def _receive(conn: _Connection, data: bytes) -> None:
    """Hand ``data`` to ``conn`` as the event loop would: through ``get_buffer`` / ``buffer_updated``."""
    at = 0
    while at < len(data):
        view = conn.get_buffer(-1)
        n = min(len(view), len(data) - at)
        view[:n] = data[at:at + n]
        conn.buffer_updated(n)
        at += n


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), sizes=st.lists(st.integers(1, 40), max_size=12),
       cuts=st.lists(st.integers(1, 30), max_size=40), reads=st.lists(st.integers(0, 50), max_size=40),
       extension=st.booleans(), tail=st.binary(max_size=5))
def test_dechunking_is_exact_under_any_split(body, sizes, cuts, reads, extension, tail) -> None:
    """However the wire bytes arrive and however much of the body the reader consumes between
    reads (decoded body left waiting while the next chunk arrives is moved, not lost), the decoded
    body is exact, the end is found, and the bytes after the end (the next response) stay received."""
    wire = _chunked(body, sizes, extension) + tail
    decoder, conn, out, at = _Dechunker(), _Connection(asyncio.new_event_loop()), bytearray(), 0
    for n, cut in enumerate([*cuts, len(wire)]):
        _receive(conn, wire[at:at + cut])
        at += cut
        decoder.take(conn)
        assert conn.start <= conn.body_end <= conn.raw <= conn.end
        taken = min(reads[n] if n < len(reads) else 0, conn.body_end - conn.start)
        out += conn.buf[conn.start:conn.start + taken]
        conn.start += taken
        if decoder.done:
            break
    _receive(conn, wire[at:])
    decoder.take(conn)
    out += conn.buf[conn.start:conn.body_end]
    assert decoder.done and bytes(out) == body and bytes(conn.buf[conn.raw:conn.end]) == tail


def test_a_long_body_grows_the_buffer_and_a_pooled_connection_gives_it_back() -> None:
    """A chunk many times the initial buffer is received whole in a grown buffer; ``reset``
    between responses returns to the initial size."""
    body = bytes(range(256)) * 4096  # 1 MiB
    conn, decoder = _Connection(asyncio.new_event_loop()), _Dechunker()
    _receive(conn, _chunked(body, [len(body)], False))
    decoder.take(conn)
    assert decoder.done and bytes(conn.buf[conn.start:conn.body_end]) == body
    assert len(conn.buf) > len(body)
    conn.reset()
    assert len(conn.buf) == INITIAL_BUFFER and conn.end == 0


def test_each_chunk_read_after_the_last_was_consumed_lands_at_the_front() -> None:
    """A cumulative engine's chunks grow to hundreds of KB; each arrives after the reader consumed
    the last one, whose framing (``\\r\\n`` after its data) is decoded but not body. Nothing is kept
    then, so the next chunk is read at the buffer's front, never placed after the last one and
    moved to the front later: no byte is moved within the buffer, which grows only to fit a chunk."""
    conn, decoder, moved = _Connection(asyncio.new_event_loop()), _Dechunker(), 0
    make_room = conn._make_room

    def counting_make_room() -> None:  # bytes moved within the buffer (a grown one is a copy, once)
        nonlocal moved
        kept, buffer = conn.end - conn.start, conn.buf
        make_room()
        moved += kept if conn.buf is buffer else 0

    conn._make_room = counting_make_room  # type: ignore[method-assign]
    for k in range(1, 40):
        event = b"data: " + b"7," * (3000 * k) + b"\n\n"
        _receive(conn, b"%x\r\n%s\r\n" % (len(event), event))
        decoder.take(conn)
        assert bytes(conn.buf[conn.start:conn.body_end]) == event
        conn.start = conn.body_end  # the reader consumed the event
    assert moved == 0
    assert len(conn.buf) < 4 * len(event)


@pytest.mark.parametrize("wire", [b"zz\r\n", b"-1\r\n", b"+5\r\nhello\r\n", b"3\r\nabcdef\r\n",
                                  b"1" * 5000])
def test_a_malformed_chunked_body_is_an_http_error(wire) -> None:
    conn = _Connection(asyncio.new_event_loop())
    _receive(conn, wire)
    with pytest.raises(HttpError, match="malformed chunked body"):
        _Dechunker().take(conn)


class Server:
    """A raw HTTP server on 127.0.0.1: ``handler(reader, writer, connection_number)`` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.requests = handler, 0, 0
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                    await self.handler(reader, writer, self.connections)
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        self.requests += 1
        return await reader.readexactly(length)

    async def reply(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes) -> bytes:
        """Read one request, send ``answer``; returns the request's body."""
        body = await self.read_request(reader)
        writer.write(answer)
        await writer.drain()
        return body


def _ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def run(coro: Awaitable) -> object:
    return asyncio.run(coro)


def test_a_connection_is_reused_only_after_its_whole_response() -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            while True:
                body = await server.read_request(reader)
                if body == b"stream":  # chunked, sent whole
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
                else:
                    writer.write(_ok(b"echo:" + body))
                await writer.drain()

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            for i in range(3):
                async with await client.request("POST", url + "/x", f"r{i}".encode()) as resp:
                    assert resp.status == 200 and await resp.read() == f"echo:r{i}".encode()
            async with await client.request("POST", url + "/x", b"stream") as resp:
                assert await resp.read() == b"hello"
            assert server.connections == 1  # four requests, one connection
            resp = await client.request("POST", url + "/x", b"stream")
            resp.close()  # not read to its end: the connection is dropped, not pooled
            async with await client.request("POST", url + "/x", b"again") as resp:
                assert await resp.read() == b"echo:again"
            assert server.connections == 2
            await client.close()

    run(main())


def test_a_reused_connection_closed_by_the_server_is_resent_once_on_a_new_one() -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.reply(reader, writer, _ok(b"first"))
            if n == 1:  # the next request on this connection is read, then the connection closes unanswered
                await server.read_request(reader)
                return
            while True:
                await server.reply(reader, writer, _ok(b"fresh"))

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            async with await client.request("POST", url, b"a") as resp:
                assert await resp.read() == b"first"
            async with await client.request("POST", url, b"b") as resp:
                assert await resp.read() == b"first"  # answered by the second connection's first reply
            assert server.connections == 2
            await client.close()

    run(main())


def test_a_fresh_connection_that_closes_unanswered_is_an_error_not_a_resend() -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.read_request(reader)

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            with pytest.raises(HttpError, match="closed"):
                await client.request("POST", url, b"a")
            assert server.connections == 1 and server.requests == 1
            await client.close()

    run(main())


def test_close_aborts_a_waiting_read_and_every_later_one() -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.reply(reader, writer, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await asyncio.sleep(30)

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 60.0)
            resp = await client.request("POST", url, b"")
            pieces = resp.iter_any()
            assert await pieces.__anext__() == b"abc"
            waiting = asyncio.ensure_future(pieces.__anext__())
            await asyncio.sleep(0.05)
            loop = asyncio.get_running_loop()
            start = loop.time()
            resp.close()
            with pytest.raises(HttpError, match="response closed"):
                await waiting
            assert loop.time() - start < 1.0
            with pytest.raises(HttpError):
                await resp.read()
            await client.close()

    run(main())


async def _whole_then_read_timeout(url: str) -> None:
    """Two calls through a client whose read timeout is 0.3 s: the first response is read whole (``xxxxxx``),
    the second, which stalls, ends in a read timeout."""
    client = HttpClient(1.0, 0.3)
    async with await client.request("POST", url, b"") as resp:
        assert await resp.read() == b"xxxxxx"
    async with await client.request("POST", url, b"") as resp:
        with pytest.raises(HttpError, match="read timeout"):
            await resp.read()
    await client.close()


def test_the_read_timeout_bounds_each_wait_not_the_whole_response(monkeypatch) -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(6):  # 0.6 s in all, never 0.3 s without a byte
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
                await asyncio.sleep(0.1)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")  # then silence
            await writer.drain()
            await asyncio.sleep(30)

        server = Server(handler)
        async with server as url:
            await _whole_then_read_timeout(url)

    run(main())


def test_a_long_chunk_that_keeps_arriving_does_not_time_out_and_one_that_stalls_does() -> None:
    """The reader waits for a whole chunk (one wake-up), yet the timeout still bounds each wait for bytes."""
    async def main() -> None:
        async def handler(reader, writer, n):
            for stall in (False, True):
                await server.read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n")
                for _ in range(3 if stall else 6):  # 0.6 s for the chunk, never 0.3 s without a byte
                    writer.write(b"x")
                    await writer.drain()
                    await asyncio.sleep(0.1)
                if stall:
                    await asyncio.sleep(30)
                writer.write(b"\r\n0\r\n\r\n")
                await writer.drain()

        server = Server(handler)
        async with server as url:
            await _whole_then_read_timeout(url)

    run(main())


@pytest.mark.parametrize("answer, match", [
    (b"SPDY/9 200 OK\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "cut short"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "cut short"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (70 * 1024), "head over"),
])
def test_a_broken_answer_is_an_http_error_naming_it(answer, match) -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.reply(reader, writer, answer)

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            with pytest.raises(HttpError, match=match):
                async with await client.request("POST", url, b"") as resp:
                    await resp.read()
            await client.close()

    run(main())


def test_interim_heads_are_skipped_and_a_close_delimited_body_is_read_to_the_end() -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.reply(reader, writer,
                               b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nConnection: close\r\n\r\nlater")

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            async with await client.request("POST", url, b"") as resp:
                assert resp.status == 503 and await resp.text() == "later"
            await client.close()

    run(main())


def test_a_refused_connection_and_a_non_http_url_are_http_errors() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        client = HttpClient(1.0, 5.0)
        with pytest.raises(HttpError, match=f"cannot connect to 127.0.0.1:{port}"):
            await client.request("POST", f"http://127.0.0.1:{port}/generate", b"")
        with pytest.raises(HttpError, match="not an http"):
            await client.request("GET", "ftp://127.0.0.1/x")
        await client.close()
        with pytest.raises(HttpError, match="client closed"):
            await client.request("GET", "http://127.0.0.1:1/")

    run(main())


def test_an_idle_connection_is_not_reused_after_idle_s() -> None:
    async def main() -> None:
        async def handler(reader, writer, n):
            while True:
                await server.reply(reader, writer, _ok(b"ok"))

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0, idle_s=0.1)
            for pause in (0.0, 0.0, 0.25):
                await asyncio.sleep(pause)
                async with await client.request("GET", url) as resp:
                    assert await resp.read() == b"ok"
            assert server.connections == 2  # the third request found its connection idle too long
            await client.close()

    run(main())


async def _steps(resp, steps: list[bytes] | None = None) -> list[bytes]:
    """The body as ``iter_in_place`` hands it over: one entry per step, each consumed at once, appended to
    ``steps`` (a new list by default: a caller's own keeps what came before an error)."""
    steps = [] if steps is None else steps
    async for _ in resp.iter_in_place():
        steps.append(bytes(resp.buffer[resp.body_start:resp.body_end]))
        resp.consume(resp.body_end - resp.body_start)
    return steps


def test_a_chunk_cut_into_two_reads_at_any_byte_is_handed_over_in_one_step() -> None:
    """A long chunk of a cumulative engine often comes in more than one read; the reader is woken
    once, with the whole chunk, wherever the wire is cut (in the size line, the data, the CR LF)."""
    data = bytes(range(48, 78))
    wire = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)

    async def main() -> None:
        async def handler(reader, writer, n):
            for cut in range(1, len(wire)):
                await server.read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)  # the client reads the head, then waits for the chunk
                writer.write(wire[:cut])
                await writer.drain()
                await asyncio.sleep(0.01)  # the client reads the first part on its own
                writer.write(wire[cut:])
                await writer.drain()

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            for cut in range(1, len(wire)):
                async with await client.request("POST", url, b"") as resp:
                    waits = _count_waits(resp)
                    assert await _steps(resp) == [data], cut
                    # the size line, once here, says how much to wait for: one wake-up for the chunk
                    # (a cut after its data: the rest is a second wait, for the last chunk)
                    assert len(waits) == (1 if cut < len(wire) - len(b"\r\n0\r\n\r\n") else 2), (cut, waits)
            await client.close()

    run(main())


def _count_waits(resp) -> list[int]:
    """Each time the reader of ``resp`` waits for bytes, appended to the returned list."""
    conn, waits = resp._conn, []
    more = conn.more

    async def counting_more(*args, **kwargs):
        waits.append(conn.end)
        await more(*args, **kwargs)

    conn.more = counting_more
    return waits


def test_a_chunk_over_pause_bytes_is_handed_over_in_pieces_and_exact() -> None:
    """Holding a chunk until it is whole stops at ``PAUSE_BYTES``: a huge chunk reaches the reader
    in pieces (memory stays bounded when the reader consumes them), and the bytes are exact."""
    data = bytes(range(256)) * (PAUSE_BYTES // 256 * 3 // 2 + 1000)

    async def main() -> None:
        async def handler(reader, writer, n):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % len(data))
            for at in range(0, len(data), 1 << 18):
                writer.write(data[at:at + (1 << 18)])
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"\r\n0\r\n\r\n")
            await writer.drain()

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            async with await client.request("POST", url, b"") as resp:
                steps = await _steps(resp)
            assert len(steps) > 1 and max(map(len, steps)) < len(data) and b"".join(steps) == data
            await client.close()

    run(main())


def test_the_part_of_a_chunk_received_before_the_connection_ends_is_handed_over_then_an_error() -> None:
    """A chunk is held until whole only while more can come: cut short, what arrived is handed over
    (the events it completes still count), then the cut is an ``HttpError``."""
    async def main() -> None:
        async def handler(reader, writer, n):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"cd")
            await writer.drain()

        server = Server(handler)
        async with server as url:
            client = HttpClient(1.0, 5.0)
            steps: list[bytes] = []
            async with await client.request("POST", url, b"") as resp:
                with pytest.raises(HttpError, match="cut short"):
                    await _steps(resp, steps)
            assert b"".join(steps) == b"abcd"
            await client.close()

    run(main())
