"""A lean HTTP/1.1 client for the proxy's engine calls: a keep-alive pool and streamed bodies.

Why not aiohttp's client: the proxy sends every model call to an engine, and at
64 concurrent executions aiohttp's client request machinery (request and
response objects, timer contexts, header multidicts) was about a fifth of the
proxy's CPU per call (py-spy, ``bench/bench_proxy.py``). Engines speak a small,
fixed subset of HTTP, and this module speaks exactly that subset over one
``asyncio.Protocol`` per connection:

- requests: one line, ``Host``, the given headers and a ``Content-Length`` body;
- responses: a status line and headers, then a body delimited by
  ``Content-Length``, by the chunked transfer coding (what SGLang's uvicorn
  streams), or by the end of the connection; ``1xx`` heads are skipped;
- ``http://`` and ``https://`` (the system's default TLS context).

Each connection is an ``asyncio.BufferedProtocol``: the event loop reads
straight into the connection's one receive buffer, the chunked coding is
decoded where the bytes lie, and ``Response.iter_in_place`` hands the reader
the body there. So a received byte is copied once, by the kernel, and a
reader waiting inside a chunk is woken once the chunk is whole (or reading
pauses), not on every read: a cumulative engine's stream, whose bytes grow
quadratically with the output, costs the proxy no per-byte work beyond the
kernel's copy and the reader's one-byte searches.

Invariants:
- every failure (refused, reset, closed early, a timeout, a malformed head or
  chunk) raises ``HttpError``, which is a ``ConnectionError``;
- a connection goes back to the pool only after its whole response was read and
  neither side said ``Connection: close``; an idle pooled connection is dropped
  after ``idle_s`` (``IDLE_S`` by default), below the 5 s keep-alive of uvicorn (SGLang's
  ``SGLANG_TIMEOUT_KEEP_ALIVE`` default), so the pool never hands out one the
  server is about to close;
- a request sent on a reused connection that ends before the first byte of an
  answer is sent once more on a new connection (the server closed it idle and
  never read the request); a fresh connection is never retried;
- ``Response.close()`` aborts the connection at once: a read waiting on it and
  every later read raise ``HttpError``;
- ``read_timeout_s`` bounds each wait for bytes (aiohttp's ``sock_read``), not
  the whole response: a long generation that keeps streaming never times out,
  nor does a long chunk that keeps arriving;
- a chunk's data reaches ``iter_in_place``'s reader in one step once the chunk is whole, however
  many reads brought it (in pieces only past ``PAUSE_BYTES``, or when the connection ends first),
  and a reader waiting for a chunk is woken once for it: the read callback reads the size line
  and waits for the data too (a malformed or last chunk wakes the reader, which decodes it);
- the body read in place is ``buffer[body_start:body_end]`` until ``consume``d;
  decoded body bytes are never lost or reordered, however the wire is cut into
  reads and the body into chunks, and the bytes after a response's end stay
  unread for the next one.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from typing import AsyncGenerator
from urllib.parse import urlsplit

IDLE_S = 4.0
MAX_HEAD_BYTES = 64 * 1024
TARGETS = 256  # URLs whose split a client keeps (``HttpClient._target``)
PAUSE_BYTES = 1 << 20  # stop reading the socket while this much is received and not yet decoded
INITIAL_BUFFER = 64 * 1024  # a connection's receive buffer; it grows for long events, shrinks when pooled
MIN_READ = 32 * 1024  # free space offered to each read of the socket
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: .*)?")


class HttpError(ConnectionError):
    """An HTTP exchange with an engine failed; the message names how."""


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection: the event loop reads straight into its receive buffer (``get_buffer``),
    and it wakes the one reader waiting for bytes.

    The buffer holds, in order: the response body decoded and not yet consumed
    (``buf[start:body_end]``), bytes of the transfer coding already decoded (a chunk's header:
    ``buf[body_end:raw]``), bytes not yet decoded (``buf[raw:end]``), free space. Each received
    byte is copied once, by the kernel; a chunk's data is decoded where it lies."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray(INITIAL_BUFFER)
        self.view = memoryview(self.buf)
        self.start = self.body_end = self.raw = self.end = 0
        self.ended = False          # EOF, connection lost, or aborted by us
        self.reason = "connection closed by the engine"
        self.idle_since = 0.0
        self.need = 1  # bytes to receive before the waiting reader is woken (the rest of a chunk)
        self.sized = False  # the reader waits for a chunk that begins at ``raw``: its size line sets ``need``
        self.last_read = 0.0  # when bytes last arrived without waking the reader
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.start == self.body_end and self.raw == self.end:
            # nothing kept (a chunk's decoded framing, between body_end and raw, is not kept):
            # read from the front, so a long event is not placed after the last one and moved
            self.start = self.body_end = self.raw = self.end = 0
        elif len(self.buf) - self.end < MIN_READ:
            self._make_room()
        return self.view[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        self.need -= nbytes
        if self.sized and self.need <= 0:
            self._need_chunk()
        if self.end - self.raw > PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
            self.need = 0  # the reader decodes what is here before reading resumes
        if self.need <= 0:
            self._wake()
        else:
            self.last_read = self.loop.time()

    def _need_chunk(self) -> None:
        """The reader waits for the chunk whose size line begins at ``raw``: once that line is here,
        wait for the chunk's data too (one wake-up for a chunk that comes in several reads). A line
        not yet whole waits for more; a malformed or last chunk wakes the reader, which decodes it."""
        line_end = self.buf.find(b"\r\n", self.raw, self.end)
        if line_end < 0:
            self.need = 1 if self.end - self.raw <= 4096 else 0
            return
        self.sized = False
        size = _chunk_size(self.buf[self.raw:line_end])
        if size:
            self.need = line_end + 2 + size - self.end

    def _make_room(self) -> None:
        """At least ``MIN_READ`` bytes free after ``end``: the kept bytes move to the front when
        the consumed space before them is at least as large as they are (so a move costs no more
        than the bytes received since the last one), else into a buffer at least twice as large."""
        kept, start = self.end - self.start, self.start
        if start >= kept and kept + MIN_READ <= len(self.buf):
            self.view[:kept] = self.view[start:self.end]
        else:
            size = len(self.buf)
            while size < 2 * (kept + MIN_READ):
                size *= 2
            buf = bytearray(size)
            buf[:kept] = self.view[start:self.end]
            self.buf, self.view = buf, memoryview(buf)
        self.start, self.body_end, self.raw, self.end = 0, self.body_end - start, self.raw - start, kept

    def reset(self) -> None:
        """Between two responses: nothing kept; a buffer grown for long events is given back."""
        self.start = self.body_end = self.raw = self.end = 0
        if len(self.buf) > 4 * INITIAL_BUFFER:
            self.buf = bytearray(INITIAL_BUFFER)
            self.view = memoryview(self.buf)

    def received(self) -> int:
        """Bytes received and not yet consumed (a decoded body's, or undecoded ones)."""
        return self.body_end - self.start + self.end - self.raw

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.ended:
            self.reason = f"{type(exc).__name__}: {exc}"
        self.ended = True
        self._wake()

    def abort(self, reason: str) -> None:
        if not self.ended:
            self.reason = reason
        self.ended = True
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def consumed(self) -> None:
        """The reader decoded bytes: resume reading once few are left undecoded."""
        if self._paused and self.end - self.raw < PAUSE_BYTES // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self, timeout: float, need: int = 1, sized: bool = False) -> None:
        """Wait until ``need`` more bytes arrive (fewer when reading pauses) or the connection ends;
        ``sized``: a chunk begins at ``raw``, wait for its data too; ``HttpError`` once no byte
        arrived for ``timeout`` s."""
        if self.ended:
            raise HttpError(self.reason)
        self.need, self.sized, self.last_read = need, sized, self.loop.time()
        waiter = self._waiter = self.loop.create_future()
        self._timer = self.loop.call_later(timeout, self._expire, waiter, timeout)
        try:
            await waiter
        finally:
            self._timer.cancel()
            self._waiter = self._timer = None
            self.need, self.sized = 1, False

    def _expire(self, waiter: asyncio.Future, timeout: float) -> None:
        if waiter.done():
            return
        quiet = self.loop.time() - self.last_read
        if quiet < timeout:  # bytes arrived meanwhile, short of what the reader waits for
            self._timer = self.loop.call_later(timeout - quiet, self._expire, waiter, timeout)
        else:
            waiter.set_exception(HttpError(f"no data from the engine for {timeout} s (read timeout)"))

    def reusable(self, now: float, idle_s: float = IDLE_S) -> bool:
        return not self.ended and self.end == self.start and now - self.idle_since < idle_s and \
            self.transport is not None and not self.transport.is_closing()


class _Dechunker:
    """Decodes the chunked transfer coding incrementally, in place in a connection's buffer."""

    def __init__(self) -> None:
        self.state = "size"
        self.remaining = 0

    @property
    def done(self) -> bool:
        return self.state == "done"

    def take(self, conn: _Connection) -> None:
        """Decode the bytes ``conn.buf[conn.raw:conn.end]`` up to the body's end or the first
        incomplete chunk line, extending the body ``buf[start:body_end]``. A chunk's data is
        moved only when decoded body is waiting before its header (an event cut into several
        chunks), and then whichever is shorter moves, so no byte moves more than its share."""
        while self.state != "done":
            if self.state == "data":
                n = min(self.remaining, conn.end - conn.raw)
                if not n:
                    break
                _take_data(conn, n)
                self.remaining -= n
                if not self.remaining:
                    self.state = "crlf"
                continue
            end = conn.buf.find(b"\r\n", conn.raw, conn.end)
            if end < 0:
                if conn.end - conn.raw > 4096:
                    raise HttpError("malformed chunked body: a chunk header line over 4 KB")
                break
            line = bytes(conn.view[conn.raw:end])
            conn.raw = end + 2
            if self.state == "crlf":
                if line:
                    raise HttpError("malformed chunked body: chunk data longer than its size")
                self.state = "size"
            elif self.state == "size":
                size = _chunk_size(line)
                if size is None:
                    raise HttpError(f"malformed chunked body: chunk size {line[:40]!r}")
                self.remaining = size
                self.state = "data" if self.remaining else "trailer"
                if self.remaining:
                    _close_gap(conn, self.remaining)
                    if conn.end - conn.raw >= size + 2 and conn.buf.startswith(b"\r\n", conn.raw + size):
                        # the whole chunk is here: its data and its line end taken in one step (what the
                        # "data" and "crlf" steps would do, one loop turn each)
                        _take_data(conn, size)
                        conn.raw += 2
                        self.remaining, self.state = 0, "size"
            elif not line:  # "trailer": header lines until an empty one
                self.state = "done"


def _take_data(conn: _Connection, n: int) -> None:
    """Append the next ``n`` received bytes to the body, moved only when decoded body waits elsewhere."""
    if conn.body_end != conn.raw:
        conn.view[conn.body_end:conn.body_end + n] = conn.view[conn.raw:conn.raw + n]
    conn.body_end += n
    conn.raw += n


def _chunk_size(line: bytes | bytearray) -> int | None:
    """The size a chunk's size line gives (extensions after ``;`` ignored), None when malformed."""
    if _CHUNK_SIZE.fullmatch(line):  # the usual bare size: no extension to cut, no space to strip
        return int(line, 16)
    digits = line.split(b";", 1)[0].strip()
    return int(digits, 16) if _CHUNK_SIZE.fullmatch(digits) else None


def _close_gap(conn: _Connection, size: int) -> None:
    """Before a chunk of ``size`` bytes: make the waiting body end where the chunk's data begins
    (nothing waiting: it starts there; a shorter body than the chunk: the body moves up to it)."""
    waiting = conn.body_end - conn.start
    if not waiting:
        conn.start = conn.body_end = conn.raw
    elif waiting < size:
        conn.view[conn.raw - waiting:conn.raw] = conn.view[conn.start:conn.body_end]
        conn.start, conn.body_end = conn.raw - waiting, conn.raw


class Response:
    """Status, headers and a body read as it arrives; an async context manager that frees the
    connection (back to the pool when read to its end, aborted otherwise)."""

    def __init__(self, client: HttpClient, key: tuple, conn: _Connection, status: int,
                 headers: dict[str, str], read_timeout_s: float, head_request: bool = False) -> None:
        self.status, self.headers = status, headers
        self._client, self._key, self._conn = client, key, conn
        self.read_timeout_s = read_timeout_s  # each wait for bytes; a caller may shorten it (a drain)
        self._keep = headers.get("connection", "").lower() != "close"
        self._chunks: _Dechunker | None = None
        self._left: int | None = None  # Content-Length still to read; None: until the end
        self._complete = head_request or status in (204, 304)
        if not self._complete:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._chunks = _Dechunker()
            elif "content-length" in headers:
                try:
                    self._left = int(headers["content-length"])
                except ValueError:
                    raise HttpError(f"malformed Content-Length {headers['content-length'][:40]!r}") from None
                self._complete = self._left == 0
            else:
                self._keep = False
        self._released = False
        if self._complete:
            self._release()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Abort the connection unless the response was read to its end (then it is pooled)."""
        if not self._released:
            self._released = True
            self._conn.abort("response closed")

    @property
    def buffer(self) -> bytearray:
        """The connection's receive buffer: the body read by ``iter_in_place`` lies in it at
        ``[body_start:body_end]`` (the buffer object may change between two steps)."""
        return self._conn.buf

    @property
    def body_start(self) -> int:
        return self._conn.start

    @property
    def body_end(self) -> int:
        return self._conn.body_end

    def consume(self, n: int) -> None:
        """The first ``n`` bytes of the body held in ``buffer`` are read: they may be overwritten."""
        self._conn.start += n

    async def iter_in_place(self) -> AsyncGenerator[int, None]:
        """The body as it arrives, left where the event loop read it: after each step,
        ``buffer[body_start:body_end]`` holds the body received and not yet consumed (``consume``);
        yields the number of bytes added, never 0. A chunk's data is yielded once the chunk is
        whole, not piece by piece as reads bring it (unless ``PAUSE_BYTES`` of it wait, or the
        connection ended): a chunk that arrives in several reads costs the reader one step."""
        conn, chunk, added = self._conn, self._chunks, 0
        while not self._complete:
            if self._released:
                raise HttpError("response closed")
            before = conn.body_end - conn.start
            self._take(conn)
            conn.consumed()
            added += conn.body_end - conn.start - before
            inside = chunk is not None and chunk.state == "data"  # the chunk's data is not all here
            if added and not (inside and added < PAUSE_BYTES and not conn.ended):
                yield added
                added = 0
                continue
            if self._complete:
                break
            if conn.ended:
                if self._left is None and self._chunks is None:
                    self._complete = True  # the body runs to the connection's end
                    break
                raise HttpError(f"response body cut short: {conn.reason}")
            await conn.more(self.read_timeout_s, chunk.remaining if inside else 1,  # type: ignore[union-attr]
                            chunk is not None and chunk.state == "size")
        self._release()

    async def iter_any(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they arrive (each piece is whatever the buffer held)."""
        out = bytearray()
        async for _ in self.iter_into(out):
            yield bytes(out)
            out.clear()

    async def iter_into(self, out: bytearray) -> AsyncGenerator[int, None]:
        """``iter_in_place`` copied out: each piece is appended to ``out``; yields its length."""
        conn = self._conn
        async for added in self.iter_in_place():
            out += conn.view[conn.start:conn.body_end]
            conn.start = conn.body_end
            yield added

    async def read(self) -> bytes:
        out = bytearray()
        async for _ in self.iter_into(out):
            pass
        return bytes(out)

    async def text(self) -> str:
        return (await self.read()).decode("utf-8", "replace")

    def _take(self, conn: _Connection) -> None:
        if self._chunks is not None:
            self._chunks.take(conn)
            self._complete = self._chunks.done
            return
        n = conn.end - conn.raw if self._left is None else min(self._left, conn.end - conn.raw)
        conn.body_end += n  # no transfer coding: the body is the received bytes, where they lie
        conn.raw += n
        if self._left is not None:
            self._left -= n
            self._complete = not self._left

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._keep and self._conn.raw == self._conn.end:
            self._conn.reset()
            self._client._give_back(self._key, self._conn)
        else:
            self._conn.abort("not reusable")


class HttpClient:
    """Requests to engines over pooled keep-alive connections (see the module invariants)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, idle_s: float = IDLE_S) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.idle_s = idle_s  # a pooled connection idle this long is dropped, not reused
        self._idle: dict[tuple, list[_Connection]] = {}
        self._urls: dict[str, tuple[tuple, str, str]] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def request(self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None,
                      *, read_timeout_s: float | None = None) -> Response:
        """Send one request and return once the response's head has arrived."""
        if self._closed:
            raise HttpError("client closed")
        key, host_header, path = self._target(url)
        timeout = self.read_timeout_s if read_timeout_s is None else read_timeout_s
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host_header}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        message = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        conn, reused = self._pooled(key), True
        if conn is None:
            conn, reused = await self._connect(key), False
        while True:
            conn.transport.write(message)  # type: ignore[union-attr]  # set on connecting (connection_made), never unset
            try:
                status, fields = await self._head(conn, timeout)
                return Response(self, key, conn, status, fields, timeout, head_request=method == "HEAD")
            except HttpError:
                if reused and conn.end == conn.start and conn.ended:  # closed while idle: it never saw the request
                    conn, reused = await self._connect(key), False
                    continue
                conn.abort("failed")
                raise
            except BaseException:  # cancelled while waiting for the head: the connection is unusable
                conn.abort("cancelled")
                raise

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.abort("client closed")
        self._idle.clear()

    def _target(self, url: str) -> tuple[tuple, str, str]:
        """The connection key, Host header and request target of ``url``; an engine's few URLs are
        split once (the split cached per URL, at most ``TARGETS`` of them)."""
        target = self._urls.get(url)
        if target is None:
            target = self._split(url)
            if len(self._urls) >= TARGETS:
                self._urls.clear()
            self._urls[url] = target
        return target

    @staticmethod
    def _split(url: str) -> tuple[tuple, str, str]:
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise HttpError(f"not an http(s) URL: {url!r}")
        tls = split.scheme == "https"
        key = (split.hostname, split.port or (443 if tls else 80), tls)
        path = split.path or "/"
        return key, split.netloc, path + (f"?{split.query}" if split.query else "")

    def _pooled(self, key: tuple) -> _Connection | None:
        idle, now = self._idle.get(key), time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable(now, self.idle_s):
                return conn
            conn.abort("idle too long")
        return None

    def _give_back(self, key: tuple, conn: _Connection) -> None:
        if self._closed:
            conn.abort("client closed")
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(conn)

    async def _connect(self, key: tuple) -> _Connection:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), host, port, ssl=self._tls if tls else None),
                self.connect_timeout_s)
        except TimeoutError:
            raise HttpError(f"cannot connect to {host}:{port}: no answer within {self.connect_timeout_s} s") from None
        except OSError as exc:
            raise HttpError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        return conn

    @staticmethod
    async def _head(conn: _Connection, timeout: float) -> tuple[int, dict[str, str]]:
        """Status and lower-cased headers of the next final (non-1xx) response head."""
        while True:
            end = conn.buf.find(b"\r\n\r\n", conn.start, conn.end)
            if end < 0:
                if conn.end - conn.start > MAX_HEAD_BYTES:
                    raise HttpError(f"response head over {MAX_HEAD_BYTES} bytes")
                await conn.more(timeout)
                continue
            head = bytes(conn.view[conn.start:end]).split(b"\r\n")
            conn.start = conn.body_end = conn.raw = end + 4
            match = _STATUS.fullmatch(head[0])
            if match is None:
                raise HttpError(f"malformed status line {head[0][:60]!r}")
            status = int(match.group(1))
            if 100 <= status < 200 and status != 101:
                continue
            fields: dict[str, str] = {}
            for line in head[1:]:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise HttpError(f"malformed header line {line[:60]!r}")
                fields[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
            return status, fields
