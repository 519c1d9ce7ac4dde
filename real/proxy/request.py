"""The typed request and result of one model call, and the proxy's errors (no I/O).

Each API module (``proxy.api``) parses a request body into a ``ChatRequest``
*before* any response starts; everything after that trusts it. A
``ChatRequest`` holds *canonical messages*::

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments": dict | str}], "thinking": str}
    {"role": "tool", "tool_call_id": str, "content": str}

and canonical tools ``{"name", "description", "parameters"}``.

Errors: ``ApiError`` carries an API-neutral ``kind`` and the ``param`` it is
about; each API module maps it to its own error shape. ``Overloaded`` (no
engine could serve the call: retryable) and ``EngineRejected`` (an engine
refused the request as invalid: a client error, never retried) come from the
generation loop.

This module imports only the standard library, so parsing is testable without
aiohttp, torch or a tokenizer (``tests/proxy_parse``).

Invariants:
- a ``ChatRequest`` is fully validated: every field has its declared type and
  range, every tool result answers a tool call earlier in the same history;
- ``ApiError.status`` is a 4xx for anything the client sent, 5xx only for the
  proxy's own state (overload, internal);
- a ``Finished`` made by ``Finished.deferred`` computes its ``text`` and ``thinking`` on their
  first read, once, and then reads as one made with them: a stream whose end needs neither
  (Anthropic, Chat Completions) never decodes and parses the whole output for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


class ApiError(Exception):
    """A request the proxy answers with an error; ``kind`` is API-neutral, ``param`` the field."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 about ``param`` (by default the dotted path before the first colon of ``message``)."""
    if param is None and ":" in message:
        head = message.split(":", 1)[0]
        param = head if head and " " not in head else None
    return ApiError(400, "invalid_request", message, param)


class Overloaded(Exception):
    """No engine could serve the call within the retry budget (retryable by the client)."""


class EngineRejected(Exception):
    """An engine rejected the request as invalid (bad sampling values, too long): a 400."""


@dataclass(kw_only=True)
class ChatRequest:
    api: str
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    thinking: bool | None = None
    hints: dict[str, str] = field(default_factory=dict)
    include_usage: bool = False  # Chat: stream_options.include_usage
    logprobs: bool = False  # Chat: per-token logprobs in the answer
    tool_kinds: dict[str, dict[str, str]] = field(default_factory=dict)  # Responses: name -> kind, namespace

    def sampling_record(self) -> dict[str, Any]:
        """The sampling parameters the client asked for (stored with the record)."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "stop": list(self.stop), "thinking": self.thinking}


@dataclass(kw_only=True)
class Prepared:
    request: ChatRequest
    execution_id: str
    request_id: str
    prompt_text: str
    input_ids: Sequence[int]  # an int32 array from ``ChatService.prepare``
    reused_ids: int
    in_thinking: bool
    started_at: float
    # set once the generation ended and the record's sync has begun: the stream's remaining events
    # are then written together with its end, in one write, once the record is durable
    finishing: bool = False


@dataclass(kw_only=True)
class Finished:
    output_ids: list[int]
    logprobs: list[float]
    text: str
    thinking: str
    tool_calls: list[dict[str, Any]]
    stop_reason: str  # "stop" | "length" | "tool_calls" | "stop_sequence"
    stop_sequence: str | None
    input_tokens: int
    output_tokens: int
    tokens: list[str] = field(default_factory=list)  # text of each output token (Chat logprobs)

    @classmethod
    def deferred(cls, parts: Callable[[], tuple[str, str]], **values: Any) -> Finished:
        """A ``Finished`` of ``values`` (every field but ``text`` and ``thinking``) whose ``text`` and
        ``thinking`` are ``parts()``, called on the first read of either (module invariants)."""
        finished = cls.__new__(cls)
        finished.__dict__.update(values, _parts=parts)
        return finished

    def __getattr__(self, name: str) -> Any:  # only reached for an attribute not set: a deferred one
        parts = self.__dict__.get("_parts")
        if parts is None or name not in ("text", "thinking"):
            raise AttributeError(name)
        self.text, self.thinking = parts()
        del self.__dict__["_parts"]
        return self.__dict__[name]


class LastChunk(bytes):
    """The final bytes of an event stream: the server sends them together with the stream's end
    (one socket write, not two). An API's ``stream`` yields nothing after it."""


def check_tool_results(messages: list[dict[str, Any]], where: str) -> None:
    """Every tool result answers a tool call of an earlier assistant message, once per issue."""
    issued: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            for call in message.get("tool_calls") or ():
                issued.add(call["id"])
                answered.discard(call["id"])  # an id issued again may be answered again
        elif message["role"] == "tool":
            call_id, at = message["tool_call_id"], message.get("where", where)
            if call_id not in issued:
                raise bad_request(f"{at}: tool result for {call_id!r} answers no earlier tool call", at)
            if call_id in answered:
                raise bad_request(f"{at}: tool call {call_id!r} is answered twice", at)
            answered.add(call_id)


def error_for(exc: BaseException) -> ApiError:
    """The API-neutral error a failure during a call is answered with (before or inside a stream)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Overloaded):
        return ApiError(529, "overloaded", f"Overloaded: {exc}")
    if isinstance(exc, EngineRejected):
        return ApiError(400, "invalid_request", f"the engine rejected the request: {exc}")
    if isinstance(exc, RecursionError):
        return ApiError(400, "invalid_request", "body: JSON nested too deeply", "body")
    return ApiError(500, "internal", "internal proxy error")
