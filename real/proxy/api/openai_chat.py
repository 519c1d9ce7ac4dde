"""OpenAI Chat Completions: request parsing, responses and the chunk stream.

Accepted: roles ``system``, ``developer`` (treated as system), ``user``,
``assistant`` (``tool_calls`` with JSON-string arguments), ``tool``; content as
a string or ``text`` parts; function tools; ``max_tokens`` or
``max_completion_tokens`` (default from the config); ``stream`` with
``stream_options.include_usage``; ``temperature``, ``top_p``, ``stop``; ``n``
must be 1. ``tool_choice``, ``parallel_tool_calls``, ``response_format``,
``seed``, ``user``, ``metadata``, ``reasoning_effort``, ``store`` are accepted
and ignored. Image/audio parts and other tool types are 400s naming the field.

Shared with ``proxy.api.openai_responses``: ``error_body`` (the OpenAI error shape; an
engine outage is a 503 with code ``server_is_overloaded``, which the SDKs and
Codex retry) and ``parse_arguments``.
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from gyre.real.proxy.model_call import ApiError, ChatRequest, Finished, Prepared, bad_request
from gyre.real.proxy.generation import Overloaded
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
    return status, {"error": {"message": error.message, "type": ERROR_TYPES.get(error.kind, "server_error"),
                              "param": None, "code": ERROR_CODES.get(error.kind)}}


def parse_arguments(value: Any, where: str) -> dict[str, Any] | str:
    """Decoded tool-call arguments; a string that is not a JSON object stays a string
    (chat templates render string arguments verbatim)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise bad_request(f"{where}: must be a JSON string")
    try:
        parsed = json.loads(value) if value.strip() else {}
    except ValueError:
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
        if kind not in part_types or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.{i}: unsupported content part type {kind!r}")
        parts.append(part["text"])
    return "\n".join(parts)


def _message(message: Any, i: int) -> dict[str, Any]:
    role = message.get("role") if isinstance(message, dict) else None
    where = f"messages.{i}"
    if role in ("system", "developer", "user"):
        return {"role": "user" if role == "user" else "system",
                "content": text_content(message.get("content"), f"{where}.content")}
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise bad_request(f"{where}.tool_call_id: required string")
        return {"role": "tool", "tool_call_id": message["tool_call_id"],
                "content": text_content(message.get("content"), f"{where}.content")}
    if role != "assistant":
        raise bad_request(f"{where}.role: unsupported role {role!r}")
    calls = []
    for k, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(call.get("id"), str):
            raise bad_request(f"{where}.tool_calls.{k}: needs a string id and function.name")
        calls.append({"id": call["id"], "name": function["name"],
                      "arguments": parse_arguments(function.get("arguments", "{}"), f"{where}.tool_calls.{k}")})
    return {"role": "assistant", "content": text_content(message.get("content"), f"{where}.content"),
            "tool_calls": calls, "thinking": str(message.get("reasoning_content") or "")}


def canonical_tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str):
            raise bad_request(f"tools.{i}: only function tools with a function.name are supported")
        out.append({"name": function["name"], "description": function.get("description", ""),
                    "parameters": function.get("parameters") or {"type": "object", "properties": {}}})
    return out


def parse(body: dict[str, Any], hints: dict[str, str], default_max_tokens: int) -> ChatRequest:
    if not isinstance(body.get("model"), str):
        raise bad_request("model: required string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: required non-empty list")
    if body.get("n", 1) != 1:
        raise bad_request("n: only n=1 is supported")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_request("max_tokens: must be an integer >= 1")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("stop: must be a string or a list of strings")
    return ChatRequest(api="chat", model=body["model"], messages=[_message(m, i) for i, m in enumerate(messages)],
                       tools=canonical_tools(body.get("tools")), max_tokens=max_tokens,
                       stream=bool(body.get("stream", False)), temperature=body.get("temperature"),
                       top_p=body.get("top_p"), stop=stop, hints=hints)


def _tool_call(call: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    out = {"id": call["id"], "type": "function",
           "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
    return out if index is None else {"index": index, **out}


def _usage(prepared: Prepared, finished: Finished) -> dict[str, Any]:
    return {"prompt_tokens": len(prepared.input_ids), "completion_tokens": finished.output_tokens,
            "total_tokens": len(prepared.input_ids) + finished.output_tokens}


def response(prepared: Prepared, finished: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": finished.text or None}
    if finished.thinking:
        message["reasoning_content"] = finished.thinking
    if finished.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in finished.tool_calls]
    return {"id": f"chatcmpl-{prepared.request_id}", "object": "chat.completion", "created": int(time.time()),
            "model": prepared.request.model,
            "choices": [{"index": 0, "message": message, "finish_reason": FINISH[finished.stop_reason],
                         "logprobs": None}],
            "usage": _usage(prepared, finished)}


def _chunk(prepared: Prepared, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": f"chatcmpl-{prepared.request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": prepared.request.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


async def stream(events: AsyncIterator[OutputEvent | Finished], prepared: Prepared,
                 include_usage: bool) -> AsyncIterator[bytes]:
    """Chat completion chunks; the chunks of one generation step go out in one write."""
    pending = [_chunk(prepared, {"role": "assistant", "content": ""})]
    calls = 0
    try:
        async for item in events:
            if isinstance(item, Finished):
                pending.append(_chunk(prepared, {}, FINISH[item.stop_reason]))
                if include_usage:
                    body = {"id": f"chatcmpl-{prepared.request_id}", "object": "chat.completion.chunk",
                            "created": int(time.time()), "model": prepared.request.model, "choices": [],
                            "usage": _usage(prepared, item)}
                    pending.append(b"data: " + json.dumps(body).encode() + b"\n\n")
                yield b"".join([*pending, b"data: [DONE]\n\n"])
                return
            if item.kind == "text":
                pending.append(_chunk(prepared, {"content": item.text}))
            elif item.kind == "thinking":
                pending.append(_chunk(prepared, {"reasoning_content": item.text}))
            else:
                call = {"id": item.text, "name": item.call.name, "arguments": item.call.arguments}
                pending.append(_chunk(prepared, {"tool_calls": [_tool_call(call, calls)]}))
                calls += 1
            yield b"".join(pending)
            pending = []
    except Overloaded as exc:
        _, body = error_body(ApiError(503, "overloaded", f"The server is overloaded: {exc}"))
        yield b"".join([*pending, b"data: " + json.dumps(body).encode() + b"\n\n"])
