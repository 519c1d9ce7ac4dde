"""Decoding an SGLang ``/generate`` stream: Server-Sent Events into ``TokenChunk``s.

Each event is ``data: {json}`` (the last ``data: [DONE]``). A chunk carries
``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, id, text]``
triples), ``meta_info.completion_tokens`` (the running total) and
``meta_info.finish_reason``. By default the lists are cumulative (every chunk
repeats every token so far, and the ``text`` so far); with
``--incremental-streaming-output`` they hold only the new tokens. The new
tokens are the last ``completion_tokens - seen`` items of the lists, in both
modes; the old ones are never read again.

A cumulative stream's bytes grow with the square of its length (a 16k-token
answer is ~3 GB), so a long event is never parsed whole: ``ChunkDecoder``
parses its small head and the new tail of its arrays, and remembers where the
event's parts ended (``_Layout``). The next event of a cumulative stream
repeats those bytes, so it is searched from there on: the work per event is
linear in its new tokens, not in its size. The layout is trusted only where
the previous event's last bytes of each part (``MARK_BYTES``) are found at the
same offsets; else the part is searched from its start (an incremental
stream, the first long event, an engine that rewrites what it sent).

Invariants:
- ``ChunkDecoder.decode_event`` yields what ``ChunkDecoder.decode`` of a whole
  parse of the same event yields (tokens, finish, version, or the same
  ``EngineCallError``), for any stream of well-formed events; an old part
  rewritten with the marks left in place is not noticed, which changes nothing
  (a whole parse reads only the last items too);
- a malformed new part raises or is parsed whole, never yields tokens a whole
  parse would not;
- every token id yielded comes with exactly one log-probability;
- any JSON event either yields tokens (with a ``finish`` that is None or an
  object) or raises ``EngineCallError``: fields of the wrong type are the
  engine's failure, never another exception (a 500 for the client);
- ``EventSplitter`` returns the same events however the bytes are cut into
  reads, examining each byte once.
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from typing import Any, NamedTuple

Buffer = bytes | bytearray

IDS_KEY = b'"output_ids":'
LOGPROBS_KEY = b'"output_token_logprobs":'
TEXT_OPEN = b'{"text":"'  # how SGLang's chunks begin (orjson: compact, ``text`` first)
AFTER_TEXT = b',"output_ids":['  # what follows the text's closing quote in SGLang's compact spelling
SUFFIX_PARSE_BYTES = 2048  # events at least this long have only their new tokens parsed (``ChunkDecoder``)
_MINUS_INF = float("-inf")
MARK_BYTES = 16  # bytes at the end of each part of the previous event checked before they are skipped


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


class _Mark(NamedTuple):
    """How long one part of the previous long event was (from where the part begins to where it
    ends, the end excluded) and its last bytes (at most ``MARK_BYTES``)."""

    length: int = 0
    last: bytes = b""

    @staticmethod
    def of(body: Buffer, begin: int, end: int) -> _Mark:
        return _Mark(end - begin, bytes(body[max(begin, end - MARK_BYTES):end]))

    def resume(self, body: Buffer, begin: int, hi: int) -> int:
        """Where to search this event's part that begins at ``begin``: past the bytes the previous
        event had there when its last bytes are found where they were, else ``begin``."""
        end = begin + self.length
        if self.last and end <= hi and body.startswith(self.last, end - len(self.last)):
            return end
        return begin


class _Layout(NamedTuple):
    """The previous long event's text, ids and log-probabilities: where each ended."""

    text: _Mark = _Mark()
    ids: _Mark = _Mark()
    logprobs: _Mark = _Mark()


# the C scanner under ``json.loads``, without its wrappers (an attribute JSONDecoder.__init__ sets; typeshed omits it)
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads_compact(text: Buffer) -> Any:
    """``json.loads`` of JSON text built here from an event's bytes (UTF-8, no leading space):
    the same value or a ``ValueError``, for a third of the per-call cost of ``json.loads``."""
    string = text.decode()  # UnicodeDecodeError is a ValueError
    try:
        value, end = _scan_json(string, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(string) and string[end:].strip(" \t\n\r"):
        raise ValueError("extra data")
    return value


def _array_open(body: Buffer, key: bytes, start: int, end: int) -> int:
    """Index of the ``[`` that opens the array after ``key`` (found in ``body[start:end]``), or -1."""
    at = body.find(key, start, end)
    if at < 0:
        return -1
    at += len(key)
    while at < end and body[at] in b" \t\r\n":
        at += 1
    return at if at < end and body[at] == ord("[") else -1


def _tail_start(body: Buffer, opening: int, end: int, separator: bytes, count: int) -> int:
    """Where the last ``count`` items of the array ``body[opening:end]`` begin: ``count`` separators
    back, or the array's opening when there are fewer (the parse then finds too few items)."""
    at = end
    for _ in range(count):
        at = body.rfind(separator, opening + 1, at)
        if at < 0:
            return opening
    return at


def _string_end(body: Buffer, start: int, hi: int) -> int:
    """Index of the quote that closes a JSON string whose content continues from ``start`` (an
    escape boundary), examining only bytes from there; -1 when there is none or the part from
    ``start`` is not valid JSON string content."""
    at = start
    while True:
        quote = body.find(b'"', at, hi)
        if quote < 0:
            return -1
        slashes = quote
        while slashes > start and body[slashes - 1] == 92:  # a backslash
            slashes -= 1
        if (quote - slashes) % 2 == 0:
            break
        at = quote + 1
    try:  # validate the content from ``start`` as a whole parse would
        rest = body[start:quote + 1].decode()
        if json.decoder.scanstring(rest, 0)[1] != len(rest):  # type: ignore[attr-defined]  # not in typeshed
            return -1
    except (UnicodeDecodeError, ValueError):
        return -1
    return quote


class ChunkDecoder:
    """Turn SSE payloads into ``TokenChunk``s (cumulative or incremental lists).

    ``decode_event`` parses an event's new tokens only (the module's docstring):
    an event of ``SUFFIX_PARSE_BYTES`` or more in SGLang's key order has its
    ``text`` cut out (its end searched from the previous text's end), its arrays
    located (each searched from the previous array's end) and cut out, the rest
    parsed whole (it is small), and only the arrays' last ``completion_tokens -
    seen`` items parsed. An event whose log-probability triples carry text
    (``return_text_in_logprobs``, never asked for) or that does not have the
    expected shape is parsed whole."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.seen = 0
        self.parsed_bytes = 0  # bytes handed to the JSON parser: the work that must stay linear in a stream
        self.searched_bytes = 0  # bytes of long events searched: linear too, once the layout is known
        self._layout = _Layout()

    def decode_event(self, body: Buffer, lo: int = 0, hi: int | None = None) -> TokenChunk:
        """The tokens of the event ``body[lo:hi]`` (bounds: a long event is read where it lies in the
        receive buffer, not copied out of it)."""
        hi = len(body) if hi is None else hi
        if hi - lo >= SUFFIX_PARSE_BYTES:
            chunk = self._decode_suffix(body, lo, hi)
            if chunk is not None:
                return chunk
        self._layout = _Layout()  # parsed whole: the next event is searched from its start
        self.parsed_bytes += hi - lo
        event = body[lo:hi] if lo or hi < len(body) else body
        try:
            payload = json.loads(event)
        except ValueError:
            raise EngineCallError(self.engine_id, f"undecodable chunk {bytes(event[:100])!r}") from None
        if not isinstance(payload, dict):
            raise EngineCallError(self.engine_id, f"chunk is not an object: {bytes(event[:100])!r}")
        return self.decode(payload)

    def _decode_suffix(self, body: Buffer, lo: int, hi: int) -> TokenChunk | None:
        text_end, ids_open = self._text_end(body, lo, hi)
        ids_from = self._layout.ids.resume(body, ids_open + 1, hi) if ids_open >= 0 else -1
        ids_close = body.find(b"]", ids_from, hi) if ids_open >= 0 else -1
        lps_open, lps_close = self._logprobs_bounds(body, ids_close, hi) if ids_close >= 0 else (-1, -1)
        self.searched_bytes += max(ids_close, ids_from) - ids_from
        if lps_close <= 0 or body.find(b'"', ids_from, ids_close) >= 0:
            return None  # not SGLang's key order or triples, or text inside an array (a bracket may be quoted)
        text_head = body[lo:ids_open + 1] if text_end < 0 else TEXT_OPEN + body[text_end:ids_open + 1]
        head = text_head + body[ids_close:lps_open + 1] + body[lps_close:hi]
        self.parsed_bytes += len(head)
        try:
            payload = _loads_compact(head)
        except ValueError:
            return None
        if not isinstance(payload, dict):
            return None
        meta = payload.get("meta_info")
        if "error" in payload or not isinstance(meta, dict):
            return self.decode(payload)
        try:
            new = max(int(meta["completion_tokens"]) - self.seen, 0)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        chunk = self._new_tokens(body, new, (ids_open, ids_close), (lps_open, lps_close), meta)
        if chunk is not None:
            self._layout = _Layout(_Mark.of(body, lo + len(TEXT_OPEN), text_end) if text_end >= 0 else _Mark(),
                                   _Mark.of(body, ids_open + 1, ids_close), _Mark.of(body, lps_open + 1, lps_close))
        return chunk

    def _logprobs_bounds(self, body: Buffer, ids_close: int, hi: int) -> tuple[int, int]:
        """The ``[`` and ``]`` of ``output_token_logprobs`` after the ids, its closing ``]`` searched
        from the previous array's end when its last bytes are where they were; (-1, -1) when the
        array is not there or does not hold triples without text."""
        lps_open = _array_open(body, LOGPROBS_KEY, ids_close, hi)
        if lps_open < 0 or body[lps_open + 1:min(lps_open + 2, hi)] not in (b"]", b"["):
            return -1, -1
        lps_from = self._layout.logprobs.resume(body, lps_open + 1, hi)
        # the array ends at the last "]]" before the next quote (one-byte searches run at memchr speed;
        # a forward search for "]]" would test every "]" of the array, byte by byte)
        quote = body.find(b'"', lps_from, hi)
        quote = hi if quote < 0 else quote
        empty = body[lps_open + 1:lps_open + 2] == b"]"
        lps_close = lps_open + 1 if empty else body.rfind(b"]]", max(lps_open, lps_from - 1), quote) + 1
        self.searched_bytes += (quote - lps_from) + (lps_open - ids_close)
        if lps_close <= 0 or body[lps_close + 1:quote].strip(b" \t\r\n,}"):
            return -1, -1  # text after the array's last "]]" before a quote: triples that carry text
        return lps_open, lps_close

    def _new_tokens(self, body: Buffer, new: int, ids: tuple[int, int], lps: tuple[int, int],
                    meta: dict[str, Any]) -> TokenChunk | None:
        """The last ``new`` items of the arrays ``body[ids[0]:ids[1] + 1]`` and ``body[lps[0]:lps[1] + 1]``
        parsed; None when they are not JSON (the event is then parsed whole)."""
        (ids_open, ids_close), (lps_open, lps_close) = ids, lps
        ids_at = _tail_start(body, ids_open, ids_close, b",", new) if new else ids_close - 1
        lps_at = _tail_start(body, lps_open, lps_close, b"[", new) if new else lps_close
        ids_text, lps_text = b"[" + body[ids_at + 1:ids_close] + b"]", b"[" + body[lps_at:lps_close] + b"]"
        self.parsed_bytes += len(ids_text) + len(lps_text)
        try:
            new_ids = _loads_compact(ids_text)
            new_lps = _loads_compact(lps_text)
        except ValueError:
            return None
        return self._tokens(new, new_ids, new_lps, meta)

    def _text_end(self, body: Buffer, lo: int, hi: int) -> tuple[int, int]:
        """The quote that closes the event's ``text`` when SGLang's compact spelling lets it be cut
        out, and the ``[`` that opens ``output_ids``; (-1, the ``[``) when the text is left in the
        head (parsed there). A cumulative stream repeats its text so far in every chunk: the end is
        searched from the previous text's end (when its last bytes are where they were), and is
        taken only when ``AFTER_TEXT`` follows it, which can follow only the string's real end."""
        start = lo + len(TEXT_OPEN)
        if body.startswith(TEXT_OPEN, lo, hi):
            for begin in dict.fromkeys((self._layout.text.resume(body, start, hi), start)):
                end = _string_end(body, begin, hi)
                self.searched_bytes += max(end, begin) - begin
                if end >= 0 and body.startswith(AFTER_TEXT, end + 1, hi):
                    self.parsed_bytes += end - begin
                    return end, end + len(AFTER_TEXT)
        ids_open = _array_open(body, IDS_KEY, lo, hi)
        self.searched_bytes += (ids_open if ids_open >= 0 else hi) - lo
        return -1, ids_open

    def decode(self, payload: dict[str, Any]) -> TokenChunk:
        if "error" in payload:
            error = payload["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise EngineCallError(self.engine_id, f"error chunk: {message}", retryable=_retryable_error(error))
        try:  # fields of the wrong JSON type: the engine's fault, not the proxy's (never a 500)
            meta = payload.get("meta_info") or {}
            ids = payload.get("output_ids") or []
            logprobs = meta.get("output_token_logprobs") or []
            total = meta.get("completion_tokens", len(ids))
            new = max(int(total) - self.seen, 0)
            new_ids = ids[len(ids) - new:] if new else []
            new_lps = logprobs[len(logprobs) - new:] if new else []
        except (AttributeError, TypeError, ValueError, OverflowError):
            raise EngineCallError(self.engine_id, f"malformed chunk {reprlib.repr(payload)}") from None
        return self._tokens(new, new_ids, new_lps, meta)

    def _tokens(self, new: int, new_ids: list, new_lps: list, meta: dict[str, Any]) -> TokenChunk:
        if len(new_ids) != new or len(new_lps) != new:
            raise EngineCallError(self.engine_id, f"chunk announces {new} new tokens but carries "
                                              f"{len(new_ids)} ids and {len(new_lps)} logprobs")
        try:  # float rounding can push a log-probability a hair above 0
            values = tuple([min(float(lp[0] if isinstance(lp, (list, tuple)) else lp), 0.0) for lp in new_lps])
        except (TypeError, ValueError, IndexError):
            raise EngineCallError(self.engine_id, "chunk carries a log-probability that is not a number") from None
        # every value is <= 0: a sum above -inf has neither NaN nor -inf in it (one C loop; a sum that
        # overflows, or the rare bad value, is decided by the test of every value)
        if not sum(values) > _MINUS_INF and any(v != v or v == _MINUS_INF for v in values):
            raise EngineCallError(self.engine_id, "chunk carries a non-finite log-probability")
        try:
            ids = tuple(map(int, new_ids))
        except (TypeError, ValueError):
            raise EngineCallError(self.engine_id, "chunk carries a token id that is not a number") from None
        finish = meta.get("finish_reason")
        if finish is not None and not isinstance(finish, dict):
            raise EngineCallError(self.engine_id, f"chunk's finish_reason is not an object: {reprlib.repr(finish)}")
        self.seen += new
        version = meta.get("weight_version")
        return TokenChunk(ids, values, finish, None if version is None else str(version))


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
