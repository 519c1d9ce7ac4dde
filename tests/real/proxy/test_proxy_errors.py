"""Rejected calls: API-shaped errors, and nothing recorded; keys, isolation, admin API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from proxy_fixtures import (shared_tiny_dir, ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, echo_script, new_key,
                                proxy_config, start_proxy, tool_loop_script)
except ImportError:
    from .proxy_fixtures import (shared_tiny_dir, ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, echo_script, new_key,
                                 proxy_config, start_proxy, tool_loop_script)

pytestmark = pytest.mark.timeout(60)
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from gyre.real.proxy.config import Limits

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    records = tmp_path_factory.mktemp("records")
    engine = ScriptedEngine(model, tool_loop_script())
    engine_thread = ServerThread(engine.application).start()
    config = proxy_config(model, records, {"e0": engine_thread.url},
                          limits=Limits(max_body_bytes=LIMIT, max_context_tokens=2048))
    proxy_thread, server = start_proxy(config)
    yield {"url": proxy_thread.url, "server": server, "engine": engine}
    proxy_thread.stop()
    engine_thread.stop()


def post(url: str, path: str, body: object, key: str | None, *, raw: bytes | None = None) -> tuple[int, dict]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["x-api-key"] = key
        headers["authorization"] = f"Bearer {key}"
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


MESSAGES = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}


def anthropic_error(status_body: tuple[int, dict], status: int, kind: str, needle: str) -> None:
    code, body = status_body
    assert code == status and body["type"] == "error" and body["error"]["type"] == kind, status_body
    assert needle in body["error"]["message"], body


def openai_error(status_body: tuple[int, dict], status: int, needle: str) -> None:
    code, body = status_body
    assert code == status and needle in body["error"]["message"], status_body
    assert {"message", "type", "param", "code"} <= set(body["error"])


def test_unknown_key_is_401_in_each_api_shape(stack):
    url = stack["url"]
    anthropic_error(post(url, "/v1/messages", MESSAGES, "nope"), 401, "authentication_error", "x-api-key")
    anthropic_error(post(url, "/v1/messages", MESSAGES, None), 401, "authentication_error", "x-api-key")
    openai_error(post(url, "/v1/chat/completions", CHAT, "nope"), 401, "key")
    openai_error(post(url, "/v1/responses", RESPONSES, "admin-secret-token"), 401, "key")


@pytest.mark.parametrize("path, body, needle", [
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
     "messages.0.role"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "messages.0.content.0"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"name": "t"}]}, "tools.0.input_schema"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "thinking": {"type": "sometimes"}}, "thinking.type"),
    ("/v1/messages", {"model": "m", "max_tokens": 4000, "messages": [{"role": "user", "content": "x"}]},
     "prompt is too long"),
])
def test_bad_anthropic_requests_name_the_problem(stack, path, body, needle):
    key = new_key(stack["url"], "bad-anthropic")
    anthropic_error(post(stack["url"], path, body, key), 400, "invalid_request_error", needle)
    assert stack["server"].recorder.state("bad-anthropic").requests == 0


@pytest.mark.parametrize("path, body, needle", [
    ("/v1/chat/completions", {"model": "m"}, "messages"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n:"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "retrieval"}]}, "tools.0"),
    ("/v1/responses", {"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ("/v1/responses", {"model": "m", "input": [{"type": "mystery"}]}, "input.0.type"),
    ("/v1/responses", {"model": "m", "input": "x", "tools": [{"type": "teleport", "name": "t"}]}, "tools.0"),
])
def test_bad_openai_requests_name_the_problem(stack, path, body, needle):
    key = new_key(stack["url"], "bad-openai")
    openai_error(post(stack["url"], path, body, key), 400, needle)
    assert stack["server"].recorder.state("bad-openai").requests == 0


def test_invalid_json_and_oversize_bodies(stack):
    key = new_key(stack["url"], "bad-body")
    anthropic_error(post(stack["url"], "/v1/messages", None, key, raw=b"{not json"), 400,
                    "invalid_request_error", "invalid JSON")
    big = dict(MESSAGES, messages=[{"role": "user", "content": "x" * (LIMIT + 10)}])
    anthropic_error(post(stack["url"], "/v1/messages", big, key), 413, "request_too_large", "limit")
    openai_error(post(stack["url"], "/v1/chat/completions", dict(CHAT, messages=big["messages"]), key), 413, "limit")
    assert stack["server"].recorder.state("bad-body").requests == 0
    assert "bad-body" not in stack["server"].recorder.store.executions()


def test_executions_are_isolated(stack):
    url = stack["url"]
    key_a, key_b = new_key(url, "iso-a"), new_key(url, "iso-b")
    tools = [{"name": "Bash", "description": "", "input_schema": {"type": "object"}}]
    status, first = post(url, "/v1/messages", dict(MESSAGES, max_tokens=200, tools=tools), key_a)
    assert status == 200
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    # B replays A's tool-call id with other arguments: B's cache knows nothing of it
    replay = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": [{"type": "tool_use", "id": call["id"], "name": "Bash",
                                                 "input": {"command": "rm -rf /"}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "x"}]}]
    status, _ = post(url, "/v1/messages", dict(MESSAGES, max_tokens=200, tools=tools, messages=replay), key_b)
    assert status == 200
    recorder = stack["server"].recorder
    assert recorder.state("iso-a").requests == 1 and recorder.state("iso-b").requests == 1
    b_record = recorder.store.read("iso-b")[0]
    b_prompt = recorder.chat.decode(b_record.input_ids.tolist())
    assert "rm -rf /" in b_prompt and all(r.execution_id == "iso-a" for r in recorder.store.read("iso-a"))


def test_admin_api(stack):
    url = stack["url"]
    assert admin(url, "GET", "/admin/executions", token="key-a")[0] == 401
    key = new_key(url, "admin-x")
    assert post(url, "/v1/messages", MESSAGES, key)[0] == 200
    status, listing = admin(url, "GET", "/admin/executions")
    row = next(r for r in listing["executions"] if r["execution_id"] == "admin-x")
    assert status == 200 and row["requests"] == 1 and row["route"] == "e0"
    status, stats = admin(url, "GET", "/admin/executions/admin-x/stats")
    assert status == 200 and stats["requests"] == 1 and stats["leaves"] == 1
    assert admin(url, "GET", "/admin/executions/nobody/stats")[0] == 404
    assert admin(url, "POST", "/admin/routes", {"execution_id": "admin-x", "engine": "nope"})[0] == 400
    assert admin(url, "POST", "/admin/engines/e0/drain", {})[1]["draining"] is True
    assert admin(url, "GET", "/admin/engines")[1]["engines"][0]["draining"] is True
    admin(url, "POST", "/admin/engines/e0/undrain")
    assert admin(url, "POST", "/admin/policy_version", {"version": 3})[1] == {"policy_version": 3}
    assert post(url, "/v1/messages", MESSAGES, key)[0] == 200
    assert stack["server"].recorder.store.read("admin-x")[-1].policy_version == 3
    admin(url, "POST", "/admin/policy_version", {"version": 0})


def _known(url: str) -> set[str]:
    return {row["execution_id"] for row in admin(url, "GET", "/admin/executions")[1]["executions"]}


def test_admin_starts_a_burst_of_executions_in_one_call(stack):
    url = stack["url"]
    status, body = admin(url, "POST", "/admin/executions/start",
                         {"executions": [{"execution_id": "burst-1", "engine": "e0"}, {"execution_id": "burst-2"}]})
    assert status == 200 and set(body["api_keys"]) == {"burst-1", "burst-2"}, body
    assert body["routes"] == {"burst-1": "e0"} and admin(url, "GET", "/admin/routes")[1]["routes"]["burst-1"] == "e0"
    assert post(url, "/v1/messages", MESSAGES, body["api_keys"]["burst-1"])[0] == 200  # each key works
    assert post(url, "/v1/messages", MESSAGES, body["api_keys"]["burst-2"])[0] == 200
    assert stack["server"].recorder.state("burst-2").requests == 1
    refusals = [({"executions": []}, "non-empty list"), ({"executions": "burst-3"}, "non-empty list"), ({}, "required"),
                ({"executions": [{"execution_id": "burst-3", "engine": "nope"}]}, "unknown engine 'nope'"),
                ({"executions": [{"execution_id": "burst-3"}, {"execution_id": "burst-3"}]}, "executions[1].execution_id"),
                ({"executions": [{"execution_id": "burst-3"}, {"execution_id": "burst 4"}]}, "executions[1].execution_id"),
                ({"executions": [{"execution_id": "burst-3", "engine": 3}]}, "executions[0].engine"),
                ({"executions": [{"execution_id": "burst-3", "key": "x"}]}, "executions[0]: expected"),
                ({"executions": ["burst-3"]}, "executions[0]: expected")]
    before = _known(url)
    for body, needle in refusals:
        status, answer = admin(url, "POST", "/admin/executions/start", body)
        assert status == 400 and needle in answer["error"], (body, answer)
    admin(url, "POST", "/admin/engines/e0/drain", {})
    try:
        status, answer = admin(url, "POST", "/admin/executions/start",
                               {"executions": [{"execution_id": "burst-3"}, {"execution_id": "burst-4", "engine": "e0"}]})
    finally:
        admin(url, "POST", "/admin/engines/e0/undrain")
    assert status == 400 and "draining" in answer["error"], answer
    assert _known(url) == before  # all or nothing: no refused call registered a key or set a route


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner,
                                                                                       max_size=3), max_leaves=8)
start_items = st.one_of(json_values, st.fixed_dictionaries(
    {"execution_id": st.one_of(st.text(max_size=10), st.integers())},
    optional={"engine": st.one_of(st.sampled_from(["e0", "nope"]), json_values)}))


@settings(max_examples=60, deadline=None)
@given(st.one_of(json_values, st.fixed_dictionaries({"executions": st.one_of(json_values, st.lists(start_items,
                                                                                                   max_size=4))})))
def test_any_start_body_is_answered_200_or_400_and_a_400_changes_nothing(stack, body):
    url = stack["url"]
    before = _known(url)
    status, answer = admin(url, "POST", "/admin/executions/start", body)
    assert status in (200, 400), (status, answer)
    if status == 400:
        assert answer["error"] and _known(url) == before, answer
    else:
        assert set(answer["api_keys"]) == {item["execution_id"] for item in body["executions"]}
        assert set(answer["api_keys"]) <= _known(url)
