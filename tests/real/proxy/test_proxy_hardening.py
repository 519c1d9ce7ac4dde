"""Issue 17 regressions over HTTP: nothing a client or a model sends breaks a stream or causes a 500.

Each test names the defect it pins down; each fails on the proxy before the fix.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import time

import pytest

try:
    from proxy_fixtures import (ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, new_key, proxy_config,
                                shared_tiny_dir, start_proxy)
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, new_key,  # noqa: F401
                                 proxy_config, shared_tiny_dir, start_proxy)

pytestmark = pytest.mark.timeout(120)
PATHS = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
SURROGATE_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "\\ud800 x"}}\n</tool_call>'
NAN_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"n": NaN}}\n</tool_call>'


class Switch:
    """A script the tests can change: ``answer`` is what the model writes next."""

    def __init__(self, engine_ref: list) -> None:
        self.answer, self.engine_ref = "Hello. World", engine_ref

    def __call__(self, prompt: str) -> str:
        return self.answer

    def set(self, answer: object) -> None:
        self.answer = answer
        self.engine_ref[0]._cache.clear()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from gyre.real.proxy.config import Limits

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    records = tmp_path_factory.mktemp("records")
    ref: list = []
    script = Switch(ref)
    engine = ScriptedEngine(model, script, context_length=8192)
    ref.append(engine)
    engine_thread = ServerThread(engine.application).start()
    config = proxy_config(model, records, {"e0": engine_thread.url}, limits=Limits(client_read_timeout_s=1.0))
    proxy_thread, server = start_proxy(config)
    yield {"url": proxy_thread.url, "port": proxy_thread.port, "server": server, "engine": engine, "script": script,
           "records": records, "engine_thread": engine_thread}
    proxy_thread.stop()
    engine_thread.stop()


def body_for(api: str, **extra: object) -> dict:
    if api == "anthropic":
        body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    elif api == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    else:
        body = {"model": "m", "input": "hi"}
    tools = {"anthropic": [{"name": "Bash", "input_schema": {"type": "object"}}],
             "chat": [{"type": "function", "function": {"name": "Bash"}}],
             "responses": [{"type": "function", "name": "Bash"}]}[api]
    return dict(body, tools=tools, **extra)


def raw_call(stack: dict, api: str, body: object, key: str = "key-a", method: str = "POST",
             path: str | None = None, raw: bytes | None = None) -> tuple[int, bytes]:
    """(status, raw body bytes): the body is returned undecoded so a second status line would show."""
    conn = http.client.HTTPConnection("127.0.0.1", stack["port"], timeout=60)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request(method, path or PATHS[api], body=data if method == "POST" else None,
                 headers={"content-type": "application/json", "x-api-key": key, "authorization": f"Bearer {key}"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload


def events_of(payload: bytes) -> list[dict]:
    """Every SSE data payload, parsed strictly (valid UTF-8, valid JSON, no NaN)."""
    text = payload.decode("utf-8")
    assert "HTTP/1.1" not in text, "a second status line inside the stream"
    out = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:], parse_constant=lambda c: pytest.fail(f"{c} in JSON")))
    return out


def check_error_shape(api: str, status: int, payload: bytes, param: str | None = None) -> dict:
    body = json.loads(payload)
    if api == "anthropic":
        assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), body
        assert body["error"]["type"] in {"invalid_request_error", "not_found_error", "authentication_error",
                                         "request_too_large", "overloaded_error", "api_error"}, body
        if status == 400:
            assert body["error"]["type"] == "invalid_request_error", body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        if param is not None:
            assert body["error"]["param"] == param, body
    if param is not None:
        assert param in body["error"]["message"], body
    return body


def recorded(stack: dict, execution: str = "exec-a") -> int:
    return stack["server"].recorder.state(execution).requests


# -- 1. validation before the first byte; in-stream errors; encodable output --------------------

def test_late_invalid_stream_options_is_a_400_not_a_second_status_line(stack):
    before = recorded(stack)
    status, payload = raw_call(stack, "chat", body_for("chat", stream=True, stream_options=5))
    assert status == 400
    check_error_shape("chat", status, payload, "stream_options")
    assert recorded(stack) == before


@pytest.mark.parametrize("api", sorted(PATHS))
@pytest.mark.parametrize("stream", [True, False])
def test_unencodable_tool_arguments_give_valid_output_and_a_record(stack, api, stream):
    stack["script"].set(SURROGATE_CALL)
    before = recorded(stack)
    status, payload = raw_call(stack, api, body_for(api, stream=stream))
    assert status == 200, payload[:300]
    if stream:
        events = events_of(payload)
        assert events and "error" not in json.dumps(events[-1])[:40], events[-1]
    else:
        json.loads(payload.decode("utf-8"))
    assert recorded(stack) == before + 1


@pytest.mark.parametrize("api", sorted(PATHS))
def test_nan_in_tool_arguments_is_not_a_tool_call_and_the_body_is_json(stack, api):
    stack["script"].set(NAN_CALL)
    status, payload = raw_call(stack, api, body_for(api))
    assert status == 200
    body = json.loads(payload.decode("utf-8"), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert "NaN" in json.dumps(body)  # the model's text is returned as text


@pytest.mark.parametrize("api, change, param", [
    ("chat", {"tools": 5}, "tools"),
    ("chat", {"messages": [{"role": "assistant", "content": "x", "tool_calls": 5}, {"role": "user", "content": "y"}]},
     "messages.0.tool_calls"),
    ("responses", {"input": [{"type": "reasoning", "summary": 5}, {"role": "user", "content": "x"}]}, "input.0.summary"),
    ("anthropic", {"tools": 5}, "tools"),
    ("anthropic", {"messages": [{"role": "user", "content": "a \ud800 b"}]}, "messages.0.content"),
    ("chat", {"stream": "false"}, "stream"),
    ("chat", {"max_tokens": 0}, "max_tokens"),
    ("anthropic", {"temperature": -1}, "temperature"),
    ("chat", {"top_p": 0}, "top_p"),
    ("anthropic", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer:"}]},
     "messages.1"),
    ("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_x", "content": "r"}]},
     "messages.1.tool_call_id"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "nope", "output": "r"}]}, "input.0.call_id"),
])
def test_wrong_client_values_are_400s_naming_the_field(stack, api, change, param):
    before = recorded(stack)
    status, payload = raw_call(stack, api, dict(body_for(api), **change))
    assert status == 400, payload[:300]
    check_error_shape(api, status, payload, param)
    assert recorded(stack) == before


@pytest.mark.parametrize("api", sorted(PATHS))
def test_deeply_nested_body_is_a_400(stack, api):
    raw = b'{"model": "m", "zzz": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    status, payload = raw_call(stack, api, None, raw=raw)
    assert status == 400
    check_error_shape(api, status, payload)


@pytest.mark.parametrize("api, stream", [("anthropic", True), ("chat", False), ("responses", True)])
def test_engine_rejection_is_a_non_retryable_400(stack, api, stream):
    stack["script"].set("fine")
    engine = stack["server"].router.engines["e0"]
    failures = engine.failures
    limit = {"anthropic": "max_tokens", "chat": "max_tokens", "responses": "max_output_tokens"}[api]
    status, payload = raw_call(stack, api, body_for(api, stream=stream, **{limit: 9000}))  # engine context: 8192
    assert status == 400, payload[:300]
    assert "maximum context length" in check_error_shape(api, status, payload)["error"]["message"]
    assert engine.failures == failures, "a rejected request is not an engine failure"


@pytest.mark.parametrize("api, method, path, status", [
    ("anthropic", "GET", "/v1/messages", 405), ("chat", "POST", "/v1/nothing", 404),
    ("chat", "GET", "/v1/chat/completions", 405), ("anthropic", "POST", "/v1/messages/nope", 404)])
def test_404_and_405_are_in_the_api_error_shape(stack, api, method, path, status):
    got, payload = raw_call(stack, api, {}, method=method, path=path)
    assert got == status
    check_error_shape(api, got, payload)


# -- 3. semantics -----------------------------------------------------------------------------

@pytest.mark.parametrize("api, stream", [("anthropic", False), ("anthropic", True), ("chat", False),
                                         ("chat", True)])
def test_stop_strings_are_not_returned(stack, api, stream):
    stack["script"].set("Hello. World")
    stop = {"anthropic": {"stop_sequences": ["."]}, "chat": {"stop": "."}}[api]
    status, payload = raw_call(stack, api, body_for(api, stream=stream, **stop))
    assert status == 200
    if not stream:
        body = json.loads(payload)
        text = body["content"][0]["text"] if api == "anthropic" else body["choices"][0]["message"]["content"]
        if api == "anthropic":
            assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", ".")
    else:
        events = events_of(payload)
        if api == "anthropic":
            text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
        else:
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text == "Hello"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_returned(stack, stream):
    stack["script"].set("Hello there")
    status, payload = raw_call(stack, "chat", body_for("chat", logprobs=True, stream=stream))
    assert status == 200
    if stream:
        final = [e for e in events_of(payload) if e.get("choices") and e["choices"][0]["finish_reason"]][-1]
        logprobs = final["choices"][0]["logprobs"]
    else:
        logprobs = json.loads(payload)["choices"][0]["logprobs"]
    content = logprobs["content"]
    assert content and all(isinstance(t["logprob"], float) and t["logprob"] <= 0 for t in content)
    assert "".join(t["token"] for t in content) == "Hello there"


def test_records_store_the_sampling_parameters(stack):
    stack["script"].set("ok")
    status, _ = raw_call(stack, "anthropic", body_for("anthropic", temperature=0.25, top_k=7, stop_sequences=["zz"]))
    assert status == 200
    record = stack["server"].recorder.store.read("exec-a")[-1]
    requested = json.loads(record.role_hints["requested"])
    assert (requested["temperature"], requested["top_k"], requested["stop"]) == (0.25, 7, ["zz"])
    assert json.loads(record.role_hints["sampling"])["temperature"] == 0.25


# -- 4. ids and keys ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [".", "..", ".hidden", "a" * 300, "a/b", "", "-x", "a b"])
def test_admin_refuses_bad_execution_ids_before_issuing_a_key(stack, bad):
    status, body = admin(stack["url"], "POST", "/admin/executions", {"execution_id": bad})
    assert status == 400 and "128 characters" in body["error"]
    assert admin(stack["url"], "GET", "/admin/executions")[0] == 200


def test_keys_are_stored_hashed_owner_only_and_revocable(stack):
    url = stack["url"]
    key = new_key(url, "revoke-me")
    path = stack["records"] / "keys.json"
    assert key not in path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    stack["script"].set("ok")
    assert raw_call(stack, "anthropic", body_for("anthropic"), key=key)[0] == 200
    status, body = admin(url, "POST", "/admin/executions/revoke-me/revoke", {})
    assert status == 200 and body["revoked"] == 1
    assert raw_call(stack, "anthropic", body_for("anthropic"), key=key)[0] == 401


def test_key_registry_survives_bad_legacy_entries_and_persists_revocations(tmp_path):
    from gyre.real.proxy.recording import KeyRegistry

    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"plain-key": "good", "k2": "..", "k3": ".hidden"}))
    registry = KeyRegistry(path, {"static-key": "static"})
    assert registry.execution_for("plain-key") == "good" and registry.executions() == {"good", "static"}
    assert "plain-key" not in path.read_text() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert registry.revoke("static") == 1
    again = KeyRegistry(path, {"static-key": "static"})
    assert again.execution_for("static-key") is None and again.execution_for("plain-key") == "good"
    with pytest.raises(ValueError):
        again.register("..")


# -- 5. resources -----------------------------------------------------------------------------------

def test_a_disconnected_non_streaming_client_aborts_its_engine_request(stack):
    engine = stack["engine"]
    stack["script"].set("one two three four five six seven eight nine ten")
    before, aborted = recorded(stack), len(engine.aborted)
    engine.hold_after = 2
    sock = socket.create_connection(("127.0.0.1", stack["port"]))
    data = json.dumps(body_for("anthropic")).encode()
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: key-a\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    time.sleep(0.5)
    sock.close()
    time.sleep(0.2)
    stack["engine_thread"].loop.call_soon_threadsafe(engine.release)
    deadline = time.time() + 10
    while len(engine.aborted) == aborted and time.time() < deadline:
        time.sleep(0.05)
    assert len(engine.aborted) > aborted, "the engine request was not aborted"
    assert recorded(stack) == before


def test_a_client_too_slow_to_send_its_body_gets_408(stack):
    sock = socket.create_connection(("127.0.0.1", stack["port"]), timeout=10)
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: key-a\r\ncontent-type: application/json\r\n"
                 b"content-length: 100\r\n\r\n{\"model\"")
    start = time.time()
    reply = sock.recv(4096)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408") and time.time() - start < 5, reply[:200]
    assert b"invalid_request_error" in reply or b"error" in reply


def test_large_requests_are_rendered_and_tokenized_off_the_event_loop(stack):
    """A long conversation is rendered by the chat template on a worker thread, not on the
    event loop that serves every other stream (count_tokens and model calls alike)."""
    import threading

    chat = stack["server"].chat
    threads: list[str] = []
    original = chat.render

    def render(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    chat.render = render
    try:
        long = {"model": "m", "messages": [{"role": "user", "content": "the " * 4_200}]}
        status, payload = raw_call(stack, "anthropic", long, path="/v1/messages/count_tokens")
        assert status == 200 and json.loads(payload)["input_tokens"] > 3_000
        stack["script"].set("ok")
        status, payload = raw_call(stack, "anthropic", dict(long, max_tokens=8))
        assert status == 200, payload[:300]
    finally:
        chat.render = original
    assert len(threads) >= 2 and all(name.startswith("gyre-tokenize") for name in threads), threads
