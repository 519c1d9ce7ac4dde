"""Fast paths on every call's path give what the code before them gave (kept here as references):

- ``toolcalls._partial_tag_len`` skips a tag whose first character is not among the text's last
  characters: the same length for any text and tags;
- ``http_client._chunk_size`` takes a bare hexadecimal size line without cutting and stripping it:
  the same size (or None) for any line;
- ``HttpClient._target`` keeps each URL's split: the same target as splitting it, an invalid URL
  refused every time, at most ``TARGETS`` URLs kept;
- ``ChunkDecoder._tokens`` checks the log-probabilities through their sum first: the same tokens, or
  the same error, for any values (NaN, -inf, sums that overflow, values that are not numbers).
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gyre.real.proxy.engine_stream import ChunkDecoder, EngineCallError
from gyre.real.proxy.http_client import TARGETS, HttpClient, HttpError, _chunk_size
from gyre.real.proxy.toolcalls import CALL_OPEN, THINK_CLOSE, _partial_tag_len

TAGS = (CALL_OPEN, THINK_CLOSE, "<x>", "<")


def _partial_tag_len_before(text: str, tags: tuple[str, ...]) -> int:
    best = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:size]):
                best = size
                break
    return best


@settings(max_examples=examples(2000), deadline=None)
@given(st.text(alphabet="<>/_tolcahink x", max_size=30), st.lists(st.sampled_from(TAGS), min_size=1, max_size=3))
def test_partial_tag_len_as_before(text, tags):
    assert _partial_tag_len(text, tuple(tags)) == _partial_tag_len_before(text, tuple(tags))


def test_partial_tag_len_finds_a_prefix_at_the_start_of_a_short_text():
    assert _partial_tag_len(CALL_OPEN[:8], (CALL_OPEN,)) == 8  # text shorter than the tag: searched whole


SIZE_PIECES = [b"0", b"7", b"a", b"F", b"x", b"_", b"+", b"-", b" ", b"\t", b";", b"=", b"g", b"\xa0", b"1f"]


def _chunk_size_before(line: bytes) -> int | None:
    digits = line.split(b";", 1)[0].strip()
    return int(digits, 16) if re.fullmatch(rb"[0-9A-Fa-f]{1,16}", digits) else None


@settings(max_examples=examples(2000), deadline=None)
@given(st.binary(max_size=3) | st.lists(st.sampled_from(SIZE_PIECES), max_size=20).map(b"".join))
def test_chunk_size_as_before(line):
    assert _chunk_size(line) == _chunk_size_before(line)
    assert _chunk_size(bytearray(line)) == _chunk_size_before(line)


def _tokens_before(new: int, new_ids: list, new_lps: list) -> tuple:
    if len(new_ids) != new or len(new_lps) != new:
        return ("error", "announces")
    try:
        values = tuple(min(float(lp[0] if isinstance(lp, (list, tuple)) else lp), 0.0) for lp in new_lps)
    except (TypeError, ValueError):
        return ("error", "not a number")
    if any(v != v or v == float("-inf") for v in values):
        return ("error", "non-finite")
    try:
        ids = tuple(int(i) for i in new_ids)
    except (TypeError, ValueError):
        return ("error", "token id")
    return ids, values


def _outcome(new: int, new_ids: list, new_lps: list) -> tuple:
    try:
        chunk = ChunkDecoder("e")._tokens(new, new_ids, new_lps, {})
    except EngineCallError as exc:
        message = str(exc)
        for key in ("announces", "token id", "not a number", "non-finite"):
            if key in message:
                return ("error", key)
        raise
    return chunk.ids, chunk.logprobs


LOGPROB = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1e308, -math.inf, math.nan]),
                    st.integers(-5, 5), st.text(max_size=2), st.none(), st.booleans())
TOKEN = st.one_of(st.integers(0, 2**31), st.text(alphabet="12a", max_size=2), st.none(), st.floats(-3, 3))


@settings(max_examples=examples(2000), deadline=None)
@given(st.lists(st.tuples(TOKEN, LOGPROB, st.booleans()), max_size=6), st.integers(0, 1))
def test_tokens_as_before(items, extra):
    ids = [i for i, _, _ in items]
    lps = [[lp, i, None] if triple else lp for i, lp, triple in items]
    for new in (len(items), len(items) + extra):
        got, want = _outcome(new, ids, lps), _tokens_before(new, ids, lps)
        assert repr(got) == repr(want)  # repr: NaN-free by then, and -0.0 told from 0.0


def test_tokens_whose_sum_overflows_are_finite():
    assert _outcome(2, [1, 2], [[-1e308, 1, None], [-1e308, 2, None]]) == ((1, 2), (-1e308, -1e308))


def test_target_is_the_split_kept_per_url():
    client = HttpClient(1.0, 1.0)
    urls = ["http://127.0.0.1:8000/generate", "http://h:1/a?b=c", "https://x/", "http://y", "http://[::1]:9/p"]
    for url in urls * 2:
        assert client._target(url) == client._split(url)
    assert client._target("http://y") == (("y", 80, False), "y", "/")
    for _ in range(2):
        with pytest.raises(HttpError):
            client._target("ftp://x/")
    for i in range(TARGETS + 10):
        assert client._target(f"http://h/{i}")[2] == f"/{i}"
    assert len(client._urls) <= TARGETS
