"""Anthropic Messages API: request parsing, responses and the SSE event stream.

Accepted (as Claude Code sends it, see shared/notes/harness-clients.md):
``system`` as a string or text blocks (``cache_control`` ignored),
``{"role": "system"}`` entries inside ``messages``, content as a string or
blocks ``text`` / ``tool_use`` / ``tool_result`` / ``thinking`` /
``redacted_thinking``, custom tools (server tools without ``input_schema`` are
dropped: the proxy cannot run them), ``thinking`` (``enabled``, ``adaptive``,
``disabled``), and ``output_config``, ``context_management``, ``metadata``,
``tool_choice``, ``service_tier`` accepted and ignored. Anything else that
cannot be served (images, documents, unknown block types, a missing or
malformed field) is a 400 ``invalid_request_error`` naming the field.

Streaming follows the official event order: ``message_start``, then per
content block ``content_block_start``, (one ``ping`` after the first start),
``content_block_delta``..., ``content_block_stop``; then ``message_delta``
(stop reason, usage) and ``message_stop``. An engine outage after the stream
started ends it with an ``error`` event of type ``overloaded_error`` (what the
API itself sends), so the harness retries the call.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from gyre.real.proxy.model_call import ApiError, ChatRequest, Finished, Prepared, bad_request
from gyre.real.proxy.generation import Overloaded
from gyre.real.proxy.toolcalls import OutputEvent

ID_PREFIX = "toolu_"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}
ERROR_TYPES = {"invalid_request": "invalid_request_error", "authentication": "authentication_error",
               "too_large": "request_too_large", "overloaded": "overloaded_error", "not_found": "not_found_error",
               "internal": "api_error", "permission": "permission_error"}
SIGNATURE = "gyre-proxy"


def error_body(error: ApiError) -> tuple[int, dict[str, Any]]:
    status = 529 if error.kind == "overloaded" else error.status
    return status, {"type": "error", "error": {"type": ERROR_TYPES.get(error.kind, "api_error"),
                                               "message": error.message}}


def _text_of(value: Any, where: str) -> str:
    """Text of a string or of a list of text blocks (tool results, system)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where}: expected a string or a list of text blocks")
    parts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise bad_request(f"{where}.{i}: unsupported block type {kind!r} (only text is supported)")
        parts.append(block["text"])
    return "\n".join(parts)


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise bad_request(f"{where}.content: expected a string or a list of blocks")
    text, thinking, calls = [], [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad_request(f"{where}.content.{i}: tool_use needs string id and name")
            if not isinstance(block.get("input", {}), dict):
                raise bad_request(f"{where}.content.{i}.input: must be an object")
            calls.append({"id": block["id"], "name": block["name"], "arguments": block.get("input", {})})
        else:
            raise bad_request(f"{where}.content.{i}: unsupported assistant block type {kind!r}")
    return {"role": "assistant", "content": "".join(text), "tool_calls": calls, "thinking": "\n".join(thinking)}


def _user(content: Any, where: str, role: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content: expected a string or a list of blocks")
    results, text = [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad_request(f"{where}.content.{i}.tool_use_id: required string")
            body = _text_of(block.get("content", ""), f"{where}.content.{i}.content")
            if block.get("is_error"):
                body = f"Error: {body}"
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": body})
        else:
            raise bad_request(f"{where}.content.{i}: unsupported {role} block type {kind!r}")
    return results + ([{"role": role, "content": "\n".join(text)}] if text or not results else [])


def canonical_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: required non-empty list")
    out = []
    if body.get("system"):
        out.append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "assistant":
            out.append(_assistant(message.get("content", ""), f"messages.{i}"))
        elif role in ("user", "system"):
            out.extend(_user(message.get("content", ""), f"messages.{i}", role))
        else:
            raise bad_request(f"messages.{i}.role: must be 'user' or 'assistant', got {role!r}")
    return out


def canonical_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("tools: must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"tools.{i}.name: required string")
        if "input_schema" not in tool:
            if tool.get("type") in (None, "custom"):
                raise bad_request(f"tools.{i}.input_schema: required for custom tools")
            continue  # a server tool (web search, ...): the proxy cannot run it
        out.append({"name": tool["name"], "description": tool.get("description", ""),
                    "parameters": tool["input_schema"]})
    return out


def _thinking(body: dict[str, Any]) -> bool | None:
    config = body.get("thinking")
    if config is None:
        return None
    kind = config.get("type") if isinstance(config, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise bad_request(f"thinking.type: must be 'enabled', 'adaptive' or 'disabled', got {kind!r}")
    return kind != "disabled"


def parse(body: dict[str, Any], hints: dict[str, str], *, count_only: bool = False) -> ChatRequest:
    """A ``ChatRequest`` from a Messages (or count_tokens) body; raises 400 ``ApiError``."""
    if not isinstance(body.get("model"), str):
        raise bad_request("model: required string")
    max_tokens = body.get("max_tokens", 1 if count_only else None)
    if not count_only and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad_request("max_tokens: required integer >= 1")
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("stop_sequences: must be a list of strings")
    return ChatRequest(api="anthropic", model=body["model"], messages=canonical_messages(body),
                       tools=canonical_tools(body.get("tools")), max_tokens=max_tokens,
                       stream=bool(body.get("stream", False)), temperature=body.get("temperature"),
                       top_p=body.get("top_p"), top_k=body.get("top_k"), stop=stop, thinking=_thinking(body),
                       hints=hints)


def _usage(finished: Finished | None, prepared: Prepared) -> dict[str, Any]:
    return {"input_tokens": len(prepared.input_ids), "output_tokens": finished.output_tokens if finished else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def response(prepared: Prepared, finished: Finished) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if finished.thinking:
        content.append({"type": "thinking", "thinking": finished.thinking, "signature": SIGNATURE})
    if finished.text or not finished.tool_calls:
        content.append({"type": "text", "text": finished.text})
    content += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]}
                for c in finished.tool_calls]
    return {"id": f"msg_{prepared.request_id}", "type": "message", "role": "assistant",
            "model": prepared.request.model, "content": content, "stop_reason": STOP_REASONS[finished.stop_reason],
            "stop_sequence": finished.stop_sequence, "usage": _usage(finished, prepared)}


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class _Blocks:
    """Open/close content blocks in order; yields the SSE bytes for each change."""

    def __init__(self) -> None:
        self.index = -1
        self.open_kind: str | None = None

    def close(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        out = []
        if self.open_kind == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": SIGNATURE}))
        self.open_kind = None
        return out + [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open_kind = kind
        out.append(sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": block}))
        if self.index == 0:
            out.append(sse("ping", {"type": "ping"}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def event(self, event: OutputEvent) -> list[bytes]:
        if event.kind == "tool_call":
            out = self.open("tool_use", {"type": "tool_use", "id": event.text, "name": event.call.name, "input": {}})
            out.append(self._delta({"type": "input_json_delta", "partial_json": event.call.arguments_json}))
            return out + self.close()
        out = []
        if self.open_kind != event.kind:
            block = {"type": "thinking", "thinking": "", "signature": ""} if event.kind == "thinking" \
                else {"type": "text", "text": ""}
            out += self.open(event.kind, block)
        key = "thinking" if event.kind == "thinking" else "text"
        return out + [self._delta({"type": f"{key}_delta", key: event.text})]


async def stream(events: AsyncIterator[OutputEvent | Finished], prepared: Prepared) -> AsyncIterator[bytes]:
    """The SSE byte stream of one call (official event order; see module doc).

    The events that one generation step produces are written together (one
    socket write per step, not per event); ``message_start`` goes out with the
    first step, which the server has already awaited.
    """
    message = response(prepared, Finished(output_ids=[], logprobs=[], text="", thinking="", tool_calls=[],
                                          stop_reason="stop", stop_sequence=None, input_tokens=0, output_tokens=0))
    message.update(content=[], stop_reason=None, stop_sequence=None)
    pending = [sse("message_start", {"type": "message_start", "message": message})]
    blocks = _Blocks()
    try:
        async for item in events:
            if isinstance(item, Finished):
                if blocks.index < 0:
                    pending += blocks.open("text", {"type": "text", "text": ""})
                pending += blocks.close()
                pending.append(sse("message_delta", {"type": "message_delta",
                                                     "delta": {"stop_reason": STOP_REASONS[item.stop_reason],
                                                               "stop_sequence": item.stop_sequence},
                                                     "usage": {"output_tokens": item.output_tokens}}))
                pending.append(sse("message_stop", {"type": "message_stop"}))
                yield b"".join(pending)
                return
            pending += blocks.event(item)
            yield b"".join(pending)
            pending = []
    except Overloaded as exc:
        _, body = error_body(ApiError(529, "overloaded", f"Overloaded: {exc}"))
        yield b"".join([*pending, sse("error", body)])
