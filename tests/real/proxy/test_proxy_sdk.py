"""Conformance with the official ``anthropic`` and ``openai`` SDKs, against a scripted engine.

The proxy runs in front of ``ScriptedEngine`` (SGLang's ``/generate`` contract)
with the tiny locally-trained tokenizer and its Qwen-style chat template. Each
test uses its own execution key, and checks both what the SDK parsed and what
was recorded (``check_records``: outputs, behaviour log-probabilities, tree).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

try:
    from proxy_fixtures import (build_tiny_tokenizer, check_records, new_key, scripted_proxy_stack, shared_tiny_dir,
                                tool_loop_script)
except ImportError:  # tests/real imported as a package
    from .proxy_fixtures import (build_tiny_tokenizer, check_records, new_key, scripted_proxy_stack, shared_tiny_dir,
                                 tool_loop_script)

pytestmark = pytest.mark.timeout(60)
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    with scripted_proxy_stack(model, tool_loop_script(command="ls -la"), tmp_path_factory.mktemp("records")) as stack:
        yield stack


def assert_anthropic_event_order(events: list[str]) -> None:
    """message_start (content_block_start ping? content_block_delta* content_block_stop)+ message_delta message_stop."""
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"], events
    body, blocks, first = events[1:-2], 0, True
    while body:
        assert body.pop(0) == "content_block_start", events
        if first and body and body[0] == "ping":
            body.pop(0)
        first = False
        while body and body[0] == "content_block_delta":
            body.pop(0)
        assert body and body.pop(0) == "content_block_stop", events
        blocks += 1
    assert blocks >= 1


def _anthropic(stack, execution):
    return anthropic.Anthropic(base_url=stack["url"], api_key=new_key(stack["url"], execution), max_retries=0)


def _openai(stack, execution):
    return openai.OpenAI(base_url=stack["url"] + "/v1", api_key=new_key(stack["url"], execution), max_retries=0)


def test_anthropic_create_tool_round_trip_and_stream(stack):
    client = _anthropic(stack, "sdk-anthropic")
    system = [{"type": "text", "text": "You are a test agent.", "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(model="m", max_tokens=200, system=system, tools=[BASH],
                                   messages=[{"role": "user", "content": "list files"}])
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "Bash" and call.input == {"command": "ls -la"}
    history = [{"role": "user", "content": "list files"}, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt"}]}]
    with client.messages.stream(model="m", max_tokens=200, system=system, tools=[BASH], messages=history,
                                thinking={"type": "adaptive"}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and text == final.content[0].text == "All done. Output: a.txt"
    records = check_records(stack["records"], "sdk-anthropic", stack["model"])
    assert len(records) == 2
    # the second input starts with the first call's input and output, token for token (TITO reuse)
    assert records[1].input_ids[: len(records[0].sequence)].tolist() == records[0].sequence.tolist()
    stats = stack["server"].recorder.stats("sdk-anthropic")
    assert stats["roots"] == 1 and stats["leaves"] == 1 and stats["requests"] == 2


def test_anthropic_reserialized_history_still_matches(stack):
    """A harness re-serializes tool input (key order, spacing): the cache restores it."""
    client = _anthropic(stack, "sdk-reserialize")
    tools = [{"name": "Bash", "description": "x", "input_schema": {"type": "object"}}]
    first = client.messages.create(model="m", max_tokens=200, tools=tools,
                                   messages=[{"role": "user", "content": "go"}])
    call = next(b for b in first.content if b.type == "tool_use")
    mangled = [{"type": "text", "text": first.content[0].text},
               {"type": "tool_use", "id": call.id, "name": "Bash", "input": {"command": "ls  -la", "extra": 1}}]
    client.messages.create(model="m", max_tokens=200, tools=tools, messages=[
        {"role": "user", "content": "go"}, {"role": "assistant", "content": mangled},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]}])
    stats = stack["server"].recorder.stats("sdk-reserialize")
    assert stats["leaves"] == 1, "restored tool calls keep one path"


def test_anthropic_beta_query_system_entries_and_count_tokens(stack):
    client = _anthropic(stack, "sdk-beta")
    body = {"model": "m", "max_tokens": 50, "stream": True, "system": "sys",
            "messages": [{"role": "system", "content": "extra system"}, {"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {"effort": "low"},
            "context_management": {"edits": []}, "metadata": {"user_id": "u"}}
    request = urllib.request.Request(stack["url"] + "/v1/messages?beta=true", data=json.dumps(body).encode(),
                                     headers={"x-api-key": client.api_key, "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        events = [line[7:] for line in response.read().decode().splitlines() if line.startswith("event: ")]
    assert_anthropic_event_order(events)
    assert events.count("content_block_start") == 2  # text, then the tool_use block
    count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}], tools=[BASH])
    assert count.input_tokens > 10
    assert len(stack["server"].recorder.store.read("sdk-beta")) == 1, "count_tokens records nothing"


def test_openai_chat_create_stream_usage_and_tools(stack):
    client = _openai(stack, "sdk-chat")
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "Bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": choice.message.content,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": "Bash", "arguments": '{"command":"ls -la"}'}}]},
               {"role": "tool", "tool_call_id": call.id, "content": "b.txt"}]
    chunks = list(client.chat.completions.create(model="m", messages=history, tools=tools, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "All done. Output: b.txt"
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-2].choices[0].finish_reason == "stop"
    records = check_records(stack["records"], "sdk-chat", stack["model"])
    assert stack["server"].recorder.stats("sdk-chat")["leaves"] == 1 and len(records) == 2


def test_openai_responses_stream_with_function_call_output(stack):
    client = _openai(stack, "sdk-responses")
    tools = [{"type": "function", "name": "Bash", "parameters": {"type": "object"}},
             {"type": "web_search"},
             {"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "read", "parameters": {}}]}]
    with client.responses.stream(model="m", instructions="be brief", input="go", tools=tools, store=False) as stream:
        first = stream.get_final_response()
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "Bash" and json.loads(call.arguments) == {"command": "ls -la"}
    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "c.txt"}]
    with client.responses.stream(model="m", instructions="be brief", input=history, tools=tools,
                                 store=False) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "All done. Output: c.txt"
    assert final.status == "completed" and final.usage.output_tokens > 0
    check_records(stack["records"], "sdk-responses", stack["model"])
    assert stack["server"].recorder.stats("sdk-responses")["leaves"] == 1


def test_head_and_get_root_answer_without_key(stack):
    for method in ("HEAD", "GET"):
        with urllib.request.urlopen(urllib.request.Request(stack["url"] + "/", method=method), timeout=10) as r:
            assert r.status == 200
