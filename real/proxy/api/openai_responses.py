"""OpenAI Responses API (what Codex speaks): input items, tools, the event stream.

Input: ``instructions`` (system), ``input`` as a string or items: messages
(roles ``system``/``developer``/``user``/``assistant``, content a string or
``input_text``/``output_text`` parts), ``function_call`` / ``function_call_output``,
``custom_tool_call`` / ``custom_tool_call_output`` (free-form tools: the model
sees a function with one string argument ``input``), and ``reasoning`` items
(their summary text becomes the next assistant turn's thinking). Tools:
``function``, ``custom``, ``namespace`` (its nested tools are offered under
their own names and answered as calls of those names, with ``namespace`` set),
and server tools (``web_search`` and the like) accepted and dropped.
``store: false`` with the full history is the supported mode;
``previous_response_id`` is a 400 (the proxy keeps no conversation state that
a harness could rely on). ``reasoning``, ``include``, ``prompt_cache_key``,
``text``, ``tool_choice``, ``parallel_tool_calls``, ``metadata`` are accepted.

Streaming emits ``response.created``, ``response.in_progress``, then per output
item ``response.output_item.added`` ... ``response.output_item.done`` (with the
content-part, text-delta, reasoning-summary and function-call-arguments events
in between) and ``response.completed`` (``response.incomplete`` when the token
budget ran out). Every event has a ``sequence_number``. An engine outage after
the stream started sends ``response.failed`` with code ``server_is_overloaded``;
any other failure after the first byte also ends the stream with
``response.failed`` (never a second status line). Every field is type-checked
and every ``function_call_output`` must answer an earlier ``function_call``
before any response starts.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator, AsyncIterator

from gyre.real.proxy import fields
from gyre.real.proxy.api.openai_chat import error_body, parse_arguments, text_content
from gyre.real.proxy.request import (
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
SERVER_TOOLS = {"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                "local_shell", "computer_use_preview", "mcp", "tool_search"}
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")

__all__ = ["ID_PREFIX", "error_body", "parse", "response", "stream"]


def _message_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("system", "developer", "user", "assistant"):
        raise bad_request(f"{where}.role: unsupported role {role!r:.40}")
    text = text_content(item.get("content"), f"{where}.content", TEXT_PARTS)
    if role == "assistant":
        return {"role": "assistant", "content": text, "tool_calls": [], "thinking": ""}
    return {"role": "user" if role == "user" else "system", "content": text}


def _call_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = fields.string(item, "call_id", where=where, required=True)
    name = fields.string(item, "name", where=where, required=True)
    if item["type"] == "custom_tool_call":
        arguments: Any = {"input": fields.string(item, "input", where=where, default="")}
    else:
        arguments = parse_arguments(item.get("arguments", "{}"), f"{where}.arguments")
    return {"id": call_id, "name": name, "arguments": arguments}


def _append_call(out: list[dict[str, Any]], call: dict[str, Any], thinking: str) -> None:
    last = out[-1] if out else None
    if last is None or last["role"] != "assistant" or last.get("closed"):
        last = {"role": "assistant", "content": "", "tool_calls": [], "thinking": thinking}
        out.append(last)
    last["tool_calls"].append(call)


def _summary(item: dict[str, Any], where: str) -> str:
    parts = fields.objects(fields.array(item, "summary", where=where), f"{where}.summary")
    return "\n".join(fields.string(s, "text", where=f"{where}.summary.{k}", default="") for k, s in enumerate(parts))


def _output_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = fields.string(item, "call_id", where=where, required=True)
    output = item.get("output", "")
    text = output if isinstance(output, str) else text_content(output, f"{where}.output", TEXT_PARTS)
    return {"role": "tool", "tool_call_id": call_id, "content": text, "where": f"{where}.call_id"}


def canonical_input(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input: required string or non-empty list of items")
    out: list[dict[str, Any]] = []
    instructions = fields.string(body, "instructions")
    if instructions:
        out.append({"role": "system", "content": instructions})
    thinking = ""
    for i, item in enumerate(fields.objects(items, "input")):
        where = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            message = _message_item(item, where)
            if message["role"] == "assistant":
                message["thinking"], thinking = thinking, ""
            out.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            _append_call(out, _call_item(item, where), thinking)
            thinking = ""
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(_output_item(item, where))
        elif kind == "reasoning":
            thinking = _summary(item, where)
        else:
            raise bad_request(f"{where}.type: unsupported input item type {kind!r:.40}")
    check_tool_results(out, "input")
    return out


def canonical_tools(tools: Any, where: str = "tools") -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """Function-like tools for the template, and name -> {"kind", "namespace"} for answering calls."""
    out, kinds = [], {}
    for i, tool in enumerate(fields.objects(fields.array({"tools": tools}, "tools", where=where.rpartition(".")[0]),
                                            where)):
        at = f"{where}.{i}"
        kind = fields.string(tool, "type", where=at, required=True)
        if kind in SERVER_TOOLS:
            continue
        if kind == "namespace":
            namespace = fields.string(tool, "name", where=at, default="")
            nested, nested_kinds = canonical_tools(tool.get("tools"), f"{at}.tools")
            out += nested
            kinds.update({n: dict(k, namespace=namespace) for n, k in nested_kinds.items()})
            continue
        if kind not in ("function", "custom"):
            raise bad_request(f"{at}.type: unsupported tool type {kind!r:.40}")
        name = fields.string(tool, "name", where=at, required=True)
        parameters = fields.mapping(tool, "parameters", where=at) or {"type": "object", "properties": {}}
        if kind == "custom":
            parameters = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
        out.append({"name": name, "description": fields.string(tool, "description", where=at, default=""),
                    "parameters": parameters})
        kinds[name] = {"kind": kind}
    return out, kinds


def parse(body: dict[str, Any], hints: dict[str, str], default_max_tokens: int) -> ChatRequest:
    """A ``ChatRequest`` from a Responses body; raises 400 ``ApiError`` naming the field."""
    try:
        model = fields.string(body, "model", required=True, max_chars=fields.MODEL_MAX_CHARS)
        if body.get("previous_response_id") is not None:
            raise bad_request("previous_response_id: not supported; send the full history with store: false")
        for name in ("reasoning", "text", "metadata"):
            fields.mapping(body, name)
        fields.boolean(body, "store")
        fields.array(body, "include")
        tools, kinds = canonical_tools(body.get("tools"))
        return ChatRequest(api="responses", model=model, messages=canonical_input(body), tools=tools,
                           max_tokens=fields.integer(body, "max_output_tokens", minimum=1, default=default_max_tokens),
                           stream=fields.boolean(body, "stream"),
                           temperature=fields.number(body, "temperature", low=0.0, high=2.0),
                           top_p=fields.number(body, "top_p", low=0.0, high=1.0, low_open=True), hints=hints,
                           tool_kinds=kinds)
    except RecursionError:
        raise fields.too_deep() from None


def _call_item_out(call: dict[str, Any], kinds: dict[str, dict[str, str]], status: str) -> dict[str, Any]:
    kind = kinds.get(call["name"], {})
    if kind.get("kind") == "custom":
        return {"type": "custom_tool_call", "id": f"ctc_{call['id']}", "call_id": call["id"], "name": call["name"],
                "input": str(call["arguments"].get("input", "")), "status": status}
    item = {"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"], "name": call["name"],
            "arguments": fields.json_bytes(call["arguments"]).decode(), "status": status}
    if kind.get("namespace"):
        item["namespace"] = kind["namespace"]
    return item


def _message_out(prepared: Prepared, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{prepared.request_id}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _reasoning_out(prepared: Prepared, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{prepared.request_id}",
            "summary": [{"type": "summary_text", "text": text}] if text else []}


def response(prepared: Prepared, finished: Finished | None, *, status: str = "completed") -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    usage = None
    if finished is not None:
        kinds = prepared.request.tool_kinds
        if finished.thinking:
            output.append(_reasoning_out(prepared, finished.thinking))
        if finished.text or not finished.tool_calls:
            output.append(_message_out(prepared, finished.text, "completed"))
        output += [_call_item_out(c, kinds, "completed") for c in finished.tool_calls]
        usage = {"input_tokens": finished.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": finished.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": finished.input_tokens + finished.output_tokens}
        status = "incomplete" if finished.stop_reason == "length" else status
    return {"id": f"resp_{prepared.request_id}", "object": "response", "created_at": int(prepared.started_at),
            "status": status, "model": prepared.request.model, "output": output, "usage": usage,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": False,
            "text": {"format": {"type": "text"}}, "metadata": {}, "instructions": None}


class _Events:
    """Numbered SSE events of one response."""

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.number = 0
        self.index = -1

    def __call__(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.number, **data}
        self.number += 1
        return b"event: " + kind.encode() + b"\ndata: " + fields.json_bytes(body) + b"\n\n"


async def stream(events: AsyncIterator[OutputEvent | Finished], prepared: Prepared) -> AsyncGenerator[bytes, None]:
    """Responses events; the events of one generation step go out in one write."""
    emit = _Events(prepared)
    pending = [emit("response.created", response=response(prepared, None, status="in_progress")),
               emit("response.in_progress", response=response(prepared, None, status="in_progress"))]
    writer = _ItemWriter(emit, prepared)
    try:
        async for item in events:
            if isinstance(item, Finished):
                final = response(prepared, item)
                yield LastChunk(b"".join([*pending, *writer.close(),
                                          emit(f"response.{final['status']}", response=final)]))
                return
            yield b"".join([*pending, *writer.event(item)])
            pending = []
    except Exception as exc:  # noqa: BLE001 - once the stream began, every failure is a response.failed event
        error = error_for(exc)
        failed = response(prepared, None, status="failed")
        code = "server_is_overloaded" if error.kind == "overloaded" else \
            "invalid_request" if error.status < 500 else "server_error"
        failed["error"] = {"code": code, "message": error.message}
        yield LastChunk(b"".join([*pending, emit("response.failed", response=failed)]))


class _ItemWriter:
    """Open and close output items as events of each kind arrive."""

    def __init__(self, emit: _Events, prepared: Prepared) -> None:
        self.emit, self.prepared = emit, prepared
        self.kinds = prepared.request.tool_kinds
        self.open_kind: str | None = None
        self.text = ""

    def close(self) -> list[bytes]:
        e, p, i, text = self.emit, self.prepared, self.emit.index, self.text
        out: list[bytes] = []
        if self.open_kind == "text":
            item_id = f"msg_{p.request_id}"
            part = {"type": "output_text", "text": text, "annotations": []}
            out += [e("response.output_text.done", item_id=item_id, output_index=i, content_index=0, text=text),
                    e("response.content_part.done", item_id=item_id, output_index=i, content_index=0, part=part),
                    e("response.output_item.done", output_index=i, item=_message_out(p, text, "completed"))]
        elif self.open_kind == "thinking":
            item_id = f"rs_{p.request_id}"
            part = {"type": "summary_text", "text": text}
            out += [e("response.reasoning_summary_text.done", item_id=item_id, output_index=i, summary_index=0,
                      text=text),
                    e("response.reasoning_summary_part.done", item_id=item_id, output_index=i, summary_index=0,
                      part=part),
                    e("response.output_item.done", output_index=i, item=_reasoning_out(p, text))]
        self.open_kind, self.text = None, ""
        return out

    def _open(self, kind: str) -> list[bytes]:
        out = self.close()
        self.emit.index += 1
        self.open_kind = kind
        e, p, i = self.emit, self.prepared, self.emit.index
        if kind == "text":
            item_id = f"msg_{p.request_id}"
            part = {"type": "output_text", "text": "", "annotations": []}
            return out + [e("response.output_item.added", output_index=i, item=_message_out(p, "", "in_progress")),
                          e("response.content_part.added", item_id=item_id, output_index=i, content_index=0,
                            part=part)]
        item_id = f"rs_{p.request_id}"
        return out + [e("response.output_item.added", output_index=i, item=_reasoning_out(p, "")),
                      e("response.reasoning_summary_part.added", item_id=item_id, output_index=i, summary_index=0,
                        part={"type": "summary_text", "text": ""})]

    def event(self, event: OutputEvent) -> list[bytes]:
        e, p = self.emit, self.prepared
        if event.kind == "tool_call":
            out = self.close()
            e.index += 1
            tool = event.call
            assert tool is not None  # a tool_call event carries its call (toolcalls.OutputEvent)
            call = {"id": event.text, "name": tool.name, "arguments": tool.arguments}
            added, done = _call_item_out(call, self.kinds, "in_progress"), _call_item_out(call, self.kinds, "completed")
            out.append(e("response.output_item.added", output_index=e.index, item=added))
            if added["type"] == "function_call":
                out += [e("response.function_call_arguments.delta", item_id=added["id"], output_index=e.index,
                          delta=added["arguments"]),
                        e("response.function_call_arguments.done", item_id=added["id"], output_index=e.index,
                          arguments=added["arguments"])]
            return out + [e("response.output_item.done", output_index=e.index, item=done)]
        out = self._open(event.kind) if self.open_kind != event.kind else []
        self.text += event.text
        if event.kind == "text":
            return out + [e("response.output_text.delta", item_id=f"msg_{p.request_id}", output_index=e.index,
                            content_index=0, delta=event.text)]
        return out + [e("response.reasoning_summary_text.delta", item_id=f"rs_{p.request_id}", output_index=e.index,
                        summary_index=0, delta=event.text)]
