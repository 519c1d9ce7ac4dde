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
tokens. ``ChunkDecoder`` handles both: the number of new tokens is
``completion_tokens`` minus the tokens already seen, taken from the tail of the
lists; in a long chunk only that tail is parsed (the arrays are found by byte
search), so a cumulative stream costs Python work linear in its length, not
quadratic (engines Gyre starts stream incrementally anyway). An engine error
mid-stream arrives as a chunk ``{"error": {...}}``.
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
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

from gyre.real.proxy.config import EngineSpec, RetryPolicy
from gyre.real.proxy.http_client import HttpClient, HttpError, Response
from gyre.real.proxy.ids_json import IdsJson, encode_ids

JSON_HEADERS = {"Content-Type": "application/json"}
DRAIN_TIMEOUT_S = 1.0  # how long the end of a finished stream may take before its connection is dropped


class EngineCallError(Exception):
    """An engine could not serve a submission; ``retryable`` says whether another may."""

    def __init__(self, engine_id: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"engine {engine_id}: {message}")
        self.engine_id = engine_id
        self.retryable = retryable


@dataclass(frozen=True)
class TokenChunk:
    """New output tokens of one submission, with their behaviour log-probabilities."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: dict[str, Any] | None = None
    weight_version: str | None = None


def merge_chunks(chunks: list[TokenChunk]) -> TokenChunk:
    """The chunks of one read as one: ids and logprobs in order, the last finish and version."""
    if len(chunks) == 1:
        return chunks[0]
    finish = next((c.finish for c in reversed(chunks) if c.finish is not None), None)
    version = next((c.weight_version for c in reversed(chunks) if c.weight_version is not None), None)
    return TokenChunk(tuple(i for c in chunks for i in c.ids), tuple(v for c in chunks for v in c.logprobs),
                      finish, version)


def _retryable_error(error: Any) -> bool:
    """SGLang marks a request it rejects as invalid with ``retryable: false`` / a 4xx ``code``."""
    if not isinstance(error, dict):
        return True
    if error.get("retryable") is False:
        return False
    code = error.get("code")
    return not (isinstance(code, int) and 400 <= code < 500 and code != 429)


def generate_payload(rid: str, input_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
    return {"rid": rid, "input_ids": input_ids, "sampling_params": sampling,
            "return_logprob": True, "stream": True}


def generate_body(rid: str, ids_text: str, sampling: dict[str, Any]) -> bytes:
    """``generate_payload`` as JSON bytes, with ``input_ids`` given as ready JSON text (``proxy.ids_json``)."""
    return (f'{{"rid":{json.dumps(rid)},"input_ids":{ids_text},'
            f'"sampling_params":{json.dumps(sampling, separators=(",", ":"))},'
            f'"return_logprob":true,"stream":true}}').encode()


IDS_KEY = b'"output_ids":'
LOGPROBS_KEY = b'"output_token_logprobs":'
TEXT_OPEN = b'{"text":"'  # how SGLang's chunks begin (orjson: compact, ``text`` first)
SUFFIX_PARSE_BYTES = 2048  # events at least this long have only their new tokens parsed (``ChunkDecoder``)


def _array_open(body: bytes | bytearray, key: bytes, start: int, end: int) -> int:
    """Index of the ``[`` that opens the array after ``key`` (found in ``body[start:end]``), or -1."""
    at = body.find(key, start, end)
    if at < 0:
        return -1
    at += len(key)
    while at < end and body[at] in b" \t\r\n":
        at += 1
    return at if at < end and body[at] == ord("[") else -1


def _tail_start(body: bytes | bytearray, opening: int, end: int, separator: bytes, count: int) -> int:
    """Where the last ``count`` items of the array ``body[opening:end]`` begin: ``count`` separators
    back, or the array's opening when there are fewer (the parse then finds too few items)."""
    at = end
    for _ in range(count):
        at = body.rfind(separator, opening + 1, at)
        if at < 0:
            return opening
    return at


class ChunkDecoder:
    """Turn SSE payloads into ``TokenChunk``s (cumulative or incremental lists).

    ``decode_event`` parses an event's new tokens only: in a cumulative chunk
    the arrays are located with byte searches, cut out of the payload (the rest
    is parsed whole: it is small) and only their last ``completion_tokens -
    seen`` items are parsed, so a stream's Python work is linear in its length.
    The ``text`` SGLang repeats in every cumulative chunk is cut out of the head
    too: its part already seen is compared with the previous chunk's, not parsed.
    An event whose log-probability triples carry text (``return_text_in_logprobs``,
    never asked for) or that does not have the expected shape is parsed whole."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.seen = 0
        self.parsed_bytes = 0  # bytes handed to the JSON parser: the work that must stay linear in a stream
        self.text = b""  # the last long event's text, as sent: a cumulative stream's next text starts with it

    def decode_event(self, body: bytes | bytearray, lo: int = 0, hi: int | None = None) -> TokenChunk:
        """The tokens of the event ``body[lo:hi]`` (bounds: a long event is read where it lies in the
        receive buffer, not copied out of it)."""
        hi = len(body) if hi is None else hi
        if hi - lo >= SUFFIX_PARSE_BYTES:
            chunk = self._decode_suffix(body, lo, hi)
            if chunk is not None:
                return chunk
        self.parsed_bytes += hi - lo
        event = body[lo:hi] if lo or hi < len(body) else body
        try:
            payload = json.loads(event)
        except ValueError:
            raise EngineCallError(self.engine_id, f"undecodable chunk {bytes(event[:100])!r}") from None
        if not isinstance(payload, dict):
            raise EngineCallError(self.engine_id, f"chunk is not an object: {bytes(event[:100])!r}")
        return self.decode(payload)

    def _decode_suffix(self, body: bytes | bytearray, lo: int, hi: int) -> TokenChunk | None:
        ids_open = _array_open(body, IDS_KEY, lo, hi)
        ids_close = body.find(b"]", ids_open, hi) if ids_open >= 0 else -1
        lps_open = _array_open(body, LOGPROBS_KEY, ids_close, hi) if ids_close >= 0 else -1
        if lps_open < 0 or body[lps_open + 1:min(lps_open + 2, hi)] not in (b"]", b"["):
            return None  # not SGLang's key order, or log-probabilities that are not triples
        # the array ends at the last "]]" before the next quote (one-byte searches run at memchr speed;
        # a forward search for "]]" would test every "]" of the array, byte by byte)
        quote = body.find(b'"', lps_open, hi)
        quote = hi if quote < 0 else quote
        empty = body[lps_open + 1:lps_open + 2] == b"]"
        lps_close = lps_open + 1 if empty else body.rfind(b"]]", lps_open, quote) + 1
        if (lps_close <= 0 or body[lps_close + 1:quote].strip(b" \t\r\n,}")
                or body.find(b'"', ids_open, ids_close) >= 0):
            return None  # text inside an array: a bracket may be quoted
        head = self._head_before_ids(body, lo, ids_open) + body[ids_close:lps_open + 1] + body[lps_close:hi]
        self.parsed_bytes += len(head)
        try:
            payload = json.loads(head)
        except ValueError:
            return None
        if not isinstance(payload, dict):
            return None
        meta = payload.get("meta_info")
        if "error" in payload or not isinstance(meta, dict):
            return self.decode(payload)
        try:
            new = max(int(meta.get("completion_tokens")) - self.seen, 0)
        except (TypeError, ValueError):
            return None
        ids_at = _tail_start(body, ids_open, ids_close, b",", new) if new else ids_close - 1
        lps_at = _tail_start(body, lps_open, lps_close, b"[", new) if new else lps_close
        ids_text, lps_text = b"[" + body[ids_at + 1:ids_close] + b"]", b"[" + body[lps_at:lps_close] + b"]"
        self.parsed_bytes += len(ids_text) + len(lps_text)
        try:
            new_ids = json.loads(ids_text)
            new_lps = json.loads(lps_text)
        except ValueError:
            return None
        return self._tokens(new, new_ids, new_lps, meta)

    def _head_before_ids(self, body: bytes | bytearray, lo: int, ids_open: int) -> bytes:
        """``body[lo:ids_open + 1]`` with its ``text`` emptied when SGLang's compact spelling lets
        it be cut out: a cumulative stream repeats its text so far in every chunk, so the part
        that starts like the previous chunk's text is compared (memcmp), not parsed, and only the
        rest is scanned for the string's end. The text itself is never used."""
        start = lo + len(TEXT_OPEN)
        if not body.startswith(TEXT_OPEN, lo, ids_open):
            return bytes(body[lo:ids_open + 1])
        known = len(self.text) if self.text and body.startswith(self.text, start, ids_open) else 0
        try:
            rest = body[start + known:ids_open + 1].decode()
            _, end = json.decoder.scanstring(rest, 0)
        except (UnicodeDecodeError, ValueError):
            return bytes(body[lo:ids_open + 1])  # parsed whole: the same error, if any, as a whole parse
        after = rest[end:].encode()
        self.text = bytes(body[start:ids_open + 1 - len(after) - 1])
        self.parsed_bytes += len(rest) - len(after)
        return TEXT_OPEN + b'"' + after

    def decode(self, payload: dict[str, Any]) -> TokenChunk:
        if "error" in payload:
            error = payload["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise EngineCallError(self.engine_id, f"error chunk: {message}", retryable=_retryable_error(error))
        meta = payload.get("meta_info") or {}
        ids = payload.get("output_ids") or []
        logprobs = meta.get("output_token_logprobs") or []
        total = meta.get("completion_tokens", len(ids))
        new = max(int(total) - self.seen, 0)
        new_ids = ids[len(ids) - new:] if new else []
        new_lps = logprobs[len(logprobs) - new:] if new else []
        return self._tokens(new, new_ids, new_lps, meta)

    def _tokens(self, new: int, new_ids: list, new_lps: list, meta: dict[str, Any]) -> TokenChunk:
        if len(new_ids) != new or len(new_lps) != new:
            raise EngineCallError(self.engine_id, f"chunk announces {new} new tokens but carries "
                                              f"{len(new_ids)} ids and {len(new_lps)} logprobs")
        try:  # float rounding can push a log-probability a hair above 0
            values = tuple(min(float(lp[0] if isinstance(lp, (list, tuple)) else lp), 0.0) for lp in new_lps)
        except (TypeError, ValueError):
            raise EngineCallError(self.engine_id, "chunk carries a log-probability that is not a number") from None
        if any(v != v or v == float("-inf") for v in values):
            raise EngineCallError(self.engine_id, "chunk carries a non-finite log-probability")
        self.seen += new
        finish = meta.get("finish_reason")
        version = meta.get("weight_version")
        return TokenChunk(tuple(int(i) for i in new_ids), values, finish, None if version is None else str(version))


class EventSplitter:
    """Finds the complete SSE events at the head of a body as it grows (``split``), so that each
    byte is searched once: a long event arriving in many reads is not searched from its start each
    time. Lines end with LF or CR LF (mixed too); events end with a blank line."""

    def __init__(self) -> None:
        self.searched = 0    # how far into the waiting body every line end was examined
        self.lines = False   # whether the waiting event has a line end before ``searched``

    def split(self, buffer: bytes | bytearray, lo: int, hi: int) -> tuple[list[tuple[int, int] | bytes], int]:
        """The complete events of ``buffer[lo:hi]`` (the body not consumed): an event of one
        ``data: `` line (what engines send) as the bounds of its data in ``buffer``, any other as
        its data (``_event_data``; events without data left out); then where they end (the caller
        consumes the body up to there once it has read them)."""
        spans: list[tuple[int, int] | bytes] = []
        start, at, lines = lo, lo + self.searched, self.lines
        while True:
            at = buffer.find(b"\n", at, hi)  # a one-byte search runs at memchr speed
            if at < 0:
                at = hi
                break
            if at + 1 >= hi or (buffer[at + 1] == 13 and at + 2 >= hi):
                break  # whether this line end starts a blank line is not known yet
            stop = at + 2 if buffer[at + 1] == 10 else at + 3 if buffer[at + 1:at + 3] == b"\r\n" else 0
            if not stop:
                lines, at = True, at + 1
                continue
            end = at - 1 if at > start and buffer[at - 1] == 13 else at
            if not lines and buffer.startswith(b"data: ", start, end):
                spans.append((start + 6, end))
            else:
                data = _event_data(bytes(buffer[start:end]))
                if data is not None:
                    spans.append(data)
            start = at = stop
            lines = False
        self.searched, self.lines = at - start, lines
        return spans, start


def _split_events(buffer: bytearray, splitter: EventSplitter) -> list[bytes]:
    """``EventSplitter.split`` as the events' data, removed from ``buffer``."""
    spans, used = splitter.split(buffer, 0, len(buffer))
    bodies = [bytes(buffer[span[0]:span[1]]) if isinstance(span, tuple) else span for span in spans]
    del buffer[:used]
    return bodies


def _event_data(event: bytes) -> bytes | None:
    """The data of one SSE event: its ``data:`` lines (a CR ending a line dropped), each less the
    one space that may follow the colon (the SSE rule, which the one-line fast path of
    ``EventSplitter`` applies too), joined by newlines; None for an event without data."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in event.split(b"\n")]
    data = [line[6:] if line.startswith(b"data: ") else line[5:] for line in lines if line.startswith(b"data:")]
    return b"\n".join(data) if data else None


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
                     ids_json: IdsJson | None = None) -> AsyncIterator[TokenChunk]:
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
        with contextlib.suppress(ConnectionError):
            async for _ in resp.iter_any():
                pass

    async def _chunks(self, resp: Response, decoder: ChunkDecoder) -> AsyncIterator[TokenChunk]:
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
