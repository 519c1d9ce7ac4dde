"""The backend's part that talks to the proxy's admin API, never blocking the event loop.

``ProxyAdmin`` sends admin calls (keys, routes, drains, holds, the policy
version) one at a time, in the order they were sent, from one worker task;
a blocking transport (``HttpAdmin``: urllib on loopback) runs in a thread,
so a call that waits out a proxy restart (up to ``PROXY_WAIT_S``, retried
every 0.1 s) waits there, never on the loop. An inline transport
(``InlineAdmin``: a double at the outer edge) answers at once, at the point
of the call, so a virtual clock sees no extra step. ``call`` is awaited for
its answer; ``post`` is sent without a waiter (its failure is filed as a
backend error). ``call_blocking`` is for code that runs before the loop
does (a resume's restore).

State it owns: ``routes`` (running execution -> its engine), put back by
``reapply`` in a restarted proxy together with the drains, holds and the
policy version the other parts name; ``snapshot()`` / ``restore()`` copy it.

Invariants: admin calls reach the proxy in the order sent; every admin call
is idempotent or, for a key, replaceable, so a retry after a restart is safe;
no call from this part blocks the event loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any, Callable, Iterable

from gyre.ids import execution_id

PROXY_WAIT_S = 120.0  # how long an admin call waits for a proxy that is restarting


class HttpAdmin:
    """The proxy's admin API over loopback HTTP (blocking: ``ProxyAdmin`` runs it in a thread)."""

    inline = False

    def __init__(self, url: str, token: str, *, wait_s: float = PROXY_WAIT_S) -> None:
        self.url, self.token, self.wait_s = url, token, wait_s

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        """One admin call; while the proxy is down (restarting: ``runtime.proxy_process``) it is
        retried for up to ``wait_s`` (read at each retry: 0 ends the waits of calls already in flight)."""
        data = None if body is None else json.dumps(body).encode()
        started = time.monotonic()
        while True:
            request = urllib.request.Request(self.url + path, data=data, method=method,
                                             headers={"Authorization": f"Bearer {self.token}",
                                                      "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError:
                raise
            except (urllib.error.URLError, ConnectionError, http.client.RemoteDisconnected):
                if time.monotonic() - started >= self.wait_s:
                    raise
                time.sleep(0.1)  # in the admin thread (or before the loop runs), never on the loop


class InlineAdmin:
    """An admin API that answers at once: ``handle(method, path, body)`` (a double at the outer edge)."""

    inline = True

    def __init__(self, handle: Callable[[str, str, dict | None], Any]) -> None:
        self.handle = handle

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        return self.handle(method, path, body)


class ProxyAdmin:
    def __init__(self, transport, failed: Callable[[BaseException], None], spawn) -> None:
        self.transport, self._failed, self._spawn = transport, failed, spawn
        self.routes: dict[int, str] = {}
        self._pending: deque[tuple[str, str, dict | None, asyncio.Future]] = deque()
        self._worker: asyncio.Task | None = None

    # ---- sending ---------------------------------------------------------------------
    def send(self, method: str, path: str, body: dict | None = None) -> asyncio.Future:
        """Queue one call (in order after every call sent before it); the future holds its answer."""
        future = asyncio.get_running_loop().create_future()
        if self.transport.inline and not self._pending:
            try:
                future.set_result(self.transport.request(method, path, body))
            except Exception as exc:
                future.set_exception(exc)
            return future
        self._pending.append((method, path, body, future))
        if self._worker is None or self._worker.done():
            self._worker = self._spawn(self._drain_pending())
        return future

    async def call(self, method: str, path: str, body: dict | None = None) -> Any:
        return await self.send(method, path, body)

    def post(self, method: str, path: str, body: dict | None = None) -> asyncio.Future:
        """Send without a waiter: a failure is filed as a backend error."""
        future = self.send(method, path, body)

        def file_failure(done: asyncio.Future) -> None:
            error = None if done.cancelled() else done.exception()
            if error is not None:
                self._failed(error)

        future.add_done_callback(file_failure)
        return future

    def call_blocking(self, method: str, path: str, body: dict | None = None) -> Any:
        """For code that runs before the event loop does (a resumed run's restore)."""
        return self.transport.request(method, path, body)

    async def _drain_pending(self) -> None:
        while self._pending:
            method, path, body, future = self._pending.popleft()
            try:
                answer = await asyncio.to_thread(self.transport.request, method, path, body)
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(answer)

    # ---- what the other parts ask for ------------------------------------------------
    def start_executions(self, routes: dict[int, str]) -> asyncio.Future:
        """Keys and routes for executions starting together (one call): a future of ``{execution_id: key}``."""
        self.routes.update(routes)
        answer = self.send("POST", "/admin/executions/start", {"executions": [
            {"execution_id": execution_id(x), "engine": name} for x, name in routes.items()]})
        keys = asyncio.get_running_loop().create_future()

        def take(done: asyncio.Future) -> None:
            if keys.done():  # its waiters were cancelled (the run ended while the call waited): no one to tell
                return
            error = done.exception()
            if error is not None:
                keys.set_exception(error)
            else:
                keys.set_result(done.result()["api_keys"])

        if answer.done():  # an inline transport answered at once: so are the keys
            take(answer)
        else:
            answer.add_done_callback(take)
        return keys

    def reroute(self, x: int, engine: str) -> asyncio.Future:
        self.routes[x] = engine
        return self.post("POST", "/admin/routes", {"execution_id": execution_id(x), "engine": engine})

    def finished(self, x: int) -> None:
        self.routes.pop(x, None)

    def set_serving(self, name: str, serving: bool) -> asyncio.Future:
        """Undrain (True) or drain (False) an engine for its cell's role."""
        if serving:
            return self.post("POST", f"/admin/engines/{name}/undrain")
        return self.post("POST", f"/admin/engines/{name}/drain", {"evacuate": False})

    def gate(self, name: str, serving: bool) -> asyncio.Future:
        """The engine watch's hold (False) or release (True), apart from the role's drain."""
        return self.post("POST", f"/admin/engines/{name}/{'release' if serving else 'hold'}")

    def policy_version(self, version: int) -> asyncio.Future:
        return self.post("POST", "/admin/policy_version", {"version": version})

    async def in_flight(self, name: str) -> bool:
        """Whether engine ``name`` still serves calls."""
        engines = (await self.call("GET", "/admin/engines"))["engines"]
        return any(e["id"] == name and e["in_flight"] for e in engines)

    def reapply(self, *, version: int | None, engines: Iterable[tuple[str, bool, bool]],
                running: Iterable[int]) -> None:
        """A restarted proxy kept keys and records on disk but nothing in memory: the policy version,
        each engine's drain and hold (``engines``: name, drained, held) and the running executions' routes."""
        if version is not None:
            self.policy_version(version)
        for name, drained, held in engines:
            if drained:
                self.set_serving(name, False)
            if held:
                self.gate(name, False)
        for x in running:
            if x in self.routes:
                self.post("POST", "/admin/routes", {"execution_id": execution_id(x), "engine": self.routes[x]})

    # ---- resume ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"routes": dict(self.routes)}

    def restore(self, state: dict[str, Any]) -> None:
        self.routes = {int(x): str(engine) for x, engine in state["routes"].items()}
