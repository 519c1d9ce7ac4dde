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
  the whole response: a long generation that keeps streaming never times out.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from typing import AsyncIterator
from urllib.parse import urlsplit

IDLE_S = 4.0
MAX_HEAD_BYTES = 64 * 1024
PAUSE_BYTES = 1 << 20  # stop reading the socket while this much is buffered and unread
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: .*)?")


class HttpError(ConnectionError):
    """An HTTP exchange with an engine failed; the message names how."""


class _Connection(asyncio.Protocol):
    """One TCP connection: buffers what arrives and wakes the one reader waiting for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False          # EOF, connection lost, or aborted by us
        self.reason = "connection closed by the engine"
        self.idle_since = 0.0
        self._waiter: asyncio.Future | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

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
        """The reader took bytes out of ``buffer``: resume reading once it is small again."""
        if self._paused and len(self.buffer) < PAUSE_BYTES // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self, timeout: float) -> None:
        """Wait until more bytes arrive or the connection ends; ``HttpError`` after ``timeout`` s."""
        if self.ended:
            raise HttpError(self.reason)
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _expire, waiter, timeout)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def reusable(self, now: float, idle_s: float = IDLE_S) -> bool:
        return not self.ended and not self.buffer and now - self.idle_since < idle_s and \
            self.transport is not None and not self.transport.is_closing()


def _expire(waiter: asyncio.Future, timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(HttpError(f"no data from the engine for {timeout} s (read timeout)"))


class _Dechunker:
    """Decodes the chunked transfer coding incrementally, out of a connection's buffer."""

    def __init__(self) -> None:
        self.state = "size"
        self.remaining = 0

    @property
    def done(self) -> bool:
        return self.state == "done"

    def take(self, buffer: bytearray, out: bytearray) -> None:
        """Move the body bytes at the head of ``buffer`` onto ``out`` (one copy a byte), up to the
        body's end or the first incomplete chunk line."""
        while self.state != "done":
            if self.state == "data":
                if not buffer:
                    break
                n = min(self.remaining, len(buffer))
                with memoryview(buffer) as view:
                    out += view[:n]
                del buffer[:n]  # from the front of a bytearray: moves its start, copies nothing
                self.remaining -= n
                if not self.remaining:
                    self.state = "crlf"
                continue
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > 4096:
                    raise HttpError("malformed chunked body: a chunk header line over 4 KB")
                break
            line = bytes(buffer[:end])
            del buffer[:end + 2]
            if self.state == "crlf":
                if line:
                    raise HttpError("malformed chunked body: chunk data longer than its size")
                self.state = "size"
            elif self.state == "size":
                digits = line.split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(digits):
                    raise HttpError(f"malformed chunked body: chunk size {line[:40]!r}")
                self.remaining = int(digits, 16)
                self.state = "data" if self.remaining else "trailer"
            elif not line:  # "trailer": header lines until an empty one
                self.state = "done"


class Response:
    """Status, headers and a body read as it arrives; an async context manager that frees the
    connection (back to the pool when read to its end, aborted otherwise)."""

    def __init__(self, client: "HttpClient", key: tuple, conn: _Connection, status: int,
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

    async def __aenter__(self) -> "Response":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Abort the connection unless the response was read to its end (then it is pooled)."""
        if not self._released:
            self._released = True
            self._conn.abort("response closed")

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (each piece is whatever the buffer held)."""
        out = bytearray()
        async for _ in self.iter_into(out):
            yield bytes(out)
            out.clear()

    async def iter_into(self, out: bytearray) -> AsyncIterator[int]:
        """``iter_any`` without its copy: each piece is appended to ``out`` (which the caller may
        consume between pieces); yields the number of bytes added, never 0."""
        conn = self._conn
        while not self._complete:
            if self._released:
                raise HttpError("response closed")
            before = len(out)
            self._take(conn.buffer, out)
            conn.consumed()
            if len(out) > before:
                yield len(out) - before
                continue
            if self._complete:
                break
            if conn.ended:
                if self._left is None and self._chunks is None:
                    self._complete = True  # the body runs to the connection's end
                    break
                raise HttpError(f"response body cut short: {conn.reason}")
            await conn.more(self.read_timeout_s)
        self._release()

    async def read(self) -> bytes:
        out = bytearray()
        async for _ in self.iter_into(out):
            pass
        return bytes(out)

    async def text(self) -> str:
        return (await self.read()).decode("utf-8", "replace")

    def _take(self, buffer: bytearray, out: bytearray) -> None:
        if self._chunks is not None:
            self._chunks.take(buffer, out)
            self._complete = self._chunks.done
            return
        n = len(buffer) if self._left is None else min(self._left, len(buffer))
        with memoryview(buffer) as view:
            out += view[:n]
        del buffer[:n]
        if self._left is not None:
            self._left -= n
            self._complete = not self._left

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._keep and not self._conn.buffer:
            self._client._give_back(self._key, self._conn)
        else:
            self._conn.abort("not reusable")


class HttpClient:
    """Requests to engines over pooled keep-alive connections (see the module invariants)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, idle_s: float = IDLE_S) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.idle_s = idle_s  # a pooled connection idle this long is dropped, not reused
        self._idle: dict[tuple, list[_Connection]] = {}
        self._targets: dict[str, tuple] = {}
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
            conn.transport.write(message)
            try:
                status, fields = await self._head(conn, timeout)
                return Response(self, key, conn, status, fields, timeout, head_request=method == "HEAD")
            except HttpError:
                if reused and not conn.buffer and conn.ended:  # closed while idle: it never saw the request
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
        split = urlsplit(url)
        base = f"{split.scheme}://{split.netloc}"
        if base not in self._targets:
            if split.scheme not in ("http", "https") or not split.hostname:
                raise HttpError(f"not an http(s) URL: {url!r}")
            tls = split.scheme == "https"
            port = split.port or (443 if tls else 80)
            self._targets[base] = ((split.hostname, port, tls), split.netloc)
        key, host_header = self._targets[base]
        path = split.path or "/"
        return key, host_header, path + (f"?{split.query}" if split.query else "")

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
        except asyncio.TimeoutError:
            raise HttpError(f"cannot connect to {host}:{port}: no answer within {self.connect_timeout_s} s") from None
        except OSError as exc:
            raise HttpError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        return conn

    @staticmethod
    async def _head(conn: _Connection, timeout: float) -> tuple[int, dict[str, str]]:
        """Status and lower-cased headers of the next final (non-1xx) response head."""
        while True:
            end = conn.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buffer) > MAX_HEAD_BYTES:
                    raise HttpError(f"response head over {MAX_HEAD_BYTES} bytes")
                await conn.more(timeout)
                continue
            head = bytes(conn.buffer[:end]).split(b"\r\n")
            del conn.buffer[:end + 4]
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
