"""OpenAI Chat Completions: request parsing, responses and the chunk stream.

Accepted: roles ``system``, ``developer`` (treated as system), ``user``,
``assistant`` (``tool_calls`` with JSON-string arguments), ``tool``; content as
a string or ``text`` parts; function tools; ``max_tokens`` or
``max_completion_tokens`` (>= 1; default from the config); ``stream`` (a
boolean) with ``stream_options.include_usage``; ``temperature`` in [0, 2],
``top_p`` in (0, 1], ``stop`` (trimmed from the answer); ``logprobs`` (the
sampled tokens' log-probabilities; ``top_logprobs`` must be 0); ``n`` must be
1. A tool message must answer a tool call of an earlier assistant message.
``tool_choice``, ``parallel_tool_calls``, ``response_format``, ``seed``,
``user``, ``metadata``, ``reasoning_effort``, ``store`` are accepted and
ignored. Image/audio parts and other tool types are 400s naming the field.

Empty content, as the API answers it: ``""`` and ``[]`` content are accepted
(openai/openai-python issue #1812: the API answered 200 to an empty content
array), an assistant's ``tool_calls: []`` is a 400 with the API's wording
(openai/openai-node pull #1341 quotes it). The Responses API has no empty-content
rule the proxy knows of: there it accepts.

Shared with ``proxy.api.openai_responses``: ``error_body`` (the OpenAI error shape; an
engine outage is a 503 with code ``server_is_overloaded``, which the SDKs and
Codex retry) and ``parse_arguments``.
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncGenerator, AsyncIterator

from gyre.real.proxy import fields
from gyre.real.proxy.request import (
    ApiError,
    ChatRequest,
    Finished,
    LastChunk,
    Prepared,
    bad_request,
    check_tool_results,
    error_for,
)
from gyre.real.proxy.toolcalls import OutputEvent

ID_PREFIX = "call_"
FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}
ERROR_TYPES = {"invalid_request": "invalid_request_error", "authentication": "invalid_request_error",
               "too_large": "invalid_request_error", "overloaded": "server_error", "not_found": "invalid_request_error",
               "internal": "server_error", "permission": "invalid_request_error"}
ERROR_CODES = {"authentication": "invalid_api_key", "too_large": "request_too_large",
               "overloaded": "server_is_overloaded"}


def error_body(error: ApiError) -> tuple[int, dict[str, Any]]:
    status = 503 if error.kind == "overloaded" else error.status
    kind = ERROR_TYPES.get(error.kind) or ("invalid_request_error" if status < 500 else "server_error")
    return status, {"error": {"message": error.message, "type": kind, "param": error.param,
                              "code": ERROR_CODES.get(error.kind)}}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_arguments(value: Any, where: str) -> dict[str, Any] | str:
    """Decoded tool-call arguments; a string that is not a JSON object stays a string
    (chat templates render string arguments verbatim)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise bad_request(f"{where}: must be a JSON string")
    try:
        parsed = json.loads(value, parse_constant=_no_constant) if value.strip() else {}
    except (ValueError, RecursionError):
        return value
    return parsed if isinstance(parsed, dict) else value


def text_content(value: Any, where: str, part_types: tuple[str, ...] = ("text",)) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where}: expected a string or a list of content parts")
    parts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in part_types:
            raise bad_request(f"{where}.{i}.type: unsupported content part type {kind!r:.40}")
        parts.append(fields.string(part, "text", where=f"{where}.{i}", required=True))
    return "\n".join(parts)


def _assistant(message: dict[str, Any], where: str) -> dict[str, Any]:
    if message.get("tool_calls") == []:  # the proxy never answers one: only a client builds it
        raise bad_request(f"{where}.tool_calls: empty array. Expected an array with minimum length 1, but got an "
                          "empty array instead.", f"{where}.tool_calls")
    calls = []
    for k, call in enumerate(fields.objects(fields.array(message, "tool_calls", where=where), f"{where}.tool_calls")):
        at = f"{where}.tool_calls.{k}"
        call_id = fields.string(call, "id", where=at, required=True)
        if call.get("type", "function") != "function":
            raise bad_request(f"{at}.type: only 'function' tool calls are supported")
        function = fields.mapping(call, "function", where=at)
        name = fields.string(function, "name", where=f"{at}.function", required=True)
        calls.append({"id": call_id, "name": name,
                      "arguments": parse_arguments(function.get("arguments", "{}"), f"{at}.function.arguments")})
    return {"role": "assistant", "content": text_content(message.get("content"), f"{where}.content"),
            "tool_calls": calls, "thinking": fields.string(message, "reasoning_content", where=where, default="")}


def _message(message: dict[str, Any], i: int) -> dict[str, Any]:
    role = message.get("role")
    where = f"messages.{i}"
    fields.string(message, "name", where=where)
    if role in ("system", "developer", "user"):
        return {"role": "user" if role == "user" else "system",
                "content": text_content(message.get("content"), f"{where}.content")}
    if role == "tool":
        return {"role": "tool", "tool_call_id": fields.string(message, "tool_call_id", where=where, required=True),
                "content": text_content(message.get("content"), f"{where}.content"), "where": f"{where}.tool_call_id"}
    if role != "assistant":
        raise bad_request(f"{where}.role: unsupported role {role!r:.40}")
    return _assistant(message, where)


def canonical_tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(fields.objects(fields.array({"tools": tools}, "tools"), "tools")):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict):
            raise bad_request(f"tools.{i}: only function tools with a function object are supported")
        at = f"tools.{i}.function"
        out.append({"name": fields.string(function, "name", where=at, required=True),
                    "description": fields.string(function, "description", where=at, default=""),
                    "parameters": fields.mapping(function, "parameters", where=at)
                    or {"type": "object", "properties": {}}})
    return out


def _max_tokens(body: dict[str, Any], default: int) -> int:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return fields.integer(body, name, minimum=1, default=default)


def parse(body: dict[str, Any], hints: dict[str, str], default_max_tokens: int) -> ChatRequest:
    """A ``ChatRequest`` from a Chat Completions body; raises 400 ``ApiError`` naming the field."""
    try:
        model = fields.string(body, "model", required=True, max_chars=fields.MODEL_MAX_CHARS)
        messages = fields.objects(fields.array(body, "messages", required=True, non_empty=True), "messages")
        if fields.integer(body, "n", default=1) != 1:
            raise bad_request("n: only n=1 is supported")
        if fields.integer(body, "top_logprobs", default=0, minimum=0, maximum=20):
            raise bad_request("top_logprobs: alternatives are not available from this proxy; use 0")
        stream = fields.boolean(body, "stream")
        options = fields.mapping(body, "stream_options")
        if options and not stream:
            raise bad_request("stream_options: only allowed when stream is true")
        for name in ("response_format", "metadata"):
            fields.mapping(body, name)
        canonical = [_message(m, i) for i, m in enumerate(messages)]
        check_tool_results(canonical, "messages")
        return ChatRequest(api="chat", model=model, messages=canonical, tools=canonical_tools(body.get("tools")),
                           max_tokens=_max_tokens(body, default_max_tokens), stream=stream,
                           temperature=fields.number(body, "temperature", low=0.0, high=2.0),
                           top_p=fields.number(body, "top_p", low=0.0, high=1.0, low_open=True),
                           stop=fields.stop_list(body, "stop", limit=4), hints=hints,
                           include_usage=fields.boolean(options, "include_usage", where="stream_options"),
                           logprobs=fields.boolean(body, "logprobs"))
    except RecursionError:
        raise fields.too_deep() from None


def _tool_call(call: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    out = {"id": call["id"], "type": "function",
           "function": {"name": call["name"], "arguments": fields.json_bytes(call["arguments"]).decode()}}
    return out if index is None else {"index": index, **out}


def _usage(prepared: Prepared, finished: Finished) -> dict[str, Any]:
    return {"prompt_tokens": len(prepared.input_ids), "completion_tokens": finished.output_tokens,
            "total_tokens": len(prepared.input_ids) + finished.output_tokens}


def _logprobs(prepared: Prepared, finished: Finished) -> dict[str, Any] | None:
    """``choices[].logprobs``: one entry per output token the engine sampled (the stop token excluded)."""
    if not prepared.request.logprobs:
        return None
    return {"content": [{"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace")),
                         "top_logprobs": []} for token, logprob in zip(finished.tokens, finished.logprobs)],
            "refusal": None}


def response(prepared: Prepared, finished: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": finished.text or None}
    if finished.thinking:
        message["reasoning_content"] = finished.thinking
    if finished.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in finished.tool_calls]
    return {"id": f"chatcmpl-{prepared.request_id}", "object": "chat.completion", "created": int(time.time()),
            "model": prepared.request.model,
            "choices": [{"index": 0, "message": message, "finish_reason": FINISH[finished.stop_reason],
                         "logprobs": _logprobs(prepared, finished)}],
            "usage": _usage(prepared, finished)}


def _chunk(prepared: Prepared, delta: dict[str, Any], finish: str | None = None,
           logprobs: dict[str, Any] | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    body = {"id": f"chatcmpl-{prepared.request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": prepared.request.model, "choices": [choice]}
    return b"data: " + fields.json_bytes(body) + b"\n\n"


def stream_error(error: ApiError) -> bytes:
    """The error chunk that ends a stream (what the OpenAI API sends mid-stream)."""
    return b"data: " + fields.json_bytes(error_body(error)[1]) + b"\n\n"


def _final(prepared: Prepared, item: Finished) -> list[bytes]:
    out = [_chunk(prepared, {}, FINISH[item.stop_reason], _logprobs(prepared, item))]
    if prepared.request.include_usage:
        body = {"id": f"chatcmpl-{prepared.request_id}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": prepared.request.model, "choices": [],
                "usage": _usage(prepared, item)}
        out.append(b"data: " + fields.json_bytes(body) + b"\n\n")
    return out + [b"data: [DONE]\n\n"]


async def stream(events: AsyncIterator[OutputEvent | Finished], prepared: Prepared) -> AsyncGenerator[bytes, None]:
    """Chat completion chunks; the chunks of one generation step go out in one write.

    With ``logprobs``, the log-probabilities of all tokens come with the final chunk."""
    pending = [_chunk(prepared, {"role": "assistant", "content": ""})]
    calls = 0
    try:
        async for item in events:
            if isinstance(item, Finished):
                yield LastChunk(b"".join([*pending, *_final(prepared, item)]))
                return
            if item.kind == "text":
                pending.append(_chunk(prepared, {"content": item.text}))
            elif item.kind == "thinking":
                pending.append(_chunk(prepared, {"reasoning_content": item.text}))
            else:
                tool = item.call
                assert tool is not None  # a tool_call event carries its call (toolcalls.OutputEvent)
                call = {"id": item.text, "name": tool.name, "arguments": tool.arguments}
                pending.append(_chunk(prepared, {"tool_calls": [_tool_call(call, calls)]}))
                calls += 1
            yield b"".join(pending)
            pending = []
    except Exception as exc:  # noqa: BLE001 - once the stream began, every failure is an in-stream error chunk
        error = error_for(exc)
        if error.kind == "overloaded":
            error = ApiError(503, "overloaded", f"The server is overloaded: {exc}")
        yield LastChunk(b"".join([*pending, stream_error(error)]))
