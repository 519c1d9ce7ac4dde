"""The JSON text of token-id lists an execution sends its engine, extended instead of re-encoded.

Every model call sends the engine its whole context as ``input_ids``. In a long
execution a follow-up call's ids are the previous call's ids plus its output
and the new turn, so most of the list was encoded a moment ago: 30k ids take
~3 ms to encode, the new tail well under 0.1 ms. ``IdsJson`` keeps the text of
the last few lists of one execution (a few, because sub-agents of one execution
alternate between contexts) and encodes only the part after the longest
cached list that is a prefix of the new one.

Invariants: ``encode(ids) == json.dumps(ids, separators=(",", ":"))`` for every
list of ints, whatever was cached before; at most ``KEEP`` lists are kept;
nothing here does I/O or awaits, so concurrent calls of one execution cannot
interleave inside ``encode``.
"""

from __future__ import annotations

import json

KEEP = 4  # cached lists per execution (main context plus a few sub-agent contexts)


def encode_ids(ids: list[int]) -> str:
    return json.dumps(ids, separators=(",", ":"))


class IdsJson:
    """Per-execution cache of id lists and their JSON text, most recently used last."""

    def __init__(self) -> None:
        self._entries: list[tuple[list[int], str]] = []

    def encode(self, ids: list[int]) -> str:
        best = -1
        for index, (cached, _) in enumerate(self._entries):
            n = len(cached)
            if n <= len(ids) and (best < 0 or n > len(self._entries[best][0])) and ids[:n] == cached:
                best = index
        if best < 0 or not self._entries[best][0]:
            text = encode_ids(ids)
        else:
            cached, cached_text = self._entries.pop(best)
            tail = ids[len(cached):]
            text = cached_text if not tail else f"{cached_text[:-1]},{encode_ids(tail)[1:]}"
        self._entries.append((list(ids), text))
        if len(self._entries) > KEEP:
            self._entries.pop(0)
        return text
