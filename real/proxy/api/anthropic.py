"""Anthropic Messages API: request parsing, responses and the SSE event stream.

Accepted (as Claude Code sends it, see docs/harnesses.md):
``system`` as a string or text blocks (``cache_control`` ignored),
``{"role": "system"}`` entries inside ``messages``, content as a string or
blocks ``text`` / ``tool_use`` / ``tool_result`` / ``thinking`` /
``redacted_thinking``, custom tools (server tools without ``input_schema`` are
dropped: the proxy cannot run them), ``thinking`` (``enabled``, ``adaptive``,
``disabled``), and ``output_config``, ``context_management``, ``metadata``,
``tool_choice``, ``service_tier`` accepted and ignored. Anything else that
cannot be served (images, documents, unknown block types, a missing or
malformed field, a value of the wrong type or out of range, a tool result
that answers no earlier ``tool_use``, a final assistant message: prefill is
not supported) is a 400 ``invalid_request_error`` naming the field. The whole
body is parsed before any response starts.

Empty content, as the API answers it: a user message whose content is ``""``
or ``[]`` ("all messages must have non-empty content except for the optional
final assistant message"), or one of its text blocks (the string form is
shorthand for one) empty ("text content blocks must be non-empty") or only
whitespace ("... must contain non-whitespace text") is a 400 with the API's
wording (seen in the API's answers quoted in anthropics/claude-code issues
#6774, #59812 and #23440). An assistant message may be empty or whitespace:
the proxy itself answers an empty text block when the model says nothing, and
what it emits it accepts back. Tool results and ``system`` may be empty (the
API takes both).

Streaming follows the official event order: ``message_start``, then per
content block ``content_block_start``, (one ``ping`` after the first start),
``content_block_delta``..., ``content_block_stop``; then ``message_delta``
(stop reason, usage) and ``message_stop``. An engine outage after the stream
started ends it with an ``error`` event of type ``overloaded_error`` (what the
API itself sends), so the harness retries the call; any other failure after
the first byte also ends the stream with an ``error`` event (never a second
status line). Stop sequences are not part of the returned text.
"""

from __future__ import annotations

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

ID_PREFIX = "toolu_"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}
ERROR_TYPES = {"invalid_request": "invalid_request_error", "authentication": "authentication_error",
               "too_large": "request_too_large", "overloaded": "overloaded_error", "not_found": "not_found_error",
               "internal": "api_error", "permission": "permission_error"}
SIGNATURE = "gyre-proxy"


def error_body(error: ApiError) -> tuple[int, dict[str, Any]]:
    status = 529 if error.kind == "overloaded" else error.status
    kind = ERROR_TYPES.get(error.kind) or ("invalid_request_error" if status < 500 else "api_error")
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}


def _text_of(value: Any, where: str) -> str:
    """Text of a string or of a list of text blocks (tool results, system)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where}: expected a string or a list of text blocks")
    parts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise bad_request(f"{where}.{i}: unsupported block type {kind!r:.40} (only text is supported)")
        parts.append(fields.string(block, "text", where=f"{where}.{i}", required=True))
    return "\n".join(parts)


def _block_kind(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise bad_request(f"{where}: must be a content block object, got {type(block).__name__}")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise bad_request(f"{where}.type: required string")
    return kind


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content, "tool_calls": [], "thinking": ""}
    if not isinstance(content, list):
        raise bad_request(f"{where}.content: expected a string or a list of blocks")
    text, thinking, calls = [], [], []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        kind = _block_kind(block, at)
        if kind == "text":
            text.append(fields.string(block, "text", where=at, required=True))
        elif kind == "thinking":
            thinking.append(fields.string(block, "thinking", where=at, default=""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            call_id = fields.string(block, "id", where=at, required=True)
            name = fields.string(block, "name", where=at, required=True)
            calls.append({"id": call_id, "name": name, "arguments": fields.mapping(block, "input", where=at)})
        else:
            raise bad_request(f"{at}.type: unsupported assistant block type {kind!r:.40}")
    return {"role": "assistant", "content": "".join(text), "tool_calls": calls, "thinking": "\n".join(thinking)}


def _user_text(text: str, where: str) -> str:
    """A user's text block as the API takes it: not empty, not only whitespace (module doc)."""
    if not text:
        raise bad_request(f"{where}: text content blocks must be non-empty")
    if text.isspace():
        raise bad_request(f"{where}: text content blocks must contain non-whitespace text")
    return text


def _user(content: Any, where: str, role: str) -> list[dict[str, Any]]:
    if role == "user" and (content == "" or content == []):
        raise bad_request(f"{where}: all messages must have non-empty content except for the optional final "
                          "assistant message", where)
    if isinstance(content, str):
        return [{"role": role, "content": _user_text(content, f"{where}.content") if role == "user" else content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content: expected a string or a list of blocks")
    results, text = [], []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        kind = _block_kind(block, at)
        if kind == "text":
            block_text = fields.string(block, "text", where=at, required=True)
            text.append(_user_text(block_text, f"{at}.text") if role == "user" else block_text)
        elif kind == "tool_result" and role == "user":
            call_id = fields.string(block, "tool_use_id", where=at, required=True)
            body = _text_of(block["content"], f"{at}.content") if block.get("content") is not None else ""
            if fields.boolean(block, "is_error", where=at):
                body = f"Error: {body}"
            results.append({"role": "tool", "tool_call_id": call_id, "content": body, "where": f"{at}.tool_use_id"})
        else:
            raise bad_request(f"{at}.type: unsupported {role} block type {kind!r:.40}")
    return results + ([{"role": role, "content": "\n".join(text)}] if text or not results else [])


def canonical_messages(body: dict[str, Any], *, prefill_allowed: bool = False) -> list[dict[str, Any]]:
    messages = fields.objects(fields.array(body, "messages", required=True, non_empty=True), "messages")
    out = []
    if body.get("system") is not None:
        system = _text_of(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content", "")
        if role == "assistant":
            out.append(_assistant(content, f"messages.{i}"))
        elif role in ("user", "system"):
            out.extend(_user(content, f"messages.{i}", role))
        else:
            raise bad_request(f"messages.{i}.role: must be 'user' or 'assistant', got {role!r:.40}")
    if messages[-1].get("role") == "assistant" and not prefill_allowed:
        raise bad_request(f"messages.{len(messages) - 1}: a final assistant message (prefill) is not supported "
                          "by this proxy; end the conversation with a user message")
    check_tool_results(out, "messages")
    return out


def canonical_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("tools: must be a list")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools.{i}"
        if not isinstance(tool, dict):
            raise bad_request(f"{at}: must be an object")
        name = fields.string(tool, "name", where=at, required=True)
        if tool.get("input_schema") is None:
            if tool.get("type") in (None, "custom"):
                raise bad_request(f"{at}.input_schema: required for custom tools")
            continue  # a server tool (web search, ...): the proxy cannot run it
        out.append({"name": name, "description": fields.string(tool, "description", where=at, default=""),
                    "parameters": fields.mapping(tool, "input_schema", where=at)})
    return out


def _thinking(body: dict[str, Any]) -> bool | None:
    config = body.get("thinking")
    if config is None:
        return None
    kind = config.get("type") if isinstance(config, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise bad_request(f"thinking.type: must be 'enabled', 'adaptive' or 'disabled', got {kind!r:.40}")
    fields.integer(config, "budget_tokens", where="thinking", minimum=0)
    return kind != "disabled"


def parse(body: dict[str, Any], hints: dict[str, str], *, count_only: bool = False) -> ChatRequest:
    """A ``ChatRequest`` from a Messages (or count_tokens) body; raises 400 ``ApiError``."""
    try:
        model = fields.string(body, "model", required=True, max_chars=fields.MODEL_MAX_CHARS)
        max_tokens = 1 if count_only else fields.integer(body, "max_tokens", required=True, minimum=1)
        for name in ("metadata", "tool_choice", "output_config", "context_management"):
            fields.mapping(body, name)
        return ChatRequest(api="anthropic", model=model, messages=canonical_messages(body, prefill_allowed=count_only),
                           tools=canonical_tools(body.get("tools")), max_tokens=max_tokens,
                           stream=fields.boolean(body, "stream"),
                           temperature=fields.number(body, "temperature", low=0.0, high=1.0),
                           top_p=fields.number(body, "top_p", low=0.0, high=1.0, low_open=True),
                           top_k=fields.integer(body, "top_k", minimum=1),
                           stop=fields.stop_list(body, "stop_sequences", one_string=False),
                           thinking=_thinking(body), hints=hints)
    except RecursionError:
        raise fields.too_deep() from None


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
    return b"event: " + event.encode() + b"\ndata: " + fields.json_bytes(data) + b"\n\n"


# The events of every streamed answer, prebuilt: byte for byte what ``sse`` writes for them (tested), with
# only their variable parts (a block's index, a delta's text) encoded per event, not the whole event
_PING = sse("ping", {"type": "ping"})
_MESSAGE_STOP = sse("message_stop", {"type": "message_stop"})
_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"%s_delta","%s":'
_EMPTY_BLOCK = {"text": b'{"type":"text","text":""}', "thinking": b'{"type":"thinking","thinking":"","signature":""}'}
_BLOCK_START = b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,"content_block":%s}\n\n'
_MESSAGE_DELTA = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":%s,"stop_sequence":%s},'
                  b'"usage":{"output_tokens":%d}}\n\n')
_STOP_REASONS_JSON = {reason: fields.json_bytes(name) for reason, name in STOP_REASONS.items()}
_MESSAGE_START = (b'event: message_start\ndata: {"type":"message_start","message":{"id":%s,"type":"message",'
                  b'"role":"assistant","model":%s,"content":[],"stop_reason":null,"stop_sequence":null,"usage":'
                  b'{"input_tokens":%d,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}\n\n')


def _message_start(prepared: Prepared) -> bytes:
    """The stream's ``message_start``: ``sse`` of the empty ``response`` (tested byte for byte), with only
    its id, model and prompt size encoded. An id that is not ASCII (never one the proxy makes) takes the
    generic path: the encoder's ASCII fallback for a lone surrogate in the model would escape it too."""
    if not prepared.request_id.isascii():
        message = response(prepared, Finished(output_ids=[], logprobs=[], text="", thinking="", tool_calls=[],
                                              stop_reason="stop", stop_sequence=None, input_tokens=0,
                                              output_tokens=0))
        message.update(content=[], stop_reason=None, stop_sequence=None)
        return sse("message_start", {"type": "message_start", "message": message})
    return _MESSAGE_START % (fields.json_bytes(f"msg_{prepared.request_id}"),
                             fields.json_bytes(prepared.request.model), len(prepared.input_ids))


def _message_delta(finished: Finished) -> bytes:
    """The stream's ``message_delta``: ``sse`` of it (tested byte for byte), from a prebuilt block with only
    the stop sequence and the token count encoded."""
    if type(finished.output_tokens) is not int:  # noqa: E721 - a bool or NumPy integer takes the generic path
        return sse("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": STOP_REASONS[finished.stop_reason],
                                               "stop_sequence": finished.stop_sequence},
                                     "usage": {"output_tokens": finished.output_tokens}})
    stop_sequence = b"null" if finished.stop_sequence is None else fields.json_bytes(finished.stop_sequence)
    return _MESSAGE_DELTA % (_STOP_REASONS_JSON[finished.stop_reason], stop_sequence, finished.output_tokens)


def _text_delta(index: int, key: str, text: str) -> bytes:
    """``sse("content_block_delta", ...)`` of a ``text`` or ``thinking`` delta."""
    return b"".join((_DELTA % (index, key.encode(), key.encode()), fields.json_bytes(text), b"}}\n\n"))


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
        return out + [_BLOCK_STOP % self.index]

    def open(self, kind: str, block: dict[str, Any] | None = None) -> list[bytes]:
        """Close the open block, start one of ``kind`` (``block``: its start; default: an empty text or
        thinking block)."""
        out = self.close()
        self.index += 1
        self.open_kind = kind
        out.append(_BLOCK_START % (self.index, _EMPTY_BLOCK[kind] if block is None else fields.json_bytes(block)))
        if self.index == 0:
            out.append(_PING)
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def event(self, event: OutputEvent) -> list[bytes]:
        if event.kind == "tool_call":
            call = event.call
            assert call is not None  # a tool_call event carries its call (toolcalls.OutputEvent)
            out = self.open("tool_use", {"type": "tool_use", "id": event.text, "name": call.name, "input": {}})
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments_json}))
            return out + self.close()
        key = "thinking" if event.kind == "thinking" else "text"
        out = self.open(key) if self.open_kind != event.kind else []
        out.append(_text_delta(self.index, key, event.text))
        return out


async def stream(events: AsyncIterator[OutputEvent | Finished], prepared: Prepared) -> AsyncGenerator[bytes, None]:
    """The SSE byte stream of one call (official event order; see module doc).

    The events that one generation step produces are written together (one
    socket write per step, not per event); ``message_start`` goes out with the
    first step, which the server has already awaited.
    """
    pending = [_message_start(prepared)]
    blocks = _Blocks()
    try:
        async for item in events:
            if isinstance(item, Finished):
                if blocks.index < 0:
                    pending += blocks.open("text")
                pending += blocks.close()
                pending.append(_message_delta(item))
                pending.append(_MESSAGE_STOP)
                yield LastChunk(b"".join(pending))
                return
            pending += blocks.event(item)
            yield b"".join(pending)
            pending = []
    except Exception as exc:  # noqa: BLE001 - once the stream began, every failure is an in-stream error event
        yield LastChunk(b"".join([*pending, stream_error(error_for(exc))]))


def stream_error(error: ApiError) -> bytes:
    """The ``error`` event that ends a stream (``overloaded_error`` for an outage: the harness retries)."""
    return sse("error", error_body(error)[1])
