"""Request parsing and response writing of the proxy as pure functions (no aiohttp, no tokenizer).

Properties, for bodies drawn from each API's schema, valid and subtly broken:
- parsing either yields a fully typed ``ChatRequest`` or raises a 4xx
  ``ApiError`` naming a field; nothing else ever escapes (no 500);
- every error renders in its API's own error shape, as valid UTF-8 JSON;
- every documented valid body parses;
- responses and stream events written for hostile model outputs (lone
  surrogates, NaN, template tags) are valid JSON in valid UTF-8.

The fixed-seed short run is part of ``make check``; ``tests/real/proxy/test_proxy_fuzz.py``
runs the same strategies against a live proxy.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.real.proxy import fields
from gyre.real.proxy.api import anthropic, openai_chat, openai_responses
from gyre.real.proxy.request import ApiError, ChatRequest, EngineRejected, Finished, LastChunk, Overloaded, Prepared
from gyre.real.proxy.toolcalls import OutputEvent, StopHoldback, ToolCall, parse_tool_call, trim_stop

try:
    from proxy_bodies import APIS, any_body, valid_body
    from hypothesis_budget import examples
except ImportError:  # run from another rootdir
    from .proxy_bodies import APIS, any_body, valid_body  # type: ignore[no-redef]

    def examples(full: int) -> int:
        return full

MODULES = {"anthropic": anthropic, "chat": openai_chat, "responses": openai_responses}
FUZZ = settings(max_examples=examples(400), deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def parse(api: str, raw: bytes) -> ChatRequest:
    body = fields.load_body(raw)
    if api == "anthropic":
        return anthropic.parse(body, {})
    return MODULES[api].parse(body, {}, 128)


def encode(body: dict) -> bytes:
    return json.dumps(body).encode()  # ASCII: lone surrogates travel as \ud800 escapes, as clients send them


def _no_surrogates(value: object) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
        return True
    except UnicodeEncodeError:
        return False


def check_error(api: str, error: ApiError) -> None:
    assert 400 <= error.status < 500 and error.kind == "invalid_request", (error.status, error.message)
    status, body = MODULES[api].error_body(error)
    assert status == error.status
    decoded = json.loads(fields.json_bytes(body).decode("utf-8"))
    if api == "anthropic":
        assert decoded["type"] == "error" and decoded["error"]["type"] == "invalid_request_error"
    else:
        assert set(decoded["error"]) == {"message", "type", "param", "code"}
        assert decoded["error"]["type"] == "invalid_request_error"


def check_request(request: ChatRequest) -> None:
    assert isinstance(request.max_tokens, int) and request.max_tokens >= 1
    assert isinstance(request.stream, bool) and isinstance(request.include_usage, bool)
    for value, low, high in ((request.temperature, 0, 2), (request.top_p, 0, 1)):
        assert value is None or (isinstance(value, float) and math.isfinite(value) and low <= value <= high)
    assert all(isinstance(s, str) and s for s in request.stop)
    issued = set()
    for message in request.messages:
        assert message["role"] in ("system", "user", "assistant", "tool")
        assert isinstance(message["content"], str)
        if message["role"] == "assistant":
            for call in message["tool_calls"]:
                assert isinstance(call["id"], str) and isinstance(call["name"], str)
                issued.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in issued
    assert _no_surrogates(request.messages) and _no_surrogates(request.tools)


@pytest.mark.parametrize("api", APIS)
def test_any_body_parses_or_is_a_named_4xx(api):
    @FUZZ
    @given(body=any_body(api))
    def run(body):
        try:
            request = parse(api, encode(body))
        except ApiError as error:
            check_error(api, error)
        else:
            check_request(request)

    run()


@pytest.mark.parametrize("api", APIS)
def test_valid_bodies_parse(api):
    @FUZZ
    @given(body=valid_body(api))
    def run(body):
        check_request(parse(api, encode(body)))

    run()


@pytest.mark.parametrize("raw, needle", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"), (b"{\"a\": NaN}", "NaN"), (b"[1]", "JSON object"),
    (b"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}", "messages.0.content"),
    (b"\xff\xfe", "invalid JSON"),
])
def test_bodies_that_are_not_usable_json(raw, needle):
    with pytest.raises(ApiError) as info:
        fields.load_body(raw)
    assert info.value.status == 400 and needle in info.value.message


CHAT_BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_BASE = dict(CHAT_BASE, max_tokens=5)
RESPONSES_BASE = {"model": "m", "input": "hi"}


@pytest.mark.parametrize("api, change, param", [
    ("chat", {"stream": True, "stream_options": 5}, "stream_options"),
    ("chat", {"tools": 5}, "tools"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": 5}, {"role": "user", "content": "x"}]},
     "messages.0.tool_calls"),
    ("chat", {"stream": "false"}, "stream"),
    ("chat", {"max_tokens": 0}, "max_tokens"),
    ("chat", {"temperature": -1}, "temperature"),
    ("chat", {"top_p": 0}, "top_p"),
    ("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "r"}]},
     "messages.1.tool_call_id"),
    ("anthropic", {"tools": 5}, "tools"),
    ("anthropic", {"max_tokens": 0}, "max_tokens"),
    ("anthropic", {"stream": "false"}, "stream"),
    ("anthropic", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]},
     "messages.1"),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
     "messages.0.content.0.tool_use_id"),
    ("responses", {"input": [{"type": "reasoning", "summary": 5}, {"role": "user", "content": "x"}]},
     "input.0.summary"),
    ("responses", {"tools": 5}, "tools"),
    ("responses", {"max_output_tokens": 0}, "max_output_tokens"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, "input.0.call_id"),
    # ``model`` is echoed into every chunk and record: a 100 KB one made a 5 MB stream
    ("anthropic", {"model": "m" * 257}, "model"),
    ("anthropic", {"stop_sequences": "."}, "stop_sequences"),  # a list in Anthropic's API (a string is OpenAI's)
    ("chat", {"model": "m" * 100_000}, "model"),
    ("responses", {"model": "m" * 257}, "model"),
    # empty content where the API itself refuses it (api/anthropic.py, api/openai_chat.py module docs)
    ("anthropic", {"messages": [{"role": "user", "content": ""}]}, "messages.0"),
    ("anthropic", {"messages": [{"role": "user", "content": []}]}, "messages.0"),
    ("anthropic", {"messages": [{"role": "user", "content": " \n"}]}, "messages.0.content"),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
     "messages.0.content.0.text"),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\t"}]}]},
     "messages.0.content.0.text"),
    ("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a", "tool_calls": []},
                           {"role": "user", "content": "y"}]}, "messages.1.tool_calls"),
])
def test_wrong_values_are_400s_naming_the_field(api, change, param):
    base = {"anthropic": ANTHROPIC_BASE, "chat": CHAT_BASE, "responses": RESPONSES_BASE}[api]
    with pytest.raises(ApiError) as info:
        parse(api, encode(dict(base, **change)))
    assert info.value.status == 400 and info.value.param == param, (info.value.param, info.value.message)


# -- writing: hostile model outputs always give valid JSON in UTF-8 ---------------------------

hostile_text = st.one_of(st.text(max_size=20), st.sampled_from(["\ud800", "a\udc00", "\x00", "\ufffd", "</think>"]))
hostile_args = st.dictionaries(st.sampled_from(["a", "\ud800"]), st.one_of(
    hostile_text, st.floats(), st.integers(-2**70, 2**70)), max_size=3)


def _prepared(api: str, **request: object) -> Prepared:
    chat = ChatRequest(api=api, model="m", messages=[{"role": "user", "content": "x"}], max_tokens=8, **request)
    return Prepared(request=chat, execution_id="x", request_id="r1", prompt_text="p", input_ids=[1], reused_ids=0,
                    in_thinking=False, started_at=0.0)


def _check_bytes(data: bytes, sse: bool) -> None:
    text = data.decode("utf-8")  # strict: valid UTF-8
    if not sse:
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
        return
    assert "HTTP/1.1" not in text
    # SSE lines end only at CR or LF (the SDKs split the bytes, as here); str.splitlines() would also
    # split inside a JSON string at U+0085 or U+2028, which the proxy writes raw, as JSON allows
    for block in data.split(b"\n\n"):
        for line in block.splitlines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                json.loads(line[6:].decode("utf-8"), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


@st.composite
def outputs(draw):
    events = []
    for k in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            events.append(OutputEvent(draw(st.sampled_from(["text", "thinking"])), draw(hostile_text)))
        else:
            args = draw(hostile_args)
            events.append(OutputEvent("tool_call", f"call_{k}", ToolCall("Bash", args, "raw")))
    calls = [{"id": e.text, "name": e.call.name, "arguments": e.call.arguments} for e in events if e.call]
    finished = Finished(output_ids=[1], logprobs=[-0.5], text=draw(hostile_text), thinking=draw(hostile_text),
                        tool_calls=calls, stop_reason=draw(st.sampled_from(["stop", "length", "tool_calls"])),
                        stop_sequence=None, input_tokens=1, output_tokens=1, tokens=[draw(hostile_text)])
    end = draw(st.sampled_from([finished, Overloaded("down"), EngineRejected("bad"), RuntimeError("bug")]))
    return events, end


async def _collect(module, prepared, events, end):
    async def source():
        for event in events:
            yield event
        if isinstance(end, BaseException):
            raise end
        yield end

    return [chunk async for chunk in module.stream(source(), prepared)]


@pytest.mark.parametrize("api", APIS)
def test_hostile_outputs_always_write_valid_json(api):
    """Every stream is valid JSON events, and it ends with exactly one ``LastChunk`` (written
    together with the HTTP stream's end), whether the call finished or failed."""
    module = MODULES[api]

    @FUZZ
    @given(output=outputs(), logprobs=st.booleans())
    def run(output, logprobs):
        events, end = output
        prepared = _prepared(api, logprobs=logprobs and api == "chat")
        chunks = asyncio.run(_collect(module, prepared, events, end))
        assert chunks and isinstance(chunks[-1], LastChunk)
        assert not any(isinstance(chunk, LastChunk) for chunk in chunks[:-1])
        _check_bytes(b"".join(chunks), sse=True)
        if isinstance(end, Finished):
            _check_bytes(fields.json_bytes(module.response(prepared, end)), sse=False)

    run()


def test_tool_calls_with_nan_are_not_tool_calls():
    assert parse_tool_call('{"name": "Bash", "arguments": {"n": NaN}}') is None
    # a lone surrogate the JSON spells is replaced (what the proxy returns must be valid Unicode)
    assert parse_tool_call('{"name": "Bash", "arguments": {"n": "\\ud800"}}').arguments == {"n": "\ufffd"}


@given(text=st.text(alphabet="ab.\n", max_size=40), stop=st.sampled_from([".", "ab", "\n\n"]),
       cuts=st.lists(st.integers(0, 40), max_size=5))
@settings(max_examples=examples(300), deadline=None, derandomize=True)
def test_stop_holdback_streams_what_trim_stop_returns(text, stop, cuts):
    index = text.find(stop)
    text = text[:index + len(stop)] if index >= 0 else text
    matched = stop if index >= 0 else None
    holdback, pieces, last = StopHoldback([stop, "zz"]), [], 0
    for cut in sorted(c for c in cuts if c <= len(text)) + [len(text)]:
        pieces.append(holdback.push(text[last:cut]))
        last = cut
    assert "".join(pieces) + holdback.finish(matched) == trim_stop(text, matched)
    assert matched is None or not trim_stop(text, matched).endswith(stop) or stop not in text


def test_parsing_imports_no_heavy_stack():
    import subprocess
    import sys

    code = ("import sys; import gyre.real.proxy.api.anthropic, gyre.real.proxy.api.openai_chat, "
            "gyre.real.proxy.api.openai_responses; "
            "print(sorted(m for m in ('aiohttp', 'torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("api,body", [
    ("anthropic", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "text", "text": ""}, {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": ""}]}], "system": ""}),
    ("anthropic", {"messages": [{"role": "user", "content": "x"},
                                {"role": "assistant", "content": [{"type": "text", "text": "\n\n"}]},
                                {"role": "user", "content": "y"}]}),
    ("chat", {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": ""}]}),
    ("chat", {"messages": [{"role": "user", "content": []}, {"role": "assistant", "content": ""},
                           {"role": "user", "content": "y"}]}),
    ("responses", {"input": [{"role": "user", "content": ""}]}),
])
def test_empty_content_the_api_accepts_is_accepted(api, body):
    """What the proxy emits (an empty answer) and what the real API takes back, parses."""
    base = {"anthropic": ANTHROPIC_BASE, "chat": CHAT_BASE, "responses": RESPONSES_BASE}[api]
    assert isinstance(parse(api, encode(dict(base, **body))), ChatRequest)
