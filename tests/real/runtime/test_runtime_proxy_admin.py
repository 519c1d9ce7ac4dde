"""``runtime.proxy_admin.ProxyAdmin``: admin calls never block the event loop and reach the proxy in order.

- a blocking transport (a proxy that is restarting: the call waits) runs off the
  loop: the loop goes on with other work while the call waits, and that work
  is what lets the call finish here (on the loop it would wait forever);
- calls reach the transport in the order sent, whether awaited or posted;
- a posted call that fails is filed as a backend error, an awaited one raises
  in its waiter;
- an inline transport answers at the point of the call (a virtual clock sees
  no extra step); ``HttpAdmin`` retries a refused connection until its wait ends.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error

import pytest

from gyre.real.runtime.proxy_admin import HttpAdmin, InlineAdmin, ProxyAdmin


class BlockingProxy:
    """A proxy whose admin calls block until ``go`` is set (as while it restarts)."""

    inline = False

    def __init__(self) -> None:
        self.go = threading.Event()
        self.seen: list[str] = []

    def request(self, method, path, body=None):
        if not self.go.wait(10.0):  # on the loop this could never be set: the test fails instead of hanging
            raise TimeoutError("the admin call blocked the event loop")
        self.seen.append(path)
        if path == "/fail":
            raise ConnectionError("proxy gone")
        return {"path": path}


def admin_with(transport):
    errors: list[BaseException] = []

    def spawn(coro):
        return asyncio.get_running_loop().create_task(coro)

    return ProxyAdmin(transport, errors.append, spawn), errors


def test_a_waiting_call_leaves_the_loop_free_and_calls_keep_their_order():
    proxy = BlockingProxy()
    admin, errors = admin_with(proxy)

    async def main():
        first = admin.send("POST", "/a")
        admin.post("POST", "/fail")
        third = admin.call("GET", "/c")
        await asyncio.sleep(0)       # the loop runs on while the calls wait in their thread
        assert not first.done()
        proxy.go.set()               # only the loop can get here if the calls do not block it
        assert await first == {"path": "/a"} and await third == {"path": "/c"}

    asyncio.run(main())
    assert proxy.seen == ["/a", "/fail", "/c"]
    assert [type(e) for e in errors] == [ConnectionError]


def test_an_awaited_call_raises_in_its_waiter_and_is_not_filed():
    proxy = BlockingProxy()
    proxy.go.set()
    admin, errors = admin_with(proxy)

    async def main():
        with pytest.raises(ConnectionError):
            await admin.call("POST", "/fail")

    asyncio.run(main())
    assert errors == []


def test_an_inline_transport_answers_at_the_point_of_the_call():
    seen = []
    admin, _ = admin_with(InlineAdmin(lambda method, path, body: seen.append(path) or {"api_keys": {"x3": "k"}}))

    async def main():
        keys = admin.start_executions({3: "e0"})
        assert keys.done() and keys.result() == {"x3": "k"} and seen == ["/admin/executions/start"]
        admin.reroute(3, "e1")
        assert seen[-1] == "/admin/routes" and admin.snapshot() == {"routes": {3: "e1"}}

    asyncio.run(main())


def test_http_admin_retries_a_refused_connection_until_its_wait_ends():
    admin = HttpAdmin("http://127.0.0.1:9", "-", wait_s=0.3)  # port 9 (discard): nothing listens here
    with pytest.raises(urllib.error.URLError):
        admin.request("GET", "/admin/engines")


class KeysProxy(BlockingProxy):
    """Answers ``/admin/executions/start`` with a key per execution, once ``go`` is set."""

    def request(self, method, path, body=None):
        answer = super().request(method, path, body)
        if path != "/admin/executions/start":
            return answer
        return {"api_keys": {e["execution_id"]: f"key-{e['execution_id']}" for e in body["executions"]}}


def test_keys_that_come_after_their_waiters_were_cancelled_raise_nowhere():
    """The run ends (every execution's task cancelled) while a start call waits: the keys future is cancelled
    with its waiters, and the answer that comes after must not raise in a loop callback."""
    proxy = KeysProxy()
    admin, errors = admin_with(proxy)
    loop_errors: list[str] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context["message"]))
        keys = admin.start_executions({0: "e0", 1: "e0"})
        waiter = asyncio.ensure_future(keys)
        await asyncio.sleep(0)
        waiter.cancel()  # as the run's stop cancels the executions awaiting their keys
        await asyncio.sleep(0)
        proxy.go.set()
        await admin.call("GET", "/after")  # in order: the start call's answer has come by now
        await asyncio.sleep(0)
        return keys

    keys = asyncio.run(main())
    assert keys.cancelled() and proxy.seen == ["/admin/executions/start", "/after"]
    assert loop_errors == [] and errors == []
