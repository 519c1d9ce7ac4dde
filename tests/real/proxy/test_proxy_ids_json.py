"""``proxy.ids_json``: an execution's id lists are encoded once and extended, always equal to a fresh encoding.

Generated call sequences (Hypothesis) mimic what executions send: follow-ups
that extend the previous context, sub-agent contexts that alternate with the
main one, contexts that shrink (compaction) and lists that share nothing.
Whatever the sequence, every text equals ``json.dumps`` of its list, and the
body sent to the engine parses to ``generate_payload``.
"""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings, strategies as st

from gyre.real.proxy.engine_client import generate_body, generate_payload
from gyre.real.proxy.ids_json import KEEP, IdsJson, encode_ids

ids = st.lists(st.integers(min_value=0, max_value=200_000), max_size=40)
# each step: start a new context (or pick one of the known contexts) and extend, cut or keep it
steps = st.lists(st.tuples(st.integers(min_value=0, max_value=5), st.sampled_from(["extend", "cut", "same", "new"]),
                           ids), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_every_encoding_equals_a_fresh_one(sequence):
    cache, contexts = IdsJson(), [[]]
    for pick, change, more in sequence:
        base = contexts[pick % len(contexts)]
        if change == "extend":
            current = base + more
        elif change == "cut":
            current = base[: len(base) // 2] + more
        elif change == "same":
            current = list(base)
        else:
            current = list(more)
        contexts.append(current)
        if pick % 2:  # the proxy's own form: an int32 array (the cache never aliases it)
            sent = np.asarray(current, dtype=np.int32)
            assert cache.encode(sent) == json.dumps(current, separators=(",", ":"))
            sent[:] = 7
        else:
            assert cache.encode(current) == json.dumps(current, separators=(",", ":"))
        assert len(cache._entries) <= KEEP


def _counted_cache() -> tuple[list[int], IdsJson]:
    """An ``IdsJson`` whose encoder of new ids appends each length it encodes to the returned list."""
    encoded: list[int] = []

    def counted(values) -> str:
        encoded.append(len(values))
        return encode_ids(values)

    return encoded, IdsJson(encode_new=counted)


def test_a_follow_up_encodes_only_its_new_tail():
    encoded, cache = _counted_cache()
    context = list(range(30_000))
    cache.encode(context)
    cache.encode(context + [7, 8, 9])
    cache.encode(list(range(5)))          # a sub-agent's own context
    cache.encode(context + [7, 8, 9, 10])  # the main context again: still extended
    assert encoded == [30_000, 3, 5, 1]


def test_the_engine_body_is_the_payload():
    sampling = {"max_new_tokens": 16, "temperature": 0.7, "stop": ["\u2028", "</s>"]}
    body = generate_body("r-1.0", IdsJson().encode([1, 2, 3]), sampling)
    assert json.loads(body) == generate_payload("r-1.0", [1, 2, 3], sampling)


def test_short_lists_are_extended_and_repeated_without_encoding_again():
    # short lists of one dtype are compared as bytes (ids_json.BYTES_COMPARE): a follow-up still encodes
    # only its tail, the same list again encodes nothing, and a list of another dtype still matches
    encoded, cache = _counted_cache()
    first = np.arange(5, dtype=np.int32)
    assert cache.encode(first) == "[0,1,2,3,4]"
    assert cache.encode(np.arange(8, dtype=np.int32)) == "[0,1,2,3,4,5,6,7]"
    assert cache.encode(np.arange(8, dtype=np.int32)) == "[0,1,2,3,4,5,6,7]"
    assert cache.encode([0, 1, 2, 3, 4, 5, 6, 7, 8]) == "[0,1,2,3,4,5,6,7,8]"  # int64 after int32
    assert cache.encode(np.array([0, 1, 2, 3, 9], dtype=np.int32)) == "[0,1,2,3,9]"  # shares only a prefix
    assert encoded == [5, 3, 1, 5]
