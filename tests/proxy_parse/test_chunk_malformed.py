"""Any JSON event an engine sends either yields tokens or raises ``EngineCallError``
(``engine_stream``'s invariants): fields of the wrong JSON type (``meta_info`` a list,
``completion_tokens`` null or huge, ``output_ids`` a number, a log-probability an empty
triple, ``finish_reason`` a string) are the engine's failure, never a ``TypeError`` or
``AttributeError`` that the server would answer with a 500. Events long enough for the
suffix parse and short ones alike."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.proxy.engine_client import ChunkDecoder, EngineCallError, TokenChunk
from gyre.real.proxy.engine_stream import SUFFIX_PARSE_BYTES

try:
    from hypothesis_budget import examples
except ImportError:  # run from another rootdir
    def examples(full: int) -> int:
        return full

PROPERTY = settings(max_examples=examples(400), deadline=None, derandomize=True)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70), st.floats(allow_nan=False),
                    st.sampled_from([1e400, -1e400]), st.text(max_size=5))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                           max_leaves=8)
# each field well-formed or of any JSON type
ids_field = st.one_of(st.lists(st.integers(0, 1000), max_size=6), json_values)
lps_field = st.one_of(st.lists(st.tuples(st.floats(-5, 0), st.integers(0, 1000), st.none()).map(list), max_size=6),
                      st.lists(st.one_of(st.lists(json_values, max_size=2), json_values), max_size=4), json_values)
meta_field = st.one_of(
    st.fixed_dictionaries({}, optional={"completion_tokens": st.one_of(st.integers(0, 8), json_values),
                                        "output_token_logprobs": lps_field,
                                        "finish_reason": st.one_of(st.none(), st.just({"type": "stop"}), json_values),
                                        "weight_version": json_values}),
    json_values)
events = st.fixed_dictionaries({}, optional={"text": st.text(max_size=10), "output_ids": ids_field,
                                             "meta_info": meta_field, "error": json_values})


def _decode_all(payloads: list[dict], long: bool) -> None:
    decoder = ChunkDecoder("e0")
    for payload in payloads:
        if long:  # padded past SUFFIX_PARSE_BYTES in the text, where SGLang's compact spelling puts it
            payload = {"text": "x" * SUFFIX_PARSE_BYTES, **{k: v for k, v in payload.items() if k != "text"}}
        body = json.dumps(payload, separators=(",", ":")).encode()
        try:
            chunk = decoder.decode_event(body)
        except EngineCallError:
            return
        assert isinstance(chunk, TokenChunk)
        assert chunk.finish is None or isinstance(chunk.finish, dict)
        assert len(chunk.ids) == len(chunk.logprobs)
        assert all(isinstance(i, int) for i in chunk.ids) and all(lp <= 0 for lp in chunk.logprobs)


@PROPERTY
@given(st.lists(events, min_size=1, max_size=4), st.booleans())
def test_any_json_event_yields_tokens_or_an_engine_error(payloads, long):
    _decode_all(payloads, long)


@pytest.mark.parametrize("payload", [
    {"output_ids": [1], "meta_info": ["not", "an", "object"]},
    {"output_ids": [1], "meta_info": "x"},
    {"output_ids": [1], "meta_info": {"completion_tokens": None, "output_token_logprobs": [[-0.1, 1, None]]}},
    {"output_ids": [1], "meta_info": {"completion_tokens": "x", "output_token_logprobs": [[-0.1, 1, None]]}},
    {"output_ids": [1], "meta_info": {"completion_tokens": 1e400, "output_token_logprobs": [[-0.1, 1, None]]}},
    {"output_ids": 5, "meta_info": {"completion_tokens": 1, "output_token_logprobs": [[-0.1, 1, None]]}},
    {"output_ids": [1], "meta_info": {"completion_tokens": 1, "output_token_logprobs": [[]]}},
    {"output_ids": [1], "meta_info": {"completion_tokens": 1, "output_token_logprobs": {"a": 1}}},
    {"output_ids": [1], "meta_info": {"completion_tokens": 1, "output_token_logprobs": [[-0.1, 1, None]],
                                      "finish_reason": "stop"}},
])
@pytest.mark.parametrize("long", [False, True])
def test_each_wrongly_typed_field_is_an_engine_error(payload, long):
    if long:
        payload = {"text": "x" * SUFFIX_PARSE_BYTES, **payload}
    with pytest.raises(EngineCallError, match="engine e0: "):
        ChunkDecoder("e0").decode_event(json.dumps(payload, separators=(",", ":")).encode())


@PROPERTY
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=6), st.booleans())
def test_a_long_event_without_a_token_count_is_parsed_whole(ids, finish):
    # the suffix parse needs ``completion_tokens``; without it the event is parsed whole, and a whole
    # parse counts the ids it carries
    meta = {"output_token_logprobs": [[-0.5, i, None] for i in ids], "finish_reason": {"type": "stop"} if finish
            else None}
    body = json.dumps({"text": "x" * SUFFIX_PARSE_BYTES, "output_ids": ids, "meta_info": meta},
                      separators=(",", ":")).encode()
    suffix, whole = ChunkDecoder("e0"), ChunkDecoder("e0")
    chunk = suffix.decode_event(body)
    assert chunk == whole.decode(json.loads(body))
    assert chunk.ids == tuple(ids) and suffix.parsed_bytes >= len(body)  # the whole event was parsed
