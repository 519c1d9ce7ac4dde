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
none leaving a record: key (401), body size (413), JSON (400), request fields
(400), chat template and context length (400). Then the first generation event
is awaited *before* the response starts, so an engine outage before any token
is a plain overload error (Anthropic 529, OpenAI 503); later outages end the
stream with the API's own in-stream error event.
"""

from __future__ import annotations

import contextlib
import json
import logging
from types import ModuleType
from typing import Any, AsyncIterator

from aiohttp import web

from gyre.real.proxy.api import anthropic, openai_chat, openai_responses
from gyre.real.proxy.admin import AdminApi
from gyre.real.proxy.model_call import ApiError, ChatService, Finished
from gyre.real.proxy.config import ProxyConfig
from gyre.real.proxy.engine_client import EngineClient
from gyre.real.proxy.generation import Overloaded
from gyre.real.proxy.recording import KeyRegistry, Recorder
from gyre.real.proxy.routing import Router
from gyre.real.proxy.tokenize import ChatTokenizer

log = logging.getLogger("gyre.proxy")
HINT_HEADERS = ("x-openai-subagent", "x-codex-parent-thread-id", "user-agent")
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "Connection": "keep-alive"}


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


class ProxyServer:
    """Owns the service objects; ``application()`` builds the aiohttp app."""

    def __init__(self, config: ProxyConfig, *, chat: ChatTokenizer | None = None) -> None:
        self.config = config
        self.chat = chat or ChatTokenizer(config.model_path, stop_tokens=config.stop_tokens)
        self.router = Router(config.engines)
        self.client = EngineClient(config.retry)
        self.recorder = Recorder(config.records_dir, self.chat, fsync=config.fsync)
        self.keys = KeyRegistry(self.recorder.root / "keys.json", config.executions)
        self.service = ChatService(config, self.chat, self.router, self.client, self.recorder)
        self.admin = AdminApi(config.admin_token, self.router, self.recorder, self.keys, self.service)

    def application(self) -> web.Application:
        # one byte over the limit lets ``_body`` tell "too large" apart and answer in the API's shape
        app = web.Application(client_max_size=self.config.limits.max_body_bytes + 1)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        app.add_routes([web.get("/", self.alive),  # aiohttp answers HEAD / through the GET route
                        web.post("/v1/messages", self.messages),
                        web.post("/v1/messages/count_tokens", self.count_tokens),
                        web.post("/v1/chat/completions", self.chat_completions),
                        web.post("/v1/responses", self.responses),
                        web.get("/v1/models", self.models), *self.admin.routes()])
        return app

    async def _startup(self, app: web.Application) -> None:
        await self.client.start()

    async def _cleanup(self, app: web.Application) -> None:
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

    async def _body(self, request: web.Request) -> dict[str, Any]:
        limit = self.config.limits.max_body_bytes
        if (request.content_length or 0) > limit:
            raise ApiError(413, "too_large", f"request body exceeds the {limit}-byte limit")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, "too_large", f"request body exceeds the {limit}-byte limit") from None
        if len(raw) > limit:
            raise ApiError(413, "too_large", f"request body exceeds the {limit}-byte limit")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "invalid_request", f"body: invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "body: expected a JSON object")
        return body

    @staticmethod
    def _hints(request: web.Request) -> dict[str, str]:
        return {name: request.headers[name][:200] for name in HINT_HEADERS if name in request.headers}

    @staticmethod
    def _error(api: ModuleType, error: ApiError) -> web.Response:
        status, body = api.error_body(error)
        return web.json_response(body, status=status)

    def _restore(self, execution: str, body: dict[str, Any], field: str) -> dict[str, Any]:
        """Put the cached raw tool-call blocks back into the history (undo re-serialization)."""
        items = body.get(field)
        if not isinstance(items, list) or not all(isinstance(m, dict) for m in items):
            return body  # malformed: the parser names the problem
        return dict(body, **{field: self.recorder.state(execution).tool_cache.restore(items).messages})

    async def _call(self, request: web.Request, api: ModuleType, parse: Any) -> web.StreamResponse:
        try:
            execution = self._execution(request)
            field = "input" if api is openai_responses else "messages"
            sent = await self._body(request)
            chat_request = parse(self._restore(execution, sent, field), self._hints(request))
            prepared = await self.service.prepare(execution, chat_request)
            if self.config.dump_requests:
                self._dump(prepared, sent, request)
            async with contextlib.aclosing(self.service.run(prepared, api.ID_PREFIX)) as events:
                try:
                    first = await events.__anext__()
                except Overloaded as exc:
                    raise ApiError(529, "overloaded", f"Overloaded: {exc}") from None
                if not chat_request.stream:
                    finished = first
                    async for finished in events:
                        pass
                    assert isinstance(finished, Finished)
                    return web.json_response(api.response(prepared, finished))
                return await self._stream(request, api, prepared, _chain(first, events))
        except ApiError as error:
            return self._error(api, error)
        except Exception:  # noqa: BLE001 - an answer in the API's shape beats a dropped connection
            log.exception("model call failed")
            return self._error(api, ApiError(500, "internal", "internal proxy error"))

    def _dump(self, prepared: Any, body: dict[str, Any], request: web.Request) -> None:
        folder = self.recorder.root / "requests" / prepared.execution_id
        folder.mkdir(parents=True, exist_ok=True)
        payload = {"path": request.path_qs, "headers": self._hints(request), "body": body}
        (folder / f"{prepared.request_id}.json").write_text(json.dumps(payload))

    async def _stream(self, request: web.Request, api: ModuleType, prepared: Any,
                      events: AsyncIterator[Any]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await response.prepare(request)
        if api is openai_chat:
            include_usage = bool((getattr(prepared.request, "stream_options", None) or {}).get("include_usage"))
            chunks = api.stream(events, prepared, include_usage)
        else:
            chunks = api.stream(events, prepared)
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    await response.write(chunk)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            log.info("client of %s went away mid-stream", prepared.execution_id)
        return response

    # -- handlers -------------------------------------------------------------

    async def alive(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": self.config.model_name})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, anthropic, anthropic.parse)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        default = self.config.limits.default_max_tokens

        def parse(body: dict[str, Any], hints: dict[str, str]) -> Any:
            parsed = openai_chat.parse(body, hints, default)
            parsed.stream_options = body.get("stream_options") or {}  # type: ignore[attr-defined]
            return parsed

        return await self._call(request, openai_chat, parse)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        default = self.config.limits.default_max_tokens
        return await self._call(request, openai_responses,
                                lambda body, hints: openai_responses.parse(body, hints, default))

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            execution = self._execution(request)
            chat_request = anthropic.parse(await self._body(request), {}, count_only=True)
            ids, _ = await self.service.encode(self.service.render(execution, chat_request))
            return web.json_response({"input_tokens": len(ids)})
        except ApiError as error:
            return self._error(anthropic, error)

    async def models(self, request: web.Request) -> web.Response:
        try:
            self._execution(request)
        except ApiError as error:
            return self._error(openai_chat, error)
        return web.json_response({"object": "list", "data": [
            {"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "gyre"}]})
