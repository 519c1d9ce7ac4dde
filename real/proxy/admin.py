"""The proxy's admin API (separate token): executions, tree stats, engines, routes.

Every route needs ``Authorization: Bearer <admin_token>`` (or ``x-admin-token``);
execution keys never work here, and the admin token never works as an
execution key. Errors are ``{"error": message}`` with 400/401/404, 409 for an
execution whose records cannot be read, 507 (disk full) or 503 (another disk
fault) when the key file cannot be written; an action that fails changes
nothing (every argument is checked before the first change). Execution ids
follow ``config.ID_RULE``; a key is issued only for a valid id.

| method and path                    | body                        | effect |
|------------------------------------|-----------------------------|--------|
| GET  /admin/executions             |                             | every execution: requests, route, in-flight |
| POST /admin/executions             | {"execution_id"}            | new API key for it (persisted as a digest) |
| POST /admin/executions/start       | {"executions": [item, ...]} | a key each, routes set (all or nothing) |
| POST /admin/executions/{id}/revoke | {"api_key"?}                | revoke that key, or every key of it |
| GET  /admin/executions/{id}/stats  |                             | ``tree_stats`` of its trajectory tree |
| GET  /admin/engines                |                             | engines and routes |
| POST /admin/engines                | {"id", "url"}               | add an engine |
| DELETE /admin/engines/{id}         |                             | remove an idle, unrouted engine |
| POST /admin/engines/{id}/drain     | {"evacuate": bool, "to"?}   | no new requests; may move its executions now |
| POST /admin/engines/{id}/undrain   |                             | take new requests again |
| POST /admin/engines/{id}/hold      |                             | unready: calls go elsewhere or wait; routes kept |
| POST /admin/engines/{id}/release   |                             | ready again: its executions' calls come back |
| GET  /admin/routes                 |                             | execution -> engine |
| POST /admin/routes                 | {"execution_id", "engine"}  | reroute one execution (in-flight requests move) |
| POST /admin/policy_version         | {"version": int}            | version recorded when engines do not report one |

An item of ``/admin/executions/start``: ``{"execution_id", "engine"?}``.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
from typing import Any, Awaitable, Callable

from aiohttp import web

from gyre.real.proxy.config import ID_RULE, EngineSpec, ProxyConfigError, valid_id
from gyre.real.proxy.recording import KeyRegistry, Recorder, RecordsUnreadable
from gyre.real.proxy.routing import Router, RoutingError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class AdminApi:
    def __init__(self, token: str, router: Router, recorder: Recorder, keys: KeyRegistry, service: Any) -> None:
        self.token, self.router, self.recorder, self.keys, self.service = token, router, recorder, keys, service

    def routes(self) -> list[web.RouteDef]:
        guard = self._guarded
        return [web.get("/admin/executions", guard(self.list_executions)),
                web.post("/admin/executions", guard(self.create_execution)),
                web.post("/admin/executions/start", guard(self.start_executions)),
                web.get("/admin/executions/{execution_id}/stats", guard(self.execution_stats)),
                web.post("/admin/executions/{execution_id}/revoke", guard(self.revoke_keys)),
                web.get("/admin/engines", guard(self.engines)),
                web.post("/admin/engines", guard(self.add_engine)),
                web.delete("/admin/engines/{engine_id}", guard(self.remove_engine)),
                web.post("/admin/engines/{engine_id}/drain", guard(self.drain)),
                web.post("/admin/engines/{engine_id}/undrain", guard(self.undrain)),
                web.post("/admin/engines/{engine_id}/hold", guard(self.hold)),
                web.post("/admin/engines/{engine_id}/release", guard(self.release)),
                web.get("/admin/routes", guard(self.get_routes)),
                web.post("/admin/routes", guard(self.set_route)),
                web.post("/admin/policy_version", guard(self.set_policy_version))]

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            auth = request.headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-admin-token", "")
            # a header aiohttp could not decode as UTF-8 holds surrogate escapes: compared as the bytes sent
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token.encode()):
                return _error(401, "admin token required")
            try:
                return await handler(request)
            except (RoutingError, ProxyConfigError, KeyError, ValueError) as exc:
                return _error(404 if isinstance(exc, KeyError) else 400, str(exc).strip("'\""))
            except RecordsUnreadable as exc:
                return _error(409, str(exc))
            except OSError as exc:  # the key file could not be written: nothing was registered
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                return _error(507 if full else 503, f"cannot write the key file: {exc}")

        return guarded

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read() or b"{}")
        except RecursionError:
            raise ValueError("body: nested too deeply") from None
        except ValueError as exc:
            raise ValueError(f"body: invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ValueError("body: expected a JSON object")
        return body

    async def list_executions(self, request: web.Request) -> web.Response:
        """Every execution; one whose records cannot be read is listed under ``unreadable``. Logs not
        loaded yet are counted on a worker thread, never replayed on the event loop."""
        known = set(self.recorder.executions()) | self.keys.executions() | set(self.router.routes)
        ids = sorted(filter(valid_id, known))  # a stray file never breaks the listing
        counts = await asyncio.get_running_loop().run_in_executor(self.service.pool, self.recorder.request_counts,
                                                                  ids)
        rows, unreadable = [], []
        for execution_id in ids:
            count = counts[execution_id]
            if isinstance(count, str):
                unreadable.append({"execution_id": execution_id, "error": count})
                continue
            rows.append({"execution_id": execution_id, "requests": count,
                         "route": self.router.routes.get(execution_id),
                         "in_flight": len(self.router.in_flight(execution_id))})
        return web.json_response({"executions": rows, "unreadable": unreadable})

    async def create_execution(self, request: web.Request) -> web.Response:
        execution_id = (await self._json(request)).get("execution_id")
        if not valid_id(execution_id):
            raise ValueError(f"execution_id: must be {ID_RULE}")
        return web.json_response({"execution_id": execution_id, "api_key": self.keys.register(execution_id)})

    async def start_executions(self, request: web.Request) -> web.Response:
        """Several executions in one call (a burst's start): a new key each, with one write of the key file,
        and each route when given. Every item is checked before anything changes: a bad one is named and
        nothing is registered or routed."""
        items = (await self._json(request)).get("executions")
        if not isinstance(items, list) or not items:
            raise ValueError('executions: required, a non-empty list of {"execution_id", "engine"?}')
        ids, routes = [], {}
        for n, item in enumerate(items):
            if not isinstance(item, dict) or set(item) - {"execution_id", "engine"}:
                raise ValueError(f'executions[{n}]: expected {{"execution_id", "engine"?}}, got {item!r:.200}')
            execution_id, engine = item.get("execution_id"), item.get("engine")
            if not valid_id(execution_id) or execution_id in ids:
                raise ValueError(f"executions[{n}].execution_id: must be {ID_RULE}, once each")
            if engine is not None:
                if not isinstance(engine, str):
                    raise ValueError(f"executions[{n}].engine: must be a string")
                self.router.check_destination(engine)
                routes[execution_id] = engine
            ids.append(execution_id)
        keys = self.keys.register_many(ids)
        for execution_id, engine in routes.items():
            self.router.reroute(execution_id, engine)
        return web.json_response({"api_keys": dict(zip(ids, keys)), "routes": routes})

    async def revoke_keys(self, request: web.Request) -> web.Response:
        """Revoke every key of the execution, or only ``{"api_key": ...}`` when given."""
        execution_id = request.match_info["execution_id"]
        key = (await self._json(request)).get("api_key")
        if key is not None and not isinstance(key, str):
            raise ValueError("api_key: must be a string")
        revoked = self.keys.revoke(execution_id, key)
        if not revoked:
            raise KeyError(f"no such key of execution {execution_id!r}")
        return web.json_response({"execution_id": execution_id, "revoked": revoked})

    async def execution_stats(self, request: web.Request) -> web.Response:
        execution_id = request.match_info["execution_id"]
        if not valid_id(execution_id) or execution_id not in set(self.recorder.executions()) | self.keys.executions():
            raise KeyError(f"unknown execution {execution_id!r}")
        await self.recorder.state_async(execution_id, self.service.pool)  # a first replay: off the loop
        return web.json_response(self.recorder.stats(execution_id))

    async def engines(self, request: web.Request) -> web.Response:
        return web.json_response(self.router.snapshot())

    async def add_engine(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self.router.add_engine(EngineSpec(id=str(body.get("id", "")), url=str(body.get("url", ""))))
        return web.json_response(self.router.snapshot())

    async def remove_engine(self, request: web.Request) -> web.Response:
        self.router.remove_engine(request.match_info["engine_id"])
        return web.json_response(self.router.snapshot())

    async def drain(self, request: web.Request) -> web.Response:
        engine_id = request.match_info["engine_id"]
        body = await self._json(request)
        to, evacuate = body.get("to"), body.get("evacuate", False)
        if not isinstance(evacuate, bool) or (to is not None and not isinstance(to, str)):
            raise ValueError('evacuate: a boolean; to: an engine id (a string) when given')
        if evacuate and to is not None:
            if to == engine_id:
                raise ValueError(f"to: cannot evacuate {engine_id!r} onto itself")
            self.router.check_destination(to)
        was_draining = self.router.engines[engine_id].draining if engine_id in self.router.engines else None
        self.router.drain(engine_id)  # names an unknown engine
        try:
            moves = self.router.evacuate(engine_id, to) if evacuate else {}
        except RoutingError:  # no engine left to take them: nothing moved (the first move fails)
            self.router.drain(engine_id, draining=bool(was_draining))
            raise
        return web.json_response({"engine": engine_id, "draining": True, "moved": moves})

    async def undrain(self, request: web.Request) -> web.Response:
        self.router.drain(request.match_info["engine_id"], draining=False)
        return web.json_response(self.router.snapshot())

    async def hold(self, request: web.Request) -> web.Response:
        self.router.hold(request.match_info["engine_id"])
        return web.json_response(self.router.snapshot())

    async def release(self, request: web.Request) -> web.Response:
        self.router.hold(request.match_info["engine_id"], held=False)
        return web.json_response(self.router.snapshot())

    async def get_routes(self, request: web.Request) -> web.Response:
        return web.json_response({"routes": dict(sorted(self.router.routes.items()))})

    async def set_route(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        execution_id, engine = body.get("execution_id"), body.get("engine")
        if not valid_id(execution_id) or not isinstance(engine, str):
            raise ValueError(f"execution_id and engine: required; execution_id must be {ID_RULE}")
        moved = self.router.reroute(execution_id, engine)
        return web.json_response({"execution_id": execution_id, "engine": engine, "moved_in_flight": moved})

    async def set_policy_version(self, request: web.Request) -> web.Response:
        version = (await self._json(request)).get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError("version: required integer >= 0")
        self.service.policy_version = version
        return web.json_response({"policy_version": version})
