"""The API-independent core of a model call: prompt, generation, parsing, record.

Each API module (Anthropic Messages, OpenAI Chat Completions, Responses)
turns its request body into a fully validated ``ChatRequest`` (``proxy.request``,
which also defines ``Prepared`` and ``Finished``) of *canonical messages*::

    {"role": "system" | "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments": dict}], "thinking": str}
    {"role": "tool", "tool_call_id": str, "content": str}

and canonical tools ``{"name", "description", "parameters"}``. ``ChatService``
renders them with the model's chat template (only the new messages of a
follow-up call, ``proxy.rendering``), encodes them (reusing recorded
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
- ``Finished`` is yielded only after the record is durable; its ``text`` and ``thinking`` are
  decoded and parsed only when read (``Finished.deferred``: not by an Anthropic or Chat stream);
- request ids are 24 hex digits, unique per service (a random 64-bit prefix, then a counter);
- a record is handed to the writer (``Recorder.begin``) when the engine's last chunk arrives,
  before that chunk's events are yielded, and those events come with ``prepared.finishing`` set;
  a lone call's ``begin`` (``in_flight`` 1) returns once the record is written, its sync left;
  it is waited for ``alone`` (on the event loop's thread, ``Recorder.wait``) only when no
  other call of this service is between its first engine request and its commit (``in_flight``);
- the text returned to the harness never contains the stop string the engine
  matched (``toolcalls.trim_stop``), while the record keeps every sampled id;
- each record's ``role_hints`` hold the sampling parameters asked for
  (``requested``) and sent to the engine (``sampling``), as JSON;
- input provenance is EXTERNAL for every input token and output provenance
  SAMPLED for every output token (the tree upgrades re-used output tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Callable

import numpy as np

from gyre.real.proxy.config import ProxyConfig
from gyre.real.proxy.engine_client import EngineClient
from gyre.real.proxy.generation import Generation
from gyre.real.proxy.recording import ExecutionState, PendingCommit, Recorder
from gyre.real.proxy.rendering import IncrementalRenderer
from gyre.real.proxy.request import ApiError, ChatRequest, Finished, Prepared, bad_request
from gyre.real.proxy.routing import Router
from gyre.real.proxy.tokenize import ChatTokenizer, PrefixCache, join_ids
from gyre.real.proxy.toolcalls import THINK_OPEN, OutputEvent, OutputSplitter, StopHoldback, parse_output, trim_stop
from gyre.trajectory.records import ModelCall

HINT_CHARS = 4000
OFFLOAD_CHARS = 8192  # suffixes at least this long are tokenized on a worker thread
OFFLOAD_MESSAGES_CHARS = 16384  # conversations at least this long are rendered on a worker thread
_SORTED_JSON = json.JSONEncoder(sort_keys=True)  # = json.dumps(..., sort_keys=True), without an encoder per call
SAMPLING_JSON_KEEP = 64  # distinct sampling settings whose hints' JSON a service keeps (then it starts over)

__all__ = ["ApiError", "ChatRequest", "ChatService", "Finished", "Prepared", "bad_request"]


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


def _sampling_key(request: ChatRequest) -> tuple:
    """What a request's sampling hints are made of (with the values' types: ``1`` and ``1.0`` are equal
    keys but different JSON); the service's stop ids are the same for every call."""
    values = (request.max_tokens, request.temperature, request.top_p, request.top_k, request.thinking)
    return (*values, *map(type, values), *request.stop)


def role_hints(request: ChatRequest) -> dict[str, str]:
    system = "\n".join(m["content"] for m in request.messages if m["role"] == "system")
    users = [m["content"] for m in request.messages if m["role"] == "user"]
    hints = {"api": request.api, "model": request.model, "system": system[:HINT_CHARS]}
    if users:
        hints["last_user"] = users[-1][:HINT_CHARS]
    hints.update(request.hints)
    return hints


@dataclass
class _Output:
    """A call's output ids to events: the detokenizer, the stop-string holdback, then the splitter."""

    decoder: Any
    holdback: StopHoldback
    splitter: OutputSplitter

    def feed(self, ids: Any) -> list[OutputEvent]:
        return self.splitter.feed(self.holdback.push(self.decoder.push(ids)))

    def finish(self, matched: str | None) -> list[OutputEvent]:
        rest = self.holdback.push(self.decoder.finish()) + self.holdback.finish(matched)
        return self.splitter.feed(rest) + self.splitter.finish()


class ChatService:
    """Prepare, generate and record model calls; shared by every API module."""

    def __init__(self, config: ProxyConfig, chat: ChatTokenizer, router: Router, client: EngineClient,
                 recorder: Recorder, *, clock: Callable[[], float] = time.time) -> None:
        self.config, self.chat, self.router, self.client, self.recorder = config, chat, router, client, recorder
        self.clock = clock
        self.policy_version = config.policy_version
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gyre-tokenize")
        self.renderer = IncrementalRenderer(self._template)
        # request ids: a random 64-bit prefix per service and a fixed-width counter (a random id per call
        # cost a getrandom system call each); fixed width, so a tool-call id (request id + index) is unique too
        self._id_prefix, self._id_count = secrets.token_hex(8), itertools.count()
        self.in_flight = 0  # calls between their first engine request and their record's commit
        # the hints' JSON of the sampling parameters, per ``_sampling_key``: a harness's calls share one setting
        self._sampling_json: dict[tuple, tuple[str, str]] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, thinking: bool | None,
                  generation_prompt: bool) -> str:
        return self.chat.render(messages, tools, thinking=thinking, generation_prompt=generation_prompt)

    def render(self, execution_id: str, request: ChatRequest) -> str:
        """The prompt text of ``request``: only its new messages rendered when it extends an earlier
        call of the execution (``proxy.rendering``), else the whole conversation."""
        return self._render(self.recorder.state(execution_id), request)

    def _render(self, state: ExecutionState, request: ChatRequest) -> str:
        messages = template_messages(request.messages, state)
        try:
            return self.renderer.render(state.rendered, messages, template_tools(request.tools), request.thinking)
        except RecursionError:
            raise bad_request("body: JSON nested too deeply", "body") from None
        except Exception as exc:  # the template rejected the conversation (e.g. role order)
            raise bad_request(f"messages: cannot be rendered by the model's chat template: {exc}") from None

    async def render_async(self, execution_id: str, request: ChatRequest, size: int) -> str:
        """``render``; a conversation of ``size`` >= ``OFFLOAD_MESSAGES_CHARS`` bytes is rendered on a
        worker thread, so a huge request does not stall every other stream on the event loop (as is the
        first replay of a long execution's log)."""
        state = await self.recorder.state_async(execution_id, self.pool)
        if size < OFFLOAD_MESSAGES_CHARS:
            return self._render(state, request)
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._render, state, request)

    async def encode(self, text: str, cache: PrefixCache | None = None,
                     max_tokens: int | None = None) -> tuple[np.ndarray, int]:
        """Ids of ``text`` (int32), reusing the longest cached prefix; returns (ids, reused ids). Long suffixes
        are encoded on a worker thread so a 100 KB first prompt does not stall every other stream; with
        ``max_tokens`` (the answer's budget), one that cannot fit the context is refused from its size
        before it is tokenized (``proxy.prompt_size``)."""
        covered, ids = cache.best_prefix(text) if cache is not None else (0, np.zeros(0, dtype=np.int32))
        if len(text) - covered < OFFLOAD_CHARS:
            return join_ids(ids, self.chat.encode(text[covered:])), len(ids)
        suffix = await asyncio.get_running_loop().run_in_executor(
            self.pool, self._encode_fitting, text[covered:], len(ids), max_tokens)
        return join_ids(ids, suffix), len(ids)

    def _encode_fitting(self, suffix: str, prefix_ids: int, max_tokens: int | None) -> list[int]:
        if max_tokens is not None:
            self._check_fits(prefix_ids + self.chat.size.at_least(suffix), max_tokens, "at least ")
        return self.chat.encode(suffix)

    def _check_fits(self, prompt_tokens: int, max_tokens: int, bound: str = "") -> None:
        limit = self.config.limits.max_context_tokens
        if prompt_tokens + max_tokens > limit:
            raise bad_request(f"max_tokens: prompt is too long: {bound}{prompt_tokens} tokens + max_tokens "
                              f"{max_tokens} > {limit} maximum")

    async def prepare(self, execution_id: str, request: ChatRequest, size: int = 0) -> Prepared:
        """Render and encode ``request`` (``size``: its body's bytes); 400 when the prompt cannot be served."""
        prompt_text = await self.render_async(execution_id, request, size)
        state = self.recorder.state(execution_id)
        input_ids, reused = await self.encode(prompt_text, state.prefix, request.max_tokens)
        self._check_fits(len(input_ids), request.max_tokens)
        return Prepared(request=request, execution_id=execution_id, request_id=self._request_id(),
                        prompt_text=prompt_text, input_ids=input_ids, reused_ids=reused,
                        in_thinking=prompt_text.rstrip().endswith(THINK_OPEN), started_at=self.clock())

    def _request_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_count):08x}"

    def sampling(self, request: ChatRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"max_new_tokens": request.max_tokens,
                                  "stop_token_ids": list(self.chat.stop_token_ids),
                                  "skip_special_tokens": False, "temperature": 1.0 if request.temperature is None
                                  else request.temperature}
        for name in ("top_p", "top_k"):
            if getattr(request, name) is not None:
                params[name] = getattr(request, name)
        if request.stop:
            params["stop"] = list(request.stop)
        return params

    async def run(self, prepared: Prepared, id_prefix: str) -> AsyncGenerator[OutputEvent | Finished, None]:
        """Stream the call's events, commit its record, then yield ``Finished``.

        The record is handed to the writer as soon as the engine's last chunk arrives, and the
        call's last events are yielded with ``prepared.finishing`` set (the server holds them back
        and writes them with the stream's end): their formatting, the engine stream's end and the
        summary overlap the record's hand-off to the writer thread (its wake-up; the GIL keeps its frame
        encoding from running beside them), and the answer's end costs one socket write."""
        generation = Generation(self.router, self.client, self.config.retry, execution_id=prepared.execution_id,
                                request_id=prepared.request_id, input_ids=prepared.input_ids,
                                sampling=self.sampling(prepared.request),
                                ids_json=self.recorder.state(prepared.execution_id).ids_json)
        output = _Output(self.chat.decoder(), StopHoldback(prepared.request.stop),
                         OutputSplitter(in_thinking=prepared.in_thinking))
        calls: list[dict[str, Any]] = []
        pending: PendingCommit | None = None
        waited = False
        hints: dict[str, str] = {}
        # the record's hints that the request alone decides are written down while the engine generates
        # (the loop's next turn: the engine request is sent by then), not after its last chunk
        asyncio.get_running_loop().call_soon(self._request_hints, hints, prepared, generation.sampling)
        self.in_flight += 1
        try:
            async with contextlib.aclosing(generation.__aiter__()) as chunks:
                async for chunk in chunks:
                    events = output.feed(chunk.ids)
                    if generation.log.finish is None:
                        for event in events:
                            yield self._named(event, calls, id_prefix, prepared.request_id)
                        continue
                    # the last chunk: the record is complete once its events (tool calls) are named
                    last = [self._named(event, calls, id_prefix, prepared.request_id)
                            for event in events + output.finish(_matched_stop(generation))]
                    pending = await self._begin_commit(prepared, generation, calls, hints)
                    for event in last:
                        yield event
            if pending is None:  # the token budget ran out between two submissions: no last chunk
                for event in output.finish(_matched_stop(generation)):
                    yield self._named(event, calls, id_prefix, prepared.request_id)
                pending = await self._begin_commit(prepared, generation, calls, hints)
            finished = self._finished(prepared, generation, calls)
            waited = True
            await self.recorder.wait(pending, alone=self.in_flight == 1)
        finally:
            if pending is not None and not waited:
                self.recorder.abandon(pending)  # the consumer went away while the record was being synced
            self.in_flight -= 1
        yield finished

    async def _begin_commit(self, prepared: Prepared, generation: Generation, calls: list[dict[str, Any]],
                            hints: dict[str, str]) -> PendingCommit:
        pending = await self.recorder.begin(self._record(prepared, generation, calls, hints), prepared.prompt_text,
                                            alone=self.in_flight == 1)
        prepared.finishing = True
        return pending

    def _named(self, event: OutputEvent, calls: list[dict[str, Any]], prefix: str, request_id: str) -> OutputEvent:
        if event.call is not None:
            call_id = f"{prefix}{request_id}{len(calls):02d}"
            calls.append({"id": call_id, "name": event.call.name, "arguments": event.call.arguments})
            return OutputEvent("tool_call", call_id, event.call)
        return event

    def _finished(self, prepared: Prepared, generation: Generation, calls: list[dict[str, Any]]) -> Finished:
        finish = generation.log.finish or {}
        matched = _matched_stop(generation)
        if finish.get("type") == "length":
            reason = "length"
        elif calls:
            reason = "tool_calls"
        else:
            reason = "stop_sequence" if isinstance(matched, str) else "stop"
        output_ids = list(generation.output_ids)

        def parts() -> tuple[str, str]:  # the whole output decoded and parsed: only when an answer needs it
            parsed = parse_output(trim_stop(self.chat.decode(output_ids, skip_special=True), matched),
                                  in_thinking=prepared.in_thinking)
            return parsed.text, parsed.thinking

        tokens = []
        if prepared.request.logprobs:
            ids = output_ids[:-1] if output_ids and output_ids[-1] in self.chat.stop_token_ids else output_ids
            tokens = [self.chat.decode([i], skip_special=True) for i in ids]
        return Finished.deferred(parts, output_ids=output_ids, logprobs=list(generation.logprobs), tool_calls=calls,
                                 stop_reason=reason, stop_sequence=matched, input_tokens=len(prepared.input_ids),
                                 output_tokens=len(output_ids), tokens=tokens)

    def _request_hints(self, hints: dict[str, str], prepared: Prepared, sampling: dict[str, Any]) -> None:
        """Fill the empty ``hints`` with what the request decides: its roles, the sampling parameters asked
        for and those sent to the engine (``sampling``), as JSON."""
        if hints:
            return  # filled already (by ``_record``, when the generation ended before the loop's next turn)
        key = _sampling_key(prepared.request)  # ``sampling`` is ``self.sampling(prepared.request)``: the key decides it
        encoded = self._sampling_json.get(key)
        if encoded is None:
            encoded = (_SORTED_JSON.encode(sampling), _SORTED_JSON.encode(prepared.request.sampling_record()))
            if len(self._sampling_json) >= SAMPLING_JSON_KEEP:
                self._sampling_json.clear()
            self._sampling_json[key] = encoded
        hints.update(role_hints(prepared.request), harness=self.config.harness, reused_ids=str(prepared.reused_ids),
                     sampling=encoded[0], requested=encoded[1])

    def _record(self, prepared: Prepared, generation: Generation, calls: list[dict[str, Any]],
                hints: dict[str, str]) -> ModelCall:
        self._request_hints(hints, prepared, generation.sampling)
        hints.update(engines=",".join(generation.log.engines), moves=str(generation.log.moves),
                     move_stalls_ms=",".join(f"{x * 1e3:.1f}" for x in generation.log.move_stalls_s),
                     finish=str((generation.log.finish or {}).get("type")))
        if generation.log.holds:  # waited for an engine (RetryPolicy.hold_s): the stall the harness saw
            hints["held_ms"] = f"{generation.log.held_s * 1e3:.1f}"
        matched = _matched_stop(generation)
        if matched:
            hints["stop_sequence"] = matched
        version = generation.log.weight_version
        policy = int(version) if version is not None and version.isdigit() else self.policy_version
        return ModelCall(execution_id=prepared.execution_id, request_id=prepared.request_id,
                         input_ids=prepared.input_ids, output_ids=generation.output_ids,
                         output_logprobs=generation.logprobs, policy_version=policy,
                         engine_id=generation.log.engines[-1] if generation.log.engines else "",
                         started_at=prepared.started_at, finished_at=max(self.clock(), prepared.started_at),
                         role_hints=hints, tool_calls=tuple(calls))


def _matched_stop(generation: Generation) -> str | None:
    """The stop string the engine matched (SGLang: ``finish_reason.matched`` is a str), if any."""
    matched = (generation.log.finish or {}).get("matched")
    return matched if isinstance(matched, str) and matched else None
