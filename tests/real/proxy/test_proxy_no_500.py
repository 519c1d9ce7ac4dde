"""Issue 32 regressions over HTTP: no 500 for anything a client, an engine's chunk or the disk
does, and a failed admin action changes nothing.

Each case gets the API's own error shape (``{"error": ...}`` on the admin API) with a 4xx
status, or 507 for a full disk, or, for an engine's chunk of the wrong shape, the engine's
failure (529 with the only engine); each failed before the fix with a 500 or a 400 outside the
API's shape.
"""

from __future__ import annotations

import errno
import gzip
import http.client
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.real.store.durable import Disk

try:
    from proxy_fixtures import build_tiny_tokenizer, scripted_proxy_stack, shared_tiny_dir
    from hypothesis_budget import examples
except ImportError:
    from .proxy_fixtures import build_tiny_tokenizer, scripted_proxy_stack, shared_tiny_dir

    def examples(full: int) -> int:
        return full

pytestmark = pytest.mark.timeout(120)
TOKEN = "admin-secret-token"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    with scripted_proxy_stack(model, lambda prompt: "Hello.", tmp_path_factory.mktemp("records")) as stack:
        yield stack


def send(stack: dict, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes, str]:
    """(status, body, content type) of one raw request (headers given as bytes-safe latin-1 text)."""
    conn = http.client.HTTPConnection("127.0.0.1", stack["port"], timeout=60)
    conn.putrequest(method, path)
    for name, value in headers.items():
        conn.putheader(name, value.encode("latin-1"))
    conn.putheader("Content-Length", str(len(body or b"")))
    conn.endheaders(body)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload, response.getheader("Content-Type", "")


def admin_call(stack: dict, method: str, path: str, body: bytes | None = b"{}", token: str = TOKEN):
    return send(stack, method, path, body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def assert_admin_error(status: int, payload: bytes, kind: str, expected: int) -> None:
    assert status == expected, (status, payload)
    assert kind.startswith("application/json"), kind
    assert isinstance(json.loads(payload)["error"], str)


def assert_api_error(status: int, payload: bytes, kind: str, expected: int) -> None:
    assert status == expected, (status, payload)
    assert kind.startswith("application/json"), kind
    body = json.loads(payload)
    assert body["type"] == "error" and body["error"]["type"] in {"invalid_request_error", "authentication_error",
                                                                 "request_too_large"}, body


def test_a_non_utf8_admin_token_is_a_401(stack):
    status, payload, kind = send(stack, "GET", "/admin/engines", None, {"Authorization": "Bearer caf\xe9\xff"})
    assert_admin_error(status, payload, kind, 401)


def test_a_very_deep_admin_body_is_a_400(stack):
    status, payload, kind = admin_call(stack, "POST", "/admin/executions", b"[" * 200_000 + b"]" * 200_000)
    assert_admin_error(status, payload, kind, 400)


@pytest.mark.parametrize("to", [["x"], 5, {"a": 1}, "no-such-engine", "e0", None])
def test_a_failed_drain_changes_nothing(stack, to):
    """``to`` is bad, or names the drained engine itself, or (None) no other engine can take them."""
    router = stack["server"].router
    router.reroute("exec-a", "e0")  # something to evacuate
    before = (router.snapshot(), dict(router.routes))
    status, payload, kind = admin_call(stack, "POST", "/admin/engines/e0/drain",
                                       json.dumps({"evacuate": True, "to": to}).encode())
    assert_admin_error(status, payload, kind, 400)
    assert (router.snapshot(), dict(router.routes)) == before  # the engine is not left draining


@pytest.mark.parametrize("encoding, body", [("gzip", b'{"model": "m"}'), ("br", b"\x8b\x02\x80hi\x03"),
                                            ("zstd", b"\x28\xb5\x2f\xfd\x00"), ("deflate", b"plain"),
                                            ("compress", b"x")])
def test_a_body_that_does_not_decode_is_a_400_in_the_api_shape(stack, encoding, body):
    status, payload, kind = send(stack, "POST", "/v1/messages", body,
                                 {"x-api-key": "key-a", "Content-Type": "application/json",
                                  "Content-Encoding": encoding})
    assert_api_error(status, payload, kind, 400)
    assert encoding in json.loads(payload)["error"]["message"]


def test_a_gzip_body_is_still_served(stack):
    body = gzip.compress(json.dumps({"model": "m", "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "hi"}]}).encode())
    status, payload, _ = send(stack, "POST", "/v1/messages", body,
                              {"x-api-key": "key-a", "Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert status == 200, payload


def test_a_stray_directory_in_the_records_folder_is_reported_not_a_500(stack):
    (stack["records"] / "stray.tito").mkdir()
    try:
        status, payload, kind = admin_call(stack, "GET", "/admin/executions", None)
        assert status == 200, payload
        rows = json.loads(payload)
        assert all(row["execution_id"] != "stray" for row in rows["executions"])
        assert any(problem["execution_id"] == "stray" for problem in rows["unreadable"])
        status, payload, kind = admin_call(stack, "GET", "/admin/executions/stray/stats", None)
        assert_admin_error(status, payload, kind, 409)
    finally:
        (stack["records"] / "stray.tito").rmdir()


GARBLED = [b'{"text":"","output_ids":[1],"meta_info":"x"}',
           b'{"text":"","output_ids":5,"meta_info":{"completion_tokens":1,'
           b'"output_token_logprobs":[[-0.1,1,null]]}}',
           b'{"text":"","output_ids":[1],"meta_info":{"completion_tokens":null,'
           b'"output_token_logprobs":[[-0.1,1,null]]}}',
           b'{"text":"","output_ids":[1],"meta_info":{"completion_tokens":1,"output_token_logprobs":[[]]}}',
           b'{"text":"","output_ids":[1],"meta_info":{"completion_tokens":1,"output_token_logprobs":[[-0.1,1,null]],'
           b'"finish_reason":"stop"}}']


def call(stack: dict, stream: bool) -> tuple[int, bytes, str]:
    body = json.dumps({"model": "m", "max_tokens": 8, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]})
    headers = {"x-api-key": "key-a", "Content-Type": "application/json"}
    return send(stack, "POST", "/v1/messages", body.encode(), headers)


def answer_text(payload: bytes, stream: bool) -> str:
    if not stream:
        return "".join(block["text"] for block in json.loads(payload)["content"] if block["type"] == "text")
    events = [json.loads(line[6:]) for line in payload.decode().splitlines() if line.startswith("data: ")]
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "text_delta")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("garbled", GARBLED)
def test_an_engine_chunk_of_the_wrong_shape_is_an_engine_failure_not_a_500(stack, garbled, stream):
    # the engine's failure (with one engine, nothing to retry on: 529 in the API's shape, naming it);
    # the next call is served as usual
    stack["engine"].garble_next = [garbled]
    status, payload, kind = call(stack, stream)
    assert not stack["engine"].garble_next  # the garbled submission was made
    assert status == 529, payload
    assert kind.startswith("application/json") and json.loads(payload)["error"]["type"] == "overloaded_error"
    assert b"(failures: engine e0: " in payload, payload  # the engine's fault, named
    status, payload, _ = call(stack, stream)
    assert status == 200, payload
    assert answer_text(payload, stream) == "Hello."


class FullDisk(Disk):
    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_minting_a_key_on_a_full_disk_is_a_507_and_registers_nothing(stack, monkeypatch):
    keys = stack["server"].keys
    monkeypatch.setattr(keys, "disk", FullDisk())  # the key file's disk (KeyRegistry's seam) is full
    for path, body in (("/admin/executions", {"execution_id": "full-disk"}),
                       ("/admin/executions/start", {"executions": [{"execution_id": "full-disk"}]})):
        status, payload, kind = admin_call(stack, "POST", path, json.dumps(body).encode())
        assert_admin_error(status, payload, kind, 507)
        assert "full-disk" not in keys.executions()


ADMIN_ROUTES = [("GET", "/admin/executions"), ("POST", "/admin/executions"), ("POST", "/admin/executions/start"),
                ("POST", "/admin/executions/x/revoke"), ("GET", "/admin/executions/x/stats"),
                ("POST", "/admin/engines"), ("POST", "/admin/engines/e9/drain"), ("POST", "/admin/routes"),
                ("POST", "/admin/policy_version")]
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=12)
FIELDS = st.sampled_from(["execution_id", "executions", "engine", "id", "url", "evacuate", "to", "api_key",
                          "version", "x"])


@settings(max_examples=examples(120), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(route=st.sampled_from(ADMIN_ROUTES),
       body=st.one_of(st.dictionaries(FIELDS, JSON_VALUES, max_size=3).map(lambda d: json.dumps(d).encode()),
                      st.binary(max_size=40)))
def test_generated_admin_bodies_never_get_a_500(stack, route, body):
    """An admin call with any body is answered with JSON, never a 5xx; engines and routes stay unchanged
    unless it succeeded."""
    router = stack["server"].router
    before = (router.snapshot(), dict(router.routes))
    method, path = route
    status, payload, kind = admin_call(stack, method, path, body)
    assert status < 500, (route, body, payload)
    assert kind.startswith("application/json"), (route, body, payload)
    json.loads(payload)
    if status >= 400:
        assert (router.snapshot(), dict(router.routes)) == before
    else:  # undo what a successful call changed, so the next example starts from the same state
        for engine in set(router.engines) - {"e0"}:
            router.remove_engine(engine)
        router.drain("e0", draining=False)
