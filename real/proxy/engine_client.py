"""Client of an SGLang engine's native API: streaming ``/generate`` and ``/abort_request``.

The contract (checked against SGLang 0.5.23, ``sglang/srt/entrypoints/http_server.py``
and ``managers/tokenizer_manager.py``): ``POST /generate`` with ``input_ids``,
``sampling_params``, ``return_logprob: true``, ``stream: true`` and a ``rid``
answers Server-Sent Events ``data: {json}`` ending with ``data: [DONE]``. Each
chunk carries ``output_ids`` and ``meta_info.output_token_logprobs`` as
``[logprob, token_id, text]`` triples, ``meta_info.completion_tokens`` (the
running total) and ``meta_info.finish_reason`` (``null`` until the last chunk,
then ``{"type": "stop" | "length" | "abort", ...}``). By default the lists are
cumulative; with ``--incremental-streaming-output`` they hold only the new
tokens. ``proxy.engine_stream`` decodes both: the number of new tokens is
``completion_tokens`` minus the tokens already seen, taken from the tail of the
lists; in a long chunk only that tail is parsed and only the bytes after the
previous chunk's are searched, so a cumulative stream costs Python work linear
in its length, not quadratic (engines Gyre starts stream incrementally anyway).
An engine error mid-stream arrives as a chunk ``{"error": {...}}``.
``POST /abort_request {"rid": ...}`` cancels a request.

Invariants:
- every token id yielded comes with exactly one log-probability;
- a stream that ends without a finish reason raises ``EngineCallError`` (a
  truncated stream is never mistaken for a finished one);
- connection refused/reset, timeouts, HTTP 5xx/429 and error chunks raise
  ``EngineCallError(retryable=True)``; HTTP 4xx other than 429, and error chunks
  that say ``retryable: false`` or carry a 4xx ``code`` (SGLang's answer to
  invalid sampling values or a too-long request), are not retryable: the
  request itself is bad and the API answers 400;
- closing the response (``Flight.detach``/``move``) ends the iteration promptly;
- the events of one network read are merged into one chunk (``merge_chunks``):
  the same ids and logprobs in the same order, fewer steps downstream;
- ``ChunkDecoder.decode_event`` on an event's bytes yields what a whole parse
  of it yields (tokens, finish, version, or the same error).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncGenerator, Callable, Sequence

from gyre.real.proxy.config import EngineSpec, RetryPolicy
from gyre.real.proxy.engine_stream import ChunkDecoder, EngineCallError, EventSplitter, TokenChunk, merge_chunks
from gyre.real.proxy.http_client import HttpClient, HttpError, Response
from gyre.real.proxy.ids_json import COMPACT_JSON, IdsJson, encode_ids

__all__ = ["ChunkDecoder", "EngineCallError", "EngineClient", "TokenChunk", "generate_body", "generate_payload",
           "merge_chunks"]

JSON_HEADERS = {"Content-Type": "application/json"}
DRAIN_TIMEOUT_S = 1.0  # how long the end of a finished stream may take before its connection is dropped


def generate_payload(rid: str, input_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
    return {"rid": rid, "input_ids": input_ids, "sampling_params": sampling,
            "return_logprob": True, "stream": True}


def generate_body(rid: str, ids_text: str, sampling: dict[str, Any]) -> bytes:
    """``generate_payload`` as JSON bytes, with ``input_ids`` given as ready JSON text (``proxy.ids_json``)."""
    return (f'{{"rid":{json.dumps(rid)},"input_ids":{ids_text},'
            f'"sampling_params":{COMPACT_JSON.encode(sampling)},'
            f'"return_logprob":true,"stream":true}}').encode()


class EngineClient:
    """Streams ``/generate`` from engines over pooled keep-alive connections (``proxy.http_client``)."""

    def __init__(self, retry: RetryPolicy) -> None:
        self.retry = retry
        self._session: HttpClient | None = None

    async def start(self) -> None:
        self._session = HttpClient(self.retry.connect_timeout_s, self.retry.read_timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def stream(self, engine: EngineSpec, rid: str, input_ids: Sequence[int], sampling: dict[str, Any],
                     attach: Callable[[Any], None] | None = None,
                     ids_json: IdsJson | None = None) -> AsyncGenerator[TokenChunk, None]:
        """Yield the new tokens of one submission until its finish reason.

        ``ids_json``: the execution's cache of encoded id lists (only the new tail is encoded)."""
        assert self._session is not None, "EngineClient.start() was not awaited"
        decoder = ChunkDecoder(engine.id)
        ids_text = ids_json.encode(input_ids) if ids_json is not None else encode_ids(input_ids)
        try:
            resp = await self._session.request("POST", f"{engine.url}/generate",
                                               generate_body(rid, ids_text, sampling), JSON_HEADERS)
            async with resp:
                if attach is not None:
                    attach(resp)
                if resp.status != 200:
                    text = (await resp.text())[:500]
                    retryable = resp.status >= 500 or resp.status == 429
                    raise EngineCallError(engine.id, f"HTTP {resp.status}: {text}", retryable=retryable)
                finished = False
                try:
                    async with contextlib.aclosing(self._chunks(resp, decoder)) as chunks:
                        async for chunk in chunks:
                            finished = chunk.finish is not None
                            yield chunk
                            if finished:
                                return
                finally:
                    if finished:
                        await self._drain(resp)
            raise EngineCallError(engine.id, "stream ended without a finish reason")
        except ConnectionError as exc:  # HttpError included
            raise EngineCallError(engine.id, str(exc) if isinstance(exc, HttpError)
                                  else f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    async def _drain(resp: Response) -> None:
        """Read what follows the finish chunk (``[DONE]``) so the connection goes back to the pool;
        an engine that does not end its stream then loses the connection instead (``Response.close``)."""
        resp.read_timeout_s = DRAIN_TIMEOUT_S
        with contextlib.suppress(ConnectionError):  # read where it lies and dropped: no copy, one generator
            async for _ in resp.iter_in_place():
                resp.consume(resp.body_end - resp.body_start)

    async def _chunks(self, resp: Response, decoder: ChunkDecoder) -> AsyncGenerator[TokenChunk, None]:
        """One ``TokenChunk`` per network read: the events that arrived together are merged, so
        a burst of tokens costs one decode, one parse and one client write, not one per token.
        Events are decoded where they lie in the connection's receive buffer: a received byte is
        never copied by the proxy (``Response.iter_in_place``)."""
        splitter = EventSplitter()
        # closed here, not left to the garbage collector: an abandoned async generator costs a task
        # (the loop's finalizer hook schedules its aclose) and a wake-up of the loop, on every call
        async with contextlib.aclosing(resp.iter_in_place()) as pieces:
            async for _ in pieces:
                buffer, lo = resp.buffer, resp.body_start
                spans, used = splitter.split(buffer, lo, resp.body_end)
                ready: list[TokenChunk] = []
                error: EngineCallError | None = None
                done = False
                try:
                    for span in spans:
                        if isinstance(span, tuple):
                            if span[1] - span[0] == 6 and buffer.startswith(b"[DONE]", span[0]):
                                done = True
                                break
                            ready.append(decoder.decode_event(buffer, span[0], span[1]))
                        elif span == b"[DONE]":
                            done = True
                            break
                        else:
                            ready.append(decoder.decode_event(span))
                except EngineCallError as exc:
                    error = exc  # the tokens that arrived before the error still count
                resp.consume(used - lo)
                if ready:
                    yield merge_chunks(ready)
                if error is not None:
                    raise error
                if done:
                    return

    async def abort(self, engine: EngineSpec, rid: str) -> bool:
        """Best-effort ``/abort_request``; True when the engine acknowledged it."""
        if self._session is None:
            return False
        try:
            resp = await self._session.request("POST", f"{engine.url}/abort_request", json.dumps({"rid": rid}).encode(),
                                               JSON_HEADERS, read_timeout_s=self.retry.connect_timeout_s)
            async with resp:
                await resp.read()
                return resp.status == 200
        except ConnectionError:
            return False
