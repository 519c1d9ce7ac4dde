"""The proxy's HTTP server (aiohttp): API routes, execution keys, body limits.

Routes: ``HEAD /`` and ``GET /`` (liveness, no key: Claude Code probes them);
Anthropic ``POST /v1/messages`` (``?beta=true`` too) and
``/v1/messages/count_tokens``; OpenAI ``POST /v1/chat/completions`` and
``/v1/responses``; ``GET /v1/models``; the admin API under ``/admin``
(``proxy.admin``).

Per-execution keys: ``x-api-key`` or ``Authorization: Bearer``. The key names
the execution; an unknown key is a 401 in the API's own error shape, and a
handler only ever touches the state of the execution its key names.

Order of checks for a model call, each answered in the API's error shape and
none leaving a record: key (401), body size (413), body received in time
(408), ``Content-Encoding`` (400 unless identity, gzip or deflate and valid;
413 once the decoded body passes the limit: it is inflated by the proxy, in
bounded steps, never whole first), JSON (400: invalid, NaN, too deep, lone surrogates), every request
field (400 naming it), chat template and context length (400). Then the first
generation event is awaited *before* the response starts, so an engine outage
before any token is a plain overload error (Anthropic 529, OpenAI 503) and an
engine's rejection of the request (bad sampling values, too long) a 400.

Invariants:
- once a stream's 200 is sent, no second status line is ever written: any
  failure ends the stream with the API's own in-stream error event;
- every body and event is valid JSON in UTF-8 (``fields.json_bytes``);
- a stream's events yielded after its generation ended (``Prepared.finishing``: the record's
  sync has begun) are held and written with the stream's end, in one write, once it is durable;
- every error, aiohttp's own 404/405 included, has the API's error shape;
- a client that disconnects (streaming or not) stops its generation and the
  engine request is aborted; nothing is recorded for it;
- a client that half-closes its connection after sending a streaming request
  (``shutdown(SHUT_WR)``) is served: the connection stays open for the answer
  and closes after it (``keep_half_open``); one that has really gone is found by
  the stream's writes failing. A non-streaming HTTP/1.1 call is served too:
  once its client's input ends, the proxy probes the connection with an interim
  ``100 Continue`` (which every HTTP/1.1 client must skip) at once and every
  ``HALF_OPEN_PROBE_S``; a peer that has really closed answers the probe with a
  reset, and the call counts as disconnected (``ClientWatch``). An HTTP/1.0
  client may not be sent a 1xx, so there the end of its input is a disconnect;
- a streaming client that stops reading for ``limits.client_write_timeout_s``
  is cut off the same way (its connection aborted, at most a quarter of the
  timeout or 1 s later: ``proxy.write_watch``); a record committed before the
  cut stays (it is durable, just not acknowledged), nothing else is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import weakref
import zlib
from types import ModuleType
from typing import Any, AsyncGenerator, AsyncIterator

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gyre.real.proxy import collector, fields
from gyre.real.proxy.admin import AdminApi
from gyre.real.proxy.api import anthropic, openai_chat, openai_responses
from gyre.real.proxy.config import ProxyConfig
from gyre.real.proxy.engine_client import EngineClient
from gyre.real.proxy.model_call import ChatService
from gyre.real.proxy.recording import KeyRegistry, Recorder
from gyre.real.proxy.request import ApiError, Finished, LastChunk, bad_request, error_for
from gyre.real.proxy.routing import Router
from gyre.real.proxy.tokenize import ChatTokenizer
from gyre.real.proxy.write_watch import WriteWatchdog
from gyre.real.store.durable import SYSTEM_DISK, Disk

log = logging.getLogger("gyre.proxy")
HINT_HEADERS = ("x-openai-subagent", "x-codex-parent-thread-id", "user-agent")
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "Connection": "keep-alive"}
OFFLOAD_BODY_BYTES = 1 << 20  # bodies at least this large are decoded on a worker thread
HTTP_KINDS = {404: "not_found", 405: "method_not_allowed", 408: "timeout", 413: "too_large"}
# kernel send buffer of an event stream: bounds what a client that stops reading can hold (the kernel
# would autotune it to megabytes), so the write timeout bites after ~200 KB, not after ~3 MB
STREAM_SEND_BUFFER = 64 * 1024
# the server's own settings: bodies are decoded by ``ProxyServer._raw_body`` (bounded, in the API's error
# shape), not by aiohttp's parser (which inflates a gzip body whole, and answers br/zstd in plain text)
RUNNER_ARGS = {"auto_decompress": False}
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
DISCONNECT_POLL_S = 0.1  # how often a non-streaming call checks that its client is still connected
HALF_OPEN_PROBE_S = 1.0  # how often a half-closed client of a non-streaming call is probed
# an interim answer: RFC 9110 section 15.2, a client MUST parse 1xx responses it did not expect
HALF_OPEN_PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"
TCP_CLOSE = 7  # ``tcpi_state`` of a connection the peer has reset (Linux include/net/tcp_states.h)


class _EventStream(web.StreamResponse):
    """An event stream whose head goes out with its first events, in one write (aiohttp's
    ``StreamResponse`` writes the head alone, a system call of its own; ``web.Response`` defers it)."""

    _send_headers_immediately = False


class ClientGone(Exception):
    """The client of a non-streaming call disconnected: stop generating (the engine request is aborted)."""


def json_response(body: Any, status: int = 200, headers: Any = None) -> web.Response:
    """A JSON response that always encodes (``fields.json_bytes``)."""
    return web.Response(body=fields.json_bytes(body), status=status, headers=headers,
                        content_type="application/json")


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    yield first
    async for item in rest:
        yield item


class _HalfOpenHandler(RequestHandler):
    """aiohttp's connection handler, except that the end of a client's input while a request is queued or
    being answered keeps the connection open for the answer (then closes it): ``peer_eof`` records it."""

    __slots__ = ("peer_eof",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer_eof = False

    def eof_received(self) -> bool:
        self.peer_eof = True
        # no keep-alive: the connection closes once the answer is written (``_close`` is in aiohttp's own
        # ``__slots__``; mypy reads RequestHandler as Any and checks only ours)
        self._close = True  # type: ignore[misc]
        # decided a loop turn later: a request just taken from the queue has started its task by then
        self._loop.call_soon(self._close_if_idle)
        return True  # the transport stays open for writing

    def _close_if_idle(self) -> None:
        if not (self._messages or self._request_in_progress) and self.transport is not None:
            self.transport.close()  # nothing to answer: the connection ends, as aiohttp ends it


class _HalfOpenServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _HalfOpenHandler(self, loop=self._loop, **self._kwargs)


def keep_half_open(runner: web.AppRunner) -> None:
    """After ``runner.setup()``: serve clients that half-close their connection (module invariants)."""
    assert type(runner.server) is web.Server, type(runner.server)
    runner.server.__class__ = _HalfOpenServer


class ClientWatch:
    """Whether the client of a non-streaming call is still there (module invariants): a closed
    transport is gone; a client whose input ended is probed, and gone once the probe is reset."""

    def __init__(self, request: web.Request, clock: Any = time.monotonic) -> None:
        self.request, self.clock = request, clock
        self.probed_at: float | None = None

    def gone(self) -> bool:
        transport = self.request.transport
        if transport is None or transport.is_closing():
            return True
        if not getattr(self.request.protocol, "peer_eof", False):
            return False
        if self.request.version < (1, 1):
            return True  # no 1xx for an HTTP/1.0 client: its input's end is its disconnect
        now = self.clock()
        if self.probed_at is None or now - self.probed_at >= HALF_OPEN_PROBE_S:
            self.probed_at = now
            transport.write(HALF_OPEN_PROBE)  # on loopback the reset is back before this returns
        return transport.is_closing() or _peer_reset(transport)


def _peer_reset(transport: asyncio.BaseTransport) -> bool:
    """The kernel's TCP state says the peer reset the connection (Linux; elsewhere the next probe's
    write fails instead and closes the transport)."""
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE
    except OSError:
        return True  # a socket the kernel no longer knows


def _inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """``raw`` decoded from ``encoding``; 413 as soon as more than ``limit`` bytes come out (a bomb is
    never inflated whole), 400 when it is not that encoding's data."""
    inflater = zlib.decompressobj(ENCODINGS[encoding])
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise bad_request(f"body: not valid {encoding} data (Content-Encoding: {encoding}): {exc}") from None
    if len(body) > limit:
        del body  # not kept alive by the traceback's frame
        raise ApiError(413, "too_large", f"request body exceeds the {limit}-byte limit once decoded")
    if not inflater.eof:
        raise bad_request(f"body: truncated {encoding} data (Content-Encoding: {encoding})")
    return body


def _api_for(path: str) -> ModuleType:
    return anthropic if path.startswith("/v1/messages") else openai_chat


class ProxyServer:
    """Owns the service objects; ``application()`` builds the aiohttp app."""

    def __init__(self, config: ProxyConfig, *, chat: ChatTokenizer | None = None, disk: Disk = SYSTEM_DISK) -> None:
        self.config = config
        self.chat = chat or ChatTokenizer(config.model_path, stop_tokens=config.stop_tokens)
        self.router = Router(config.engines)
        self.client = EngineClient(config.retry)
        self.recorder = Recorder(config.records_dir, self.chat, fsync=config.fsync,
                                 write_timeout_s=config.limits.record_write_timeout_s, disk=disk)
        self.keys = KeyRegistry(self.recorder.root / "keys.json", config.executions)
        self.service = ChatService(config, self.chat, self.router, self.client, self.recorder)
        self.admin = AdminApi(config.admin_token, self.router, self.recorder, self.keys, self.service)
        self._small_buffers: weakref.WeakSet = weakref.WeakSet()  # connections whose send buffer is bounded
        self.writes = WriteWatchdog(config.limits.client_write_timeout_s)
        self._watchdog: asyncio.Future | None = None

    def application(self) -> web.Application:
        # one byte over the limit lets ``_raw_body`` tell "too large" apart and answer in the API's shape
        app = web.Application(client_max_size=self.config.limits.max_body_bytes + 1,
                              middlewares=[self._http_errors])
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        app.add_routes([web.get("/", self.alive),  # aiohttp answers HEAD / through the GET route
                        web.post("/v1/messages", self.messages),
                        web.post("/v1/messages/count_tokens", self.count_tokens),
                        web.post("/v1/chat/completions", self.chat_completions),
                        web.post("/v1/responses", self.responses),
                        web.get("/v1/models", self.models), *self.admin.routes()])
        return app

    @web.middleware
    async def _http_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """aiohttp's own 404/405/413 answers, in the API's error shape (the admin API's under /admin)."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = f"{request.method} {request.path}: {exc.reason}"
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            if request.path.startswith("/admin"):
                return json_response({"error": message}, exc.status, headers)
            api = _api_for(request.path)
            status, body = api.error_body(ApiError(exc.status, HTTP_KINDS.get(exc.status, "invalid_request"),
                                                   message))
            return json_response(body, status, headers)

    async def _startup(self, app: web.Application) -> None:
        await self.client.start()
        self._watchdog = asyncio.ensure_future(self.writes.run())

    async def _cleanup(self, app: web.Application) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        await self.client.close()
        self.service.close()
        self.recorder.close()

    # -- shared steps ---------------------------------------------------------

    def _execution(self, request: web.Request) -> str:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        execution = self.keys.execution_for(key)
        if execution is None:
            raise ApiError(401, "authentication", "invalid x-api-key: no execution has this key")
        return execution

    async def _raw_body(self, request: web.Request) -> bytes:
        """The body's bytes, decoded; 413 when too large, 408 when the client is too slow to send it."""
        limit = self.config.limits.max_body_bytes
        too_large = ApiError(413, "too_large", f"request body exceeds the {limit}-byte limit")
        if (request.content_length or 0) > limit:
            raise too_large
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ENCODINGS and encoding not in ("identity", ""):
            raise bad_request(f"Content-Encoding: {encoding[:40]!r} is not supported (identity, gzip, deflate)")
        try:
            if request.content.is_eof():  # all of it came with the head (a small body): nothing to wait for
                raw = await request.read()
            else:  # a timeout scope, not wait_for: wait_for makes a task per call
                async with asyncio.timeout(self.config.limits.client_read_timeout_s):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        except TimeoutError:
            raise ApiError(408, "timeout", f"body: not received within "
                                           f"{self.config.limits.client_read_timeout_s} s") from None
        if len(raw) > limit:
            raise too_large
        if encoding in ENCODINGS:
            raw = await asyncio.get_running_loop().run_in_executor(self.service.pool, _inflate, raw, encoding, limit)
        return raw

    async def _parse(self, request: web.Request, execution: str, api: ModuleType,
                     parse: Any) -> tuple[Any, Any, int]:
        """(body, typed request, body size): decode, restore cached tool calls, parse. A multi-megabyte
        body is handled on a worker thread, so it never stalls the other streams."""
        raw = await self._raw_body(request)
        hints = self._hints(request)
        field = "input" if api is openai_responses else "messages"

        def decode() -> tuple[Any, Any, int]:
            body = fields.load_body(raw)
            return body, parse(self._restore(execution, body, field), hints), len(raw)

        if len(raw) < OFFLOAD_BODY_BYTES:
            return decode()
        return await asyncio.get_running_loop().run_in_executor(self.service.pool, decode)

    @staticmethod
    def _hints(request: web.Request) -> dict[str, str]:
        return {name: request.headers[name][:200] for name in HINT_HEADERS if name in request.headers}

    @staticmethod
    def _error(api: ModuleType, error: ApiError) -> web.Response:
        status, body = api.error_body(error)
        return json_response(body, status)

    def _restore(self, execution: str, body: dict[str, Any], field: str) -> dict[str, Any]:
        """Put the cached raw tool-call blocks back into the history (undo re-serialization)."""
        items = body.get(field)
        if not isinstance(items, list) or not all(isinstance(m, dict) for m in items):
            return body  # malformed: the parser names the problem
        try:
            restored = self.recorder.state(execution).tool_cache.restore(items).messages
        except (TypeError, ValueError, AttributeError):
            return body  # a block the cache cannot read (e.g. a non-string "type"): the parser names it
        return dict(body, **{field: restored})

    async def _call(self, request: web.Request, api: ModuleType, parse: Any) -> web.StreamResponse:
        """Parse and check everything, await the first generation event, then answer.

        Nothing after ``_stream`` starts can produce a status line: failures there
        end the stream with the API's own error event."""
        try:
            execution = self._execution(request)
            sent, chat_request, size = await self._parse(request, execution, api, parse)
            prepared = await self.service.prepare(execution, chat_request, size)
            if self.config.dump_requests:
                self._dump(prepared, sent, request)
            async with contextlib.aclosing(self.service.run(prepared, api.ID_PREFIX)) as events:
                try:
                    first = await events.__anext__()
                except Exception as exc:  # noqa: BLE001 - outage, rejection: answered before any byte
                    raise error_for(exc) from None
                if chat_request.stream:
                    async with contextlib.aclosing(_chain(first, events)) as chained:  # not left to the GC's hook
                        return await self._stream(request, api, prepared, chained)
                return json_response(api.response(prepared, await self._finish(request, first, events)))
        except ApiError as error:
            return self._error(api, error)
        except ClientGone:
            log.info("client of a non-streaming call went away; generation aborted")
            return json_response({}, 499)
        except Exception as exc:  # noqa: BLE001 - an answer in the API's shape beats a dropped connection
            failure = error_for(exc)
            if failure.status >= 500:
                log.exception("model call failed")
            return self._error(api, failure)

    @staticmethod
    async def _finish(request: web.Request, first: Any, events: AsyncIterator[Any]) -> Finished:
        """The ``Finished`` of a non-streaming call; ``ClientGone`` once its client disconnects.

        The connection is watched every ``DISCONNECT_POLL_S`` while the generation runs, not
        only when it yields an event: a generation stalled on the engine, or one whose text is
        held back until its end, must still be aborted when the client goes away."""

        async def last() -> Any:
            finished = first
            async for finished in events:  # noqa: B007 - the loop keeps the last event
                pass
            return finished

        consumer = asyncio.ensure_future(last())
        client = ClientWatch(request)
        try:
            while not consumer.done():
                await asyncio.wait({consumer}, timeout=DISCONNECT_POLL_S)
                if not consumer.done() and client.gone():
                    raise ClientGone()
            finished = consumer.result()
        finally:
            if not consumer.done():
                consumer.cancel()  # unwinds the generation: its engine request is aborted
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
        assert isinstance(finished, Finished)
        return finished

    def _dump(self, prepared: Any, body: dict[str, Any], request: web.Request) -> None:
        folder = self.recorder.root / "requests" / prepared.execution_id
        folder.mkdir(parents=True, exist_ok=True)
        payload = {"path": request.path_qs, "headers": self._hints(request), "body": body}
        (folder / f"{prepared.request_id}.json").write_bytes(fields.json_bytes(payload))

    async def _stream(self, request: web.Request, api: ModuleType, prepared: Any,
                      events: AsyncIterator[Any]) -> web.StreamResponse:
        """Write the API's event stream; never raises once the 200 is sent (see ``_call``)."""
        response = _EventStream(status=200, headers=SSE_HEADERS)
        self._bound_send_buffer(request.transport)
        await response.prepare(request)
        chunks = api.stream(events, prepared)
        watch = self.writes.watch(request.transport)  # the write timeout (``proxy.write_watch``)
        ended = False
        held: list[bytes] = []  # the events after the generation's end, written with the stream's end
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if prepared.finishing and not isinstance(chunk, LastChunk):
                        held.append(chunk)
                        continue
                    watch.begin()
                    if isinstance(chunk, LastChunk):  # the stream's end goes out in the same write
                        ended = True
                        await response.write_eof(b"".join([*held, chunk]) if held else chunk)
                    else:
                        await response.write(chunk)
                    watch.end()
                if not ended:
                    watch.begin()
                    await response.write_eof()
        except ConnectionError:  # generation closed (engine request aborted) by aclosing above
            if watch.cut:
                log.warning("client of %s stopped reading for %s s; stream cut off", prepared.execution_id,
                            self.writes.timeout_s)
            else:
                log.info("client of %s went away mid-stream", prepared.execution_id)
        except Exception:  # noqa: BLE001 - the status line is out: end the stream, never start a second one
            log.exception("stream of %s failed", prepared.execution_id)
            if ended:
                return response  # the stream already ended whole
            with contextlib.suppress(Exception):
                watch.begin()
                await response.write(b"".join([*held, api.stream_error(ApiError(500, "internal",
                                                                                 "internal proxy error"))]))
                await response.write_eof()
        finally:
            self.writes.release(watch)
        return response

    def _bound_send_buffer(self, transport: asyncio.Transport | None) -> None:
        """``STREAM_SEND_BUFFER`` on a connection's socket, once per connection (a keep-alive
        connection carries many streams; each ``get_extra_info("socket")`` builds a socket object)."""
        if transport is None or transport in self._small_buffers:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
        self._small_buffers.add(transport)

    # -- handlers -------------------------------------------------------------

    async def alive(self, request: web.Request) -> web.Response:
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # "uvloop" or "asyncio"
        return json_response({"status": "ok", "model": self.config.model_name, "loop": loop, "gc": collector.stats(),
                              "commits": self.recorder.commit_stats()})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, anthropic, anthropic.parse)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        default = self.config.limits.default_max_tokens
        return await self._call(request, openai_chat, lambda body, hints: openai_chat.parse(body, hints, default))

    async def responses(self, request: web.Request) -> web.StreamResponse:
        default = self.config.limits.default_max_tokens
        return await self._call(request, openai_responses,
                                lambda body, hints: openai_responses.parse(body, hints, default))

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            execution = self._execution(request)
            _, chat_request, size = await self._parse(request, execution, anthropic,
                                                      lambda body, hints: anthropic.parse(body, {}, count_only=True))
            ids, _ = await self.service.encode(await self.service.render_async(execution, chat_request, size))
            return json_response({"input_tokens": len(ids)})
        except Exception as exc:  # noqa: BLE001 - every failure in the API's shape
            return self._error(anthropic, error_for(exc))

    async def models(self, request: web.Request) -> web.Response:
        try:
            self._execution(request)
        except ApiError as error:
            return self._error(openai_chat, error)
        return json_response({"object": "list", "data": [
            {"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "gyre"}]})
