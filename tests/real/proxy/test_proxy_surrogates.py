"""What the proxy emits, it accepts back: a model's lone surrogate becomes U+FFFD.

A tool call whose JSON spells ``"\\ud800"`` is returned with U+FFFD in its place by every
API, streaming or not; the official Anthropic SDK's ``messages.stream()`` parses it; and a
harness that echoes the history (the tool call and its result) gets its next turn, not a 400.
"""

from __future__ import annotations

import json

import pytest

anthropic = pytest.importorskip("anthropic")

try:
    from proxy_fixtures import build_tiny_tokenizer, scripted_proxy_stack, shared_tiny_dir
except ImportError:
    from .proxy_fixtures import build_tiny_tokenizer, scripted_proxy_stack, shared_tiny_dir

pytestmark = pytest.mark.timeout(120)
CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "\\ud800 x", "\\udfff": ["\\ud83d\\ude00"]}}\n</tool_call>'
BASH = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}
EXPECTED = {"command": "\ufffd x", "\ufffd": ["\U0001F600"]}  # a pair stays the character it encodes


def script(prompt: str) -> str:
    return "All done." if "<tool_response>" in prompt else CALL


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    with scripted_proxy_stack(model, script, tmp_path_factory.mktemp("records")) as stack:
        yield stack


@pytest.mark.parametrize("stream", [False, True])
def test_the_anthropic_sdk_reads_the_call_and_the_echoed_history_is_accepted(stack, stream):
    client = anthropic.Anthropic(base_url=stack["url"], api_key="key-a", max_retries=0)
    history = [{"role": "user", "content": "run it"}]
    if stream:
        with client.messages.stream(model="m", max_tokens=200, tools=[BASH], messages=history) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(model="m", max_tokens=200, tools=[BASH], messages=history)
    call = next(block for block in message.content if block.type == "tool_use")
    assert call.input == EXPECTED
    history += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]}]
    final = client.messages.create(model="m", max_tokens=200, tools=[BASH], messages=history)
    assert final.content[0].text == "All done."


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}],
                              "tools": [{"type": "function", "function": {"name": "Bash"}}]}),
    ("/v1/responses", {"model": "m", "input": "go", "tools": [{"type": "function", "name": "Bash"}]})])
def test_openai_apis_return_valid_unicode_arguments(stack, path, body):
    import urllib.request

    request = urllib.request.Request(stack["url"] + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer key-b", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
    raw.decode("utf-8")  # strict
    assert b"\\ud8" not in raw.lower() and b"\\udf" not in raw.lower(), raw
    answer = json.loads(raw)
    calls = answer["choices"][0]["message"]["tool_calls"] if "choices" in answer else \
        [item for item in answer["output"] if item["type"] == "function_call"]
    arguments = calls[0]["function"]["arguments"] if "choices" in answer else calls[0]["arguments"]
    assert json.loads(arguments) == EXPECTED
