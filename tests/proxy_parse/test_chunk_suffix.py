"""The engine stream's decoding: parsing only each chunk's new suffix changes nothing.

Properties, for SGLang ``/generate`` streams drawn in both modes (cumulative and
incremental lists), both JSON spellings (compact like orjson, spaced like
``json.dumps``), text that contains the arrays' keys and brackets, triples that
carry text, and chunks that announce more tokens than they carry:
- ``ChunkDecoder.decode_event`` on the raw bytes yields exactly what a whole
  parse (``ChunkDecoder.decode(json.loads(...))``) yields, or raises the same
  ``EngineCallError``;
- so does ``decode_event`` on an event read where it lies in a larger buffer (bounds, no copy);
- ``EventSplitter`` returns the same events' data however the bytes are cut into reads (LF or CR LF);
- ``EngineClient._chunks`` yields the same tokens however a stream is cut into reads, with LF or
  CR LF line ends (a CR LF may be cut between two reads);
- so does the real receive path (``http_client``'s connection buffer and in-place chunked decoding)
  however the wire is cut into reads and the stream into chunks.
"""

from __future__ import annotations

import asyncio
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.proxy import engine_stream
from gyre.real.proxy.engine_client import ChunkDecoder, EngineCallError, EngineClient, TokenChunk
from gyre.real.proxy.http_client import HttpClient, Response, _Connection

try:
    from hypothesis_budget import examples
except ImportError:  # run from another rootdir
    def examples(full: int) -> int:
        return full

PROPERTY = settings(max_examples=examples(200), deadline=None, derandomize=True)
TEXTS = st.sampled_from(["", "plain", '"output_ids":[1,2]', "]] [[ ,", 'a "quoted" \\ text', "\u00e9\u4e2d"])


@st.composite
def streams(draw) -> list[bytes]:
    """The SSE payloads of one submission (lists long enough to take the suffix parse)."""
    tokens = draw(st.integers(1, 400))
    ids = draw(st.lists(st.integers(0, 150_000), min_size=tokens, max_size=tokens))
    logprobs = [-(i % 997) / 97.0 for i in range(tokens)]
    incremental = draw(st.booleans())
    spaced = draw(st.booleans())
    triple_text = draw(st.booleans())
    cumulative_text, text = draw(st.booleans()), ""
    cuts = sorted(set(draw(st.lists(st.integers(1, tokens), max_size=8)) + [tokens]))
    short = draw(st.sampled_from([None, *range(len(cuts))]))  # a chunk that announces one token too many
    payloads, sent = [], 0
    for n, cut in enumerate(cuts):
        first = sent if incremental else 0
        triples = [[lp, t, draw(TEXTS) if triple_text else None] for lp, t in zip(logprobs[first:cut], ids[first:cut])]
        meta = {"id": "r", "finish_reason": {"type": "stop"} if cut == tokens else None,
                "completion_tokens": cut + (n == short), "output_token_logprobs": triples, "weight_version": "v1"}
        piece = draw(TEXTS) * draw(st.integers(0, 50))
        text = text + piece if cumulative_text else piece  # SGLang's cumulative mode repeats the text so far
        payload = {"text": text, "output_ids": ids[first:cut], "meta_info": meta}
        separators = (", ", ": ") if spaced else (",", ":")
        payloads.append(json.dumps(payload, separators=separators, ensure_ascii=draw(st.booleans())).encode())
        sent = cut
    return payloads


def _outcomes(decode, payloads: list[bytes]) -> list[TokenChunk | str]:
    outcomes: list[TokenChunk | str] = []
    for payload in payloads:
        try:
            outcomes.append(decode(payload))
        except EngineCallError as exc:
            outcomes.append(str(exc))
            break
    return outcomes


@PROPERTY
@given(streams())
def test_suffix_parse_matches_a_whole_parse(payloads):
    whole = ChunkDecoder("e0")
    suffix = ChunkDecoder("e0")
    expected = _outcomes(lambda body: whole.decode(json.loads(body)), payloads)
    assert _outcomes(suffix.decode_event, payloads) == expected


@PROPERTY
@given(streams(), st.binary(max_size=30), st.binary(max_size=30))
def test_an_event_read_in_place_matches_a_copy(payloads, before, after):
    copied, in_place = ChunkDecoder("e0"), ChunkDecoder("e0")
    expected = _outcomes(copied.decode_event, payloads)
    got = _outcomes(lambda body: in_place.decode_event(bytearray(before + body + after), len(before),
                                                       len(before) + len(body)), payloads)
    assert got == expected
    assert in_place.parsed_bytes == copied.parsed_bytes  # the same parse: the suffix one where it applies


class _Pieces:
    """A response whose body arrives in the given reads (``Response.iter_in_place``'s contract)."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads
        self.buffer = bytearray()
        self.body_start = 0

    @property
    def body_end(self) -> int:
        return len(self.buffer)

    def consume(self, n: int) -> None:
        self.body_start += n
        assert self.body_start <= len(self.buffer)

    async def iter_in_place(self):
        for read in self.reads:
            self.buffer = self.buffer[self.body_start:] + read  # a new buffer: offsets move, as they may
            self.body_start = 0
            yield len(read)


def _tokens_of(stream: bytes, cuts: list[int]) -> list[int]:
    reads, at = [], 0
    for cut in [*cuts, len(stream)]:
        if stream[at:at + cut]:
            reads.append(stream[at:at + cut])
        at += cut

    async def run() -> list[int]:
        ids: list[int] = []
        async for chunk in EngineClient._chunks(None, _Pieces(reads), ChunkDecoder("e0")):
            ids += chunk.ids
        return ids

    return asyncio.run(run())


@PROPERTY
@given(streams(), st.lists(st.integers(1, 3000), max_size=30), st.booleans())
def test_tokens_are_the_same_however_the_stream_is_cut(payloads, cuts, crlf):
    expected = _outcomes(ChunkDecoder("e0").decode_event, payloads)
    if any(isinstance(outcome, str) for outcome in expected):
        return  # a stream that fails: covered above
    end = b"\r\n" if crlf else b"\n"
    stream = b"".join(b"data: " + p + end + end for p in payloads) + b"data: [DONE]" + end + end
    assert _tokens_of(stream, cuts) == [i for chunk in expected for i in chunk.ids]


def _chunked_wire(stream: bytes, sizes: list[int]) -> bytes:
    """``stream`` in the chunked transfer coding: one chunk per event (as uvicorn sends them), or
    chunks of the given sizes cutting across events."""
    pieces, at = [], 0
    if not sizes:
        pieces = [event + b"\n\n" for event in stream.split(b"\n\n")[:-1]]
    for size in sizes:
        if at < len(stream):
            pieces.append(stream[at:at + size])
            at += size
    if sizes and at < len(stream):
        pieces.append(stream[at:])
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _received_tokens(wire: bytes, cuts: list[int]) -> list[int]:
    """The tokens ``EngineClient._chunks`` yields from ``wire`` received by a real connection in
    reads cut at ``cuts`` (the event loop's ``get_buffer`` / ``buffer_updated`` calls)."""
    async def run() -> list[int]:
        conn = _Connection(asyncio.get_running_loop())
        client = HttpClient(1.0, 5.0)
        response = Response(client, ("engine", 1, False), conn, 200, {"transfer-encoding": "chunked"}, 5.0)

        async def feed() -> None:
            at = 0
            for cut in [*cuts, len(wire)]:
                piece = wire[at:at + cut]
                at += cut
                while piece:
                    view = conn.get_buffer(-1)
                    n = min(len(view), len(piece))
                    view[:n] = piece[:n]
                    conn.buffer_updated(n)
                    piece = piece[n:]
                await asyncio.sleep(0)

        feeder = asyncio.ensure_future(feed())
        ids: list[int] = []
        async for chunk in EngineClient._chunks(None, response, ChunkDecoder("e0")):
            ids += chunk.ids
        await EngineClient._drain(response)  # what follows the finish, as ``EngineClient.stream`` does
        await feeder
        assert client._idle  # read to its end: the connection went back to the pool
        return ids

    return asyncio.run(run())


@PROPERTY
@given(streams(), st.lists(st.integers(1, 5000), max_size=30), st.lists(st.integers(1, 4000), max_size=6))
def test_the_receive_path_yields_the_same_tokens_however_the_wire_is_cut(payloads, cuts, sizes):
    """The real receive path (in-place chunked decoding in the connection's buffer, events decoded
    where they lie): a recorded stream cut into reads anywhere, and into chunks anywhere, gives the
    tokens of a whole parse of each event."""
    expected = _outcomes(ChunkDecoder("e0").decode_event, payloads)
    if any(isinstance(outcome, str) for outcome in expected):
        return  # a stream that fails: covered above
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    assert _received_tokens(_chunked_wire(stream, sizes), cuts) == [i for c in expected for i in c.ids]


def test_a_crlf_cut_between_two_reads_still_ends_an_event():
    event = json.dumps({"text": "", "output_ids": [5], "meta_info": {
        "completion_tokens": 1, "output_token_logprobs": [[-0.5, 5, None]], "finish_reason": None}}).encode()
    stream = b"data: " + event + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    for cut in range(1, len(stream)):
        assert _tokens_of(stream, [cut]) == [5], cut


class WholeParseCounter(ChunkDecoder):
    """A decoder that notes every payload it parses whole (``decode``: the path the suffix parse skips)."""

    def __init__(self, engine_id: str) -> None:
        super().__init__(engine_id)
        self.whole: list[bytes] = []

    def decode(self, payload):
        self.whole.append(payload)
        return super().decode(payload)


def test_suffix_parse_is_taken_for_long_cumulative_chunks():
    """The property above would pass with the suffix parse never taken: check it is."""
    payloads = [json.dumps({"text": "", "output_ids": list(range(k)), "meta_info": {
        "completion_tokens": k, "finish_reason": None,
        "output_token_logprobs": [[-0.5, i, None] for i in range(k)]}}, separators=(",", ":")).encode()
        for k in range(1, 400)]
    decoder = WholeParseCounter("e0")
    whole = decoder.whole
    chunks = [decoder.decode_event(p) for p in payloads]
    assert [c.ids for c in chunks] == [(k,) for k in range(399)]
    assert sum(len(p) >= engine_stream.SUFFIX_PARSE_BYTES for p in payloads) > 250
    assert len(whole) == sum(len(p) < engine_stream.SUFFIX_PARSE_BYTES for p in payloads)


@PROPERTY
@given(st.lists(st.one_of(st.binary(max_size=40), st.binary(max_size=40).map(lambda b: b"data: " + b))
                .map(lambda b: re.sub(b"\n+", b"\n", b.replace(b"\r", b"")).rstrip(b"\n")), max_size=12),
       st.lists(st.integers(1, 60), max_size=20), st.booleans())
def test_events_are_the_same_however_the_bytes_arrive(events, reads, crlf):
    """With LF or CR LF line ends, and a CR LF cut anywhere between two reads."""
    end = b"\r\n" if crlf else b"\n"
    stream = b"".join(e.replace(b"\n", end) + end + end for e in events)
    buffer, splitter, got, at = bytearray(), engine_stream.EventSplitter(), [], 0
    for size in [*reads, len(stream)]:
        buffer += stream[at:at + size]
        at += size
        got += engine_stream._split_events(buffer, splitter)
    assert got == [d for d in map(engine_stream._event_data, events) if d is not None]
    assert not buffer


def _sglang_event(ids: list[int], total: int, text: str = "") -> bytes:
    """A compact SGLang chunk carrying ``ids`` (all so far when cumulative, the new ones when incremental)."""
    return json.dumps({"text": text, "output_ids": ids, "meta_info": {
        "id": "r", "finish_reason": None, "completion_tokens": total,
        "output_token_logprobs": [[-0.25, i, None] for i in ids], "weight_version": "v1"}},
        separators=(",", ":"), ensure_ascii=False).encode()


def test_a_cumulative_chunk_costs_a_parse_of_its_new_suffix_only():
    """Counted, not timed: the bytes each cumulative chunk hands the JSON parser stay within the
    same chunk's incremental spelling (its new token and the small head), so a stream's parse is
    linear in its length; a whole parse of the 1,500th chunk would hand it ~35 KB."""
    decoder = ChunkDecoder("e0")
    ids = [(7919 * k) % 150_000 for k in range(1500)]
    for n in range(1, len(ids) + 1):
        before = decoder.parsed_bytes
        chunk = decoder.decode_event(_sglang_event(ids[:n], n))
        assert chunk.ids == (ids[n - 1],)
        bound = max(len(_sglang_event(ids[n - 1:n], n)) + 16, 4096)  # a chunk under 4 KB may be parsed whole
        assert decoder.parsed_bytes - before <= bound, (n, decoder.parsed_bytes - before)


def test_a_multi_line_event_read_byte_by_byte_keeps_its_lines():
    """A line end seen in an earlier read still marks the event as more than one ``data:`` line."""
    stream = b"data: a\r\ndata: b\n\ndata: c\r\n\r\n"
    buffer, splitter, got = bytearray(), engine_stream.EventSplitter(), []
    for at in range(len(stream)):
        buffer += stream[at:at + 1]
        got += engine_stream._split_events(buffer, splitter)
    assert got == [b"a\nb", b"c"]


def test_a_cumulative_text_costs_a_scan_of_its_new_part_only():
    """SGLang's cumulative chunks repeat the text so far: only its new part reaches a parser or a
    search (the old part is skipped), and so do only the new parts of the arrays, so the bytes
    parsed and searched per chunk stay bounded while the chunk grows; the ids are those of a
    whole parse."""
    decoder, words = ChunkDecoder("e0"), ['run "tests" ', "\u00e9t\u00e9 ", "a\\b ", "line\n"]
    ids = [(7919 * k) % 150_000 for k in range(1500)]
    for n in range(1, len(ids) + 1):
        before = decoder.parsed_bytes
        event = _sglang_event(ids[:n], n, "".join(words[k % 4] for k in range(n)))
        searched = decoder.searched_bytes
        chunk = decoder.decode_event(event)
        assert chunk.ids == (ids[n - 1],)
        assert decoder.parsed_bytes - before <= 4096, (n, decoder.parsed_bytes - before)
        assert decoder.searched_bytes - searched <= 4096, (n, decoder.searched_bytes - searched)
    assert len(event) > 40_000 and decoder._layout.text.length > 10_000  # the last chunk's text (~12 KB) was cut out


@st.composite
def rewritten_streams(draw) -> list[bytes]:
    """A compact cumulative stream with text, one of whose chunks rewrites what earlier chunks
    sent: its text, an old id (of another length), or an old triple dropped or doubled."""
    tokens = draw(st.integers(120, 300))
    ids = draw(st.lists(st.integers(0, 150_000), min_size=tokens, max_size=tokens))
    cuts = sorted(set(draw(st.lists(st.integers(100, tokens), min_size=2, max_size=6)) + [tokens]))
    texts = [draw(TEXTS) * draw(st.integers(0, 8)) for _ in cuts]
    victim = draw(st.integers(1, max(len(cuts) - 1, 1)))
    how = draw(st.sampled_from(["text", "id", "drop", "double"]))
    payloads = []
    for n, cut in enumerate(cuts):
        chunk_ids, text = list(ids[:cut]), "".join(texts[:n + 1])
        triples = [[-(i % 97) / 7.0, t, None] for i, t in enumerate(chunk_ids)]
        if n == victim:
            old = draw(st.integers(0, cuts[n - 1] - 1))
            if how == "text":
                text = draw(TEXTS) * draw(st.integers(0, 8)) + texts[n]
            elif how == "id":
                chunk_ids[old] = draw(st.integers(0, 10**12))
            elif how == "drop":
                del chunk_ids[old], triples[old]
            else:
                chunk_ids.insert(old, chunk_ids[old])
                triples.insert(old, triples[old])
        meta = {"id": "r", "finish_reason": {"type": "stop"} if cut == tokens else None,
                "completion_tokens": cut, "output_token_logprobs": triples}
        payloads.append(json.dumps({"text": text, "output_ids": chunk_ids, "meta_info": meta},
                                   separators=(",", ":"), ensure_ascii=draw(st.booleans())).encode())
    return payloads


@settings(max_examples=examples(60), deadline=None, derandomize=True)  # streams of 100-300 tokens: the slow ones
@given(rewritten_streams())
def test_a_chunk_that_rewrites_what_was_sent_decodes_as_a_whole_parse(payloads):
    """The old part of a cumulative chunk is skipped, not read: a chunk whose old part differs
    from what was sent before (another text, an id of another length, a token dropped or
    doubled) still yields exactly what a whole parse yields (which reads only the last items)."""
    whole, suffix = ChunkDecoder("e0"), ChunkDecoder("e0")
    expected = _outcomes(lambda body: whole.decode(json.loads(body)), payloads)
    assert _outcomes(suffix.decode_event, payloads) == expected


def test_a_long_incremental_stream_takes_the_suffix_parse_for_every_chunk():
    """Chunks of an incremental stream do not repeat the previous one: its layout is not
    trusted (its last bytes are not where they were) and each chunk is searched from its start,
    never parsed whole because a skip landed past its arrays."""
    decoder, sent = WholeParseCounter("e0"), 0
    for size in [300, 120, 250, 90, 400, 100, 100, 310]:
        ids = [(7919 * (sent + k)) % 150_000 for k in range(size)]
        sent += size
        chunk = decoder.decode_event(_sglang_event(ids, sent, "w" * (size % 7)))
        assert chunk.ids == tuple(ids)
    assert decoder.whole == []


def test_a_rewritten_text_is_searched_from_its_start_not_parsed_whole():
    """A text that does not extend the previous one is found by a search from its start, and the
    chunk still takes the suffix parse: shorter, another one, or one whose last bytes are where
    the old ones were but whose old end now falls inside an escape (a backslash moved by one),
    where the end found from the old end is refused as no ``,"output_ids":[`` follows it."""
    decoder = WholeParseCounter("e0")
    ids = [(7919 * k) % 150_000 for k in range(420)]
    texts = ["x" * 300, "\\" * 200, "a" + "\\" * 200, "short", 'y' * 390 + '"quoted" and more', "z" * 500]
    for n, text in enumerate(texts, start=396):
        chunk = decoder.decode_event(_sglang_event(ids[:n], n, text))
        assert chunk.ids == (tuple(ids[:n]) if n == 396 else (ids[n - 1],))
    assert decoder.whole == []
