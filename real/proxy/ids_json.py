"""The JSON text of token-id lists an execution sends its engine, extended instead of re-encoded.

Every model call sends the engine its whole context as ``input_ids``. In a long
execution a follow-up call's ids are the previous call's ids plus its output
and the new turn, so most of the list was encoded a moment ago: 30k ids take
~3 ms to encode, the new tail well under 0.1 ms. ``IdsJson`` keeps the text of
the last few lists of one execution (a few, because sub-agents of one execution
alternate between contexts) and encodes only the part after the longest
cached list that is a prefix of the new one.

Ids arrive as int32 arrays (``ChatService.prepare``; lists are accepted and
converted): the prefix test is one vectorized comparison (~10 us for 30k ids,
where comparing Python lists took ~0.25 ms) and nothing is copied into a list;
up to ``BYTES_COMPARE`` ids of one dtype are compared as bytes instead, and the
same list sent again keeps its entry as it is (a short call's hit: 6.2 -> 1.6 us,
2026-12-05, load 6).

Invariants: ``encode(ids) == json.dumps(list(map(int, ids)), separators=(",", ":"))``
for every sequence of ints, whatever was cached before; at most ``KEEP``
lists are kept (as read-only arrays, never aliasing the caller's); nothing
here does I/O or awaits, so concurrent calls of one execution cannot
interleave inside ``encode``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np

KEEP = 4  # cached lists per execution (main context plus a few sub-agent contexts)
BYTES_COMPARE = 4096  # ids up to this many of one dtype are compared as bytes (no temporary bool array)
COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))  # = json.dumps(..., separators=...), built once


def encode_ids(ids: Sequence[int]) -> str:
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    return COMPACT_JSON.encode(values)


def _starts_with(array: np.ndarray, cached: np.ndarray) -> bool:
    """Whether ``array`` begins with ``cached`` (``len(cached) <= len(array)``)."""
    n = len(cached)
    if n <= BYTES_COMPARE and array.dtype == cached.dtype:  # same dtype: equal values are equal bytes
        return array[:n].tobytes() == cached.tobytes()
    return bool(np.array_equal(array[:n], cached))


class IdsJson:
    """Per-execution cache of id lists and their JSON text, most recently used last."""

    def __init__(self, encode_new: Callable[[Sequence[int]], str] = encode_ids) -> None:
        self._encode_new = encode_new  # how ids not cached are encoded (``encode_ids``)
        self._entries: list[tuple[np.ndarray, str]] = []

    def encode(self, ids: Sequence[int]) -> str:
        array = np.asarray(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids
        best = -1
        for index, (cached, _) in enumerate(self._entries):
            n = len(cached)
            if n <= len(array) and (best < 0 or n > len(self._entries[best][0])) and _starts_with(array, cached):
                best = index
        kept = None
        if best < 0 or not len(self._entries[best][0]):
            text = self._encode_new(array)
        else:
            cached, cached_text = self._entries.pop(best)
            tail = array[len(cached):]
            if len(tail):
                text = f"{cached_text[:-1]},{self._encode_new(tail)[1:]}"
            else:  # the same list again (a retried or repeated call): its entry is kept as it is
                text, kept = cached_text, cached
        if kept is None:
            kept = array.copy()
            kept.setflags(write=False)
        self._entries.append((kept, text))
        if len(self._entries) > KEEP:
            self._entries.pop(0)
        return text
