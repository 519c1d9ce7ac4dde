"""The API-independent core of a model call: prompt, generation, parsing, record.

Each API module (Anthropic Messages, OpenAI Chat Completions, Responses)
turns its request body into a ``ChatRequest`` of *canonical messages*::

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments": dict}], "thinking": str}
    {"role": "tool", "tool_call_id": str, "content": str}

and canonical tools ``{"name", "description", "parameters"}``. ``ChatService``
renders them with the model's chat template, encodes them (reusing recorded
token ids, see ``proxy.tokenize``), streams the generation and yields
``proxy.toolcalls.OutputEvent``s (tool calls carry their new id), then commits the
TITO record and yields one ``Finished`` last.

Raw-output splice: an assistant message the proxy itself produced (recognised
by its tool-call ids, or by its visible text) is rendered from the model's raw
output text instead of from its parsed parts, so the rendered history contains
exactly the text (and, through the prefix cache, the token ids) the model
sampled. The tool-call payload cache has already undone the harness's
re-serialization before this point.

Invariants:
- ``prepare`` (a coroutine) raises ``ApiError`` (status 400) before anything is sent to an
  engine or recorded: a rejected call leaves no trace;
- ``Finished`` is yielded only after the record is durable;
- input provenance is EXTERNAL for every input token and output provenance
  SAMPLED for every output token (the tree upgrades re-used output tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from gyre.trajectory.records import ModelCall
from gyre.real.proxy.config import ProxyConfig
from gyre.real.proxy.engine_client import EngineClient
from gyre.real.proxy.generation import Generation
from gyre.real.proxy.recording import ExecutionState, Recorder
from gyre.real.proxy.routing import Router
from gyre.real.proxy.tokenize import ChatTokenizer, PrefixCache
from gyre.real.proxy.toolcalls import THINK_OPEN, OutputEvent, OutputSplitter, parse_output

HINT_CHARS = 4000
OFFLOAD_CHARS = 8192  # suffixes at least this long are tokenized on a worker thread


class ApiError(Exception):
    """A request the proxy answers with an error; ``kind`` is API-neutral."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def bad_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


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


@dataclass(kw_only=True)
class Prepared:
    request: ChatRequest
    execution_id: str
    request_id: str
    prompt_text: str
    input_ids: list[int]
    reused_ids: int
    in_thinking: bool
    started_at: float


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


def template_messages(messages: list[dict[str, Any]], state: ExecutionState) -> list[dict[str, Any]]:
    """Canonical messages in the chat template's shape, raw outputs spliced back in."""
    out = []
    for message in messages:
        if message["role"] != "assistant":
            out.append({k: v for k, v in message.items() if k in ("role", "content", "tool_call_id")})
            continue
        calls = message.get("tool_calls") or []
        raw = state.raw_for([c["id"] for c in calls], message.get("content") or "")
        if raw is not None:
            out.append({"role": "assistant", "content": raw})
            continue
        entry: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("thinking"):
            entry["reasoning_content"] = message["thinking"]
        if calls:
            entry["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
        out.append(entry)
    return out


def template_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                              "parameters": t.get("parameters") or {"type": "object"}}}
            for t in tools]


def role_hints(request: ChatRequest) -> dict[str, str]:
    system = "\n".join(m["content"] for m in request.messages if m["role"] == "system")
    users = [m["content"] for m in request.messages if m["role"] == "user"]
    hints = {"api": request.api, "model": request.model, "system": system[:HINT_CHARS]}
    if users:
        hints["last_user"] = users[-1][:HINT_CHARS]
    hints.update(request.hints)
    return hints


class ChatService:
    """Prepare, generate and record model calls; shared by every API module."""

    def __init__(self, config: ProxyConfig, chat: ChatTokenizer, router: Router, client: EngineClient,
                 recorder: Recorder, *, clock: Callable[[], float] = time.time) -> None:
        self.config, self.chat, self.router, self.client, self.recorder = config, chat, router, client, recorder
        self.clock = clock
        self.policy_version = config.policy_version
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gyre-tokenize")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def render(self, execution_id: str, request: ChatRequest) -> str:
        state = self.recorder.state(execution_id)
        try:
            return self.chat.render(template_messages(request.messages, state), template_tools(request.tools),
                                    thinking=request.thinking)
        except Exception as exc:  # the template rejected the conversation (e.g. role order)
            raise bad_request(f"messages cannot be rendered by the model's chat template: {exc}") from None

    async def encode(self, text: str, cache: PrefixCache | None = None) -> tuple[list[int], int]:
        """``ChatTokenizer.encode_prompt``; long suffixes are encoded on a worker thread
        so a 100 KB first prompt does not stall every other stream on the event loop."""
        covered, ids = cache.best_prefix(text) if cache is not None else (0, [])
        if len(text) - covered < OFFLOAD_CHARS:
            return ids + self.chat.encode(text[covered:]), len(ids)
        suffix = await asyncio.get_running_loop().run_in_executor(self._pool, self.chat.encode, text[covered:])
        return ids + suffix, len(ids)

    async def prepare(self, execution_id: str, request: ChatRequest) -> Prepared:
        prompt_text = self.render(execution_id, request)
        state = self.recorder.state(execution_id)
        input_ids, reused = await self.encode(prompt_text, state.prefix)
        limit = self.config.limits.max_context_tokens
        if len(input_ids) + request.max_tokens > limit:
            raise bad_request(f"prompt is too long: {len(input_ids)} tokens + max_tokens {request.max_tokens} "
                              f"> {limit} maximum")
        return Prepared(request=request, execution_id=execution_id, request_id=secrets.token_hex(8),
                        prompt_text=prompt_text, input_ids=input_ids, reused_ids=reused,
                        in_thinking=prompt_text.rstrip().endswith(THINK_OPEN), started_at=self.clock())

    def sampling(self, request: ChatRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"max_new_tokens": request.max_tokens, "stop_token_ids": list(self.chat.stop_token_ids),
                                  "skip_special_tokens": False, "temperature": 1.0 if request.temperature is None
                                  else request.temperature}
        for name in ("top_p", "top_k"):
            if getattr(request, name) is not None:
                params[name] = getattr(request, name)
        if request.stop:
            params["stop"] = list(request.stop)
        return params

    async def run(self, prepared: Prepared, id_prefix: str) -> AsyncIterator[OutputEvent | Finished]:
        """Stream the call's events, then commit its record and yield ``Finished``."""
        generation = Generation(self.router, self.client, self.config.retry, execution_id=prepared.execution_id,
                                request_id=prepared.request_id, input_ids=prepared.input_ids,
                                sampling=self.sampling(prepared.request))
        decoder = self.chat.decoder()
        splitter = OutputSplitter(in_thinking=prepared.in_thinking)
        calls: list[dict[str, Any]] = []
        async with contextlib.aclosing(generation.__aiter__()) as chunks:
            async for chunk in chunks:
                for event in splitter.feed(decoder.push(chunk.ids)):
                    yield self._named(event, calls, id_prefix, prepared.request_id)
        for event in splitter.feed(decoder.finish()) + splitter.finish():
            yield self._named(event, calls, id_prefix, prepared.request_id)
        finished = self._finished(prepared, generation, calls)
        await self.recorder.commit(self._record(prepared, generation, calls), prepared.prompt_text)
        yield finished

    def _named(self, event: OutputEvent, calls: list[dict[str, Any]], prefix: str, request_id: str) -> OutputEvent:
        if event.call is not None:
            call_id = f"{prefix}{request_id}{len(calls):02d}"
            calls.append({"id": call_id, "name": event.call.name, "arguments": event.call.arguments})
            return OutputEvent("tool_call", call_id, event.call)
        return event

    def _finished(self, prepared: Prepared, generation: Generation, calls: list[dict[str, Any]]) -> Finished:
        finish = generation.log.finish or {}
        matched = finish.get("matched")
        if finish.get("type") == "length":
            reason = "length"
        elif calls:
            reason = "tool_calls"
        else:
            reason = "stop_sequence" if isinstance(matched, str) else "stop"
        text_parts = self.chat.decode(generation.output_ids, skip_special=True)
        parsed = parse_output(text_parts, in_thinking=prepared.in_thinking)
        return Finished(output_ids=list(generation.output_ids), logprobs=list(generation.logprobs), text=parsed.text,
                        thinking=parsed.thinking, tool_calls=calls, stop_reason=reason,
                        stop_sequence=matched if isinstance(matched, str) else None,
                        input_tokens=len(prepared.input_ids), output_tokens=len(generation.output_ids))

    def _record(self, prepared: Prepared, generation: Generation, calls: list[dict[str, Any]]) -> ModelCall:
        hints = role_hints(prepared.request)
        hints.update(harness=self.config.harness, engines=",".join(generation.log.engines), moves=str(generation.log.moves),
                     move_stalls_ms=",".join(f"{x * 1e3:.1f}" for x in generation.log.move_stalls_s),
                     reused_ids=str(prepared.reused_ids), finish=str((generation.log.finish or {}).get("type")))
        version = generation.log.weight_version
        policy = int(version) if version is not None and version.isdigit() else self.policy_version
        return ModelCall(execution_id=prepared.execution_id, request_id=prepared.request_id,
                         input_ids=prepared.input_ids, output_ids=generation.output_ids,
                         output_logprobs=generation.logprobs, policy_version=policy,
                         engine_id=generation.log.engines[-1] if generation.log.engines else "",
                         started_at=prepared.started_at, finished_at=max(self.clock(), prepared.started_at),
                         role_hints=hints, tool_calls=tuple(calls))
