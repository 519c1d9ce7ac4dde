"""Bytes on the wire: the Anthropic event stream (``api.anthropic.stream``, built from prebuilt
event blocks) and the request body's decoding (``fields._decode``, a fast path for UTF-8).

Properties of the body decoder: for JSON in every UTF that ``json.loads`` detects (with and without
a BOM), arbitrary bytes and text with lone surrogates, it gives what ``json.loads`` gives, value or
kind of error.

Properties of the stream, for any sequence of thinking, text and tool-call events (text with quotes, escapes,
non-ASCII and lone surrogates), ended by any ``Finished``:
- every event is ``sse(name, data)`` of its own data, byte for byte (the prebuilt blocks write what
  the JSON encoder writes), and its data is JSON in valid UTF-8;
- the events follow the official order: ``message_start``, per block ``content_block_start``
  (``ping`` after the first), its deltas, ``content_block_stop``; ``message_delta``, ``message_stop``;
- the deltas of each block put back together are the events' texts, in order.
"""

from __future__ import annotations

import asyncio
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.proxy import fields
from gyre.real.proxy.api import anthropic
from gyre.real.proxy.request import ChatRequest, Finished, Prepared
from gyre.real.proxy.toolcalls import OutputEvent, ToolCall

try:
    from hypothesis_budget import examples
except ImportError:  # run from another rootdir
    def examples(full: int) -> int:
        return full

PROPERTY = settings(max_examples=examples(200), deadline=None, derandomize=True)
TEXTS = st.one_of(st.sampled_from(["", "ok", 'a "quoted" \\ text\n', "\u00e9\u4e2d", "\ud800 lone", "</think>"]),
                  st.text(max_size=12))
EVENTS = st.lists(st.one_of(
    st.builds(OutputEvent, st.sampled_from(["text", "thinking"]), TEXTS),
    st.builds(lambda text, name: OutputEvent("tool_call", "toolu_1", ToolCall(name, {"q": text}, "")),
              TEXTS, st.sampled_from(["Read", "Bash"]))), max_size=8)
EVENT = re.compile(rb"event: ([a-z_]+)\ndata: (.*?)\n\n", re.S)


def _prepared() -> Prepared:
    request = ChatRequest(api="anthropic", model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                          stream=True)
    return Prepared(request=request, execution_id="e", request_id="0" * 24, prompt_text="", input_ids=[1, 2],
                    reused_ids=0, in_thinking=False, started_at=0.0)


async def _written(events: list[OutputEvent], finished: Finished) -> bytes:
    async def source():
        for event in events:
            yield event
        yield finished

    return b"".join([chunk async for chunk in anthropic.stream(source(), _prepared())])


@PROPERTY
@given(EVENTS, st.sampled_from(["stop", "length", "tool_calls", "stop_sequence"]), st.one_of(st.none(), TEXTS))
def test_every_event_is_its_data_encoded_and_in_the_official_order(events, reason, stop_sequence):
    finished = Finished(output_ids=[1], logprobs=[-0.1], text="", thinking="", tool_calls=[], stop_reason=reason,
                        stop_sequence=stop_sequence, input_tokens=2, output_tokens=1)
    written = asyncio.run(_written(events, finished))
    parsed = [(name.decode(), json.loads(data.decode("utf-8"))) for name, data in EVENT.findall(written)]
    assert b"".join(anthropic.sse(name, data) for name, data in parsed) == written
    names = [name for name, _ in parsed]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    blocks = " ".join(names[1:-2]).replace("content_block_start ping", "content_block_start", 1)
    assert re.fullmatch(r"(content_block_start( content_block_delta)* content_block_stop ?)+", blocks), names
    texts = {}
    for name, data in parsed:
        if name == "content_block_delta" and data["delta"]["type"] in ("text_delta", "thinking_delta"):
            key = data["delta"]["type"][:-len("_delta")]
            texts.setdefault(data["index"], (key, []))[1].append(data["delta"][key])
    expected: list[tuple[str, list[str]]] = []
    for event in events:
        if event.kind == "tool_call":
            expected.append(("tool", []))
        elif expected and expected[-1][0] == event.kind:
            expected[-1][1].append(event.text)
        else:
            expected.append((event.kind, [event.text]))
    assert [(kind, "".join(parts)) for kind, parts in texts.values()] == \
        [(kind, "".join(parts)) for kind, parts in expected if kind != "tool"]


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                           max_leaves=8)
ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])


def _outcome(decode, raw: bytes):
    try:
        return "value", decode(raw)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


@PROPERTY
@given(st.one_of(st.tuples(JSON_VALUES, ENCODINGS).map(lambda v: json.dumps(v[0], ensure_ascii=False).encode(v[1])),
                 st.binary(max_size=24), st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_the_body_decoder_reads_what_json_loads_reads(raw):
    """``fields._decode`` (no encoding detection for a plainly UTF-8 body, one decoder for every call)
    gives what ``json.loads`` gives, value or kind of error, for bodies in every UTF json.loads detects."""
    reference = _outcome(lambda data: json.loads(data, parse_constant=fields._constant), raw)
    assert _outcome(fields._decode, raw) == reference


@PROPERTY
@given(request_id=st.one_of(st.text("0123456789abcdef", min_size=24, max_size=24), st.text(max_size=6)),
       model=TEXTS, size=st.integers(0, 40_000))
def test_message_start_is_the_empty_response_encoded(request_id, model, size):
    """``message_start`` comes from a prebuilt block (only the id, the model and the prompt's size
    encoded): byte for byte ``sse`` of the empty ``response`` of its call, whatever the model's name
    (quotes, non-ASCII, lone surrogates) or the id."""
    prepared = _prepared()
    prepared.request.model, prepared.request_id, prepared.input_ids = model, request_id, range(size)
    empty = Finished(output_ids=[], logprobs=[], text="", thinking="", tool_calls=[], stop_reason="stop",
                     stop_sequence=None, input_tokens=0, output_tokens=0)
    message = dict(anthropic.response(prepared, empty), content=[], stop_reason=None, stop_sequence=None)
    assert anthropic._message_start(prepared) == anthropic.sse("message_start", {"type": "message_start",
                                                                                 "message": message})


@PROPERTY
@given(reason=st.sampled_from(sorted(anthropic.STOP_REASONS)), stop_sequence=st.one_of(st.none(), TEXTS),
       output_tokens=st.one_of(st.integers(0, 2**40), st.booleans()))
def test_message_delta_is_its_data_encoded(reason, stop_sequence, output_tokens):
    """``message_delta`` comes from a prebuilt block (only the stop sequence and the count encoded): byte
    for byte ``sse`` of its data, whatever the stop sequence (quotes, non-ASCII, lone surrogates)."""
    finished = Finished(output_ids=[], logprobs=[], text="", thinking="", tool_calls=[], stop_reason=reason,
                        stop_sequence=stop_sequence, input_tokens=0, output_tokens=output_tokens)
    delta = {"stop_reason": anthropic.STOP_REASONS[reason], "stop_sequence": stop_sequence}
    assert anthropic._message_delta(finished) == anthropic.sse("message_delta", {
        "type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}})
