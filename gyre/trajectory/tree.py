"""One trajectory tree per execution: a radix tree over token ids (docs/trajectories.md#trajectory-trees).

Every token lives once in an append-only *store* (token id, provenance,
behaviour log-probability) and has a *position* there. A node owns one
contiguous store range; node 0 is a virtual root owning nothing, and its
children are the roots (main agent and sub-agents differ from their first
token on, so they get separate roots). A request's sequence (input ids then
output ids) is the concatenation of the ranges on the path from the virtual
root to the request's *end node*. Leaves are the candidate trajectories.

Invariants (tested in tests/trajectory/test_tree*.py):
- reproduction: for every request, ``request_sequence(i)`` equals its input ids
  followed by its output ids, exactly;
- radix shape: every non-root node has a non-empty range, siblings differ in
  their first token, each store position belongs to exactly one node;
- positions never move: a split only re-divides a node's range, so positions
  handed out (frozen targets) stay valid;
- provenance of a position is the maximum, in the order EXTERNAL < SAMPLED <
  EVALUATOR, over every request that covers it: a position is trainable iff
  some request sampled it there and no request marked it as evaluator text.
  Tokens of an earlier output that reappear in a later input are the *same*
  positions (trainable once); externally supplied tokens are context only. The
  behaviour log-probability of a position is that of the first request that
  sampled it (it is reused, never recomputed);
- after ``close()`` the tree refuses new requests (records are frozen).

Cost of ``add``: one dict lookup and one vectorised span comparison per node
on the matched path (tree depth), then O(new tokens) to append the new
suffix. The comparison reads the request's own context once (it has to be
read anyway); other branches and the rest of the history are never touched.
A span of up to ``_BYTES_SPAN`` tokens is first compared as bytes (one
memcmp), and a matched range of SAMPLED incoming tokens (an output without
provenance) is merged only where an EXTERNAL position is stored: a repeated
short call costs about 10 us instead of 26 (2026-12-06); the tree built is the
same (tests/trajectory/test_tree_fast_paths.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from gyre.trajectory.records import ModelCall, Provenance

ROOT = 0
_EXTERNAL = int(Provenance.EXTERNAL)
_SAMPLED = int(Provenance.SAMPLED)
_EXTERNAL_BYTE = bytes([_EXTERNAL])  # a stored provenance byte a SAMPLED incoming token would upgrade
_BYTES_SPAN = 1024  # spans up to this many tokens are compared as bytes first (``_common_prefix``)


class TreeError(ValueError):
    """A request the tree cannot accept; the message says why."""


@dataclass(frozen=True)
class Placement:
    """Where ``add`` put a request and what it cost."""

    request: int
    end_node: int
    matched_tokens: int
    new_tokens: int
    visited_nodes: int
    split: bool


@dataclass(frozen=True)
class RequestInfo:
    request_id: str
    input_len: int
    output_len: int
    policy_version: int
    role_hints: Mapping[str, str]


class _Incoming:
    """Provenance and log-probabilities of a request's sequence, built per range on demand.

    Building them for the whole context would cost O(history) per request; the
    tree only needs them for ranges holding non-EXTERNAL tokens and for the new
    suffix.
    """

    def __init__(self, call: ModelCall) -> None:
        self.n_in = len(call.input_ids)
        self.input_prov = call.input_provenance
        self.output_prov = call.output_provenance
        self.output_logp = call.output_logprobs
        special_in = np.flatnonzero(self.input_prov) if self.input_prov is not None else np.empty(0, dtype=np.intp)
        if len(special_in):
            self.first_special = int(special_in[0])
        elif self.output_prov is None:
            self.first_special = self.n_in
        else:
            special_out = np.flatnonzero(self.output_prov)
            self.first_special = self.n_in + (int(special_out[0]) if special_out.size else len(self.output_prov))

    def sampled_only(self, lo: int) -> bool:
        """Whether every incoming token from ``lo`` on is SAMPLED (an output without provenance): merging
        them then changes only stored EXTERNAL positions, and nothing where none is stored."""
        return lo >= self.n_in and self.output_prov is None

    def slice(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        prov = np.full(hi - lo, _EXTERNAL, dtype=np.uint8)
        logp = np.full(hi - lo, np.nan)
        if self.input_prov is not None and lo < self.n_in:
            prov[: min(hi, self.n_in) - lo] = self.input_prov[lo : min(hi, self.n_in)]
        out_lo, out_hi = max(lo, self.n_in) - self.n_in, hi - self.n_in
        if out_hi > out_lo:
            into = slice(max(lo, self.n_in) - lo, hi - lo)
            prov[into] = _SAMPLED if self.output_prov is None else self.output_prov[out_lo:out_hi]
            logp[into] = self.output_logp[out_lo:out_hi]
        return prov, logp


class TrajectoryTree:
    """Shared-prefix store of one execution's requests; see module invariants."""

    def __init__(self, execution_id: str, *, capacity: int = 4096) -> None:
        self.execution_id = execution_id
        self._tokens = np.zeros(capacity, dtype=np.int32)
        self._prov = np.zeros(capacity, dtype=np.uint8)
        self._logp = np.full(capacity, np.nan, dtype=np.float64)
        self._size = 0
        self._start: list[int] = [0]
        self._end: list[int] = [0]
        self._parent: list[int] = [-1]
        self._children: list[dict[int, int]] = [{}]
        self._requests_at: list[list[int]] = [[]]
        self._requests: list[RequestInfo] = []
        self._request_end: list[int] = []
        self._request_index: dict[str, int] = {}
        self._closed = False

    @classmethod
    def from_records(cls, records: Iterable[ModelCall], execution_id: str | None = None) -> TrajectoryTree:
        records = list(records)
        if execution_id is None:
            if not records:
                raise TreeError("cannot infer the execution of an empty record list")
            execution_id = records[0].execution_id
        tree = cls(execution_id)
        for record in records:
            tree.add(record)
        return tree

    # -- building ------------------------------------------------------------

    def add(self, call: ModelCall) -> Placement:
        """Match ``call``'s sequence against existing paths and store only the new suffix."""
        self._check_can_add(call)
        seq = call.sequence
        incoming = _Incoming(call)
        node, pos, visited, split = self._match(seq, incoming)
        if pos < len(seq):
            node = self._append_child(node, seq[pos:], *incoming.slice(pos, len(seq)))
        request = len(self._requests)
        self._requests.append(RequestInfo(call.request_id, len(call.input_ids), len(call.output_ids),
                                          int(call.policy_version), dict(call.role_hints)))
        self._request_end.append(node)
        self._request_index[call.request_id] = request
        self._requests_at[node].append(request)
        return Placement(request, node, pos, len(seq) - pos, visited, split)

    def close(self) -> None:
        """Freeze the tree (the execution's records are committed) and trim the store."""
        if not self._closed:
            for name in ("_tokens", "_prov", "_logp"):
                setattr(self, name, getattr(self, name)[: self._size].copy())
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_can_add(self, call: ModelCall) -> None:
        if self._closed:
            raise TreeError(f"tree of execution {self.execution_id!r} is closed; request {call.request_id!r} refused")
        if call.execution_id != self.execution_id:
            raise TreeError(f"request {call.request_id!r} belongs to execution {call.execution_id!r}, "
                            f"not {self.execution_id!r}")
        if call.request_id in self._request_index:
            raise TreeError(f"request {call.request_id!r} is already in the tree of {self.execution_id!r}")

    def _match(self, seq: np.ndarray, incoming: _Incoming) -> tuple[int, int, int, bool]:
        first_special = incoming.first_special
        node, pos, visited = ROOT, 0, 0
        while pos < len(seq):
            child = self._children[node].get(int(seq[pos]))
            if child is None:
                break
            visited += 1
            start, end = self._start[child], self._end[child]
            k = self._common_prefix(start, seq, pos, min(end - start, len(seq) - pos))
            if pos + k > first_special:  # only ranges holding non-EXTERNAL incoming tokens can change
                lo = max(pos, first_special)
                self._merge_range(incoming, start + lo - pos, lo, pos + k)
            node, pos = child, pos + k
            if k < end - start:
                self._split(child, k)
                return node, pos, visited, True
        return node, pos, visited, False

    def _merge_range(self, incoming: _Incoming, stored: int, lo: int, hi: int) -> None:
        """Merge incoming tokens ``lo:hi`` into the stored positions from ``stored``; SAMPLED tokens over
        no EXTERNAL position change nothing, so then nothing is done (one memchr decides)."""
        if not incoming.sampled_only(lo) or _EXTERNAL_BYTE in self._prov[stored : stored + hi - lo].tobytes():
            self._merge_provenance(stored, *incoming.slice(lo, hi))

    def _common_prefix(self, start: int, seq: np.ndarray, pos: int, span: int) -> int:
        stored, incoming = self._tokens[start : start + span], seq[pos : pos + span]
        # a short span compared as bytes, one memcmp (a tenth of the NumPy comparison's cost): the usual whole match
        if span <= _BYTES_SPAN and incoming.dtype == stored.dtype and stored.tobytes() == incoming.tobytes():
            return span
        differs = stored != incoming
        first = int(differs.argmax())
        return first if differs[first] else span

    def _merge_provenance(self, start: int, incoming: np.ndarray, logp: np.ndarray) -> None:
        stored = self._prov[start : start + len(incoming)]
        upgrade = (stored == _EXTERNAL) & (incoming == _SAMPLED)
        if upgrade.any():
            self._logp[start : start + len(incoming)][upgrade] = logp[upgrade]
        np.maximum(stored, incoming, out=stored)

    def _split(self, node: int, k: int) -> int:
        start, end = self._start[node], self._end[node]
        tail = self._new_node(node, start + k, end)
        self._children[tail] = self._children[node]
        for child in self._children[tail].values():
            self._parent[child] = tail
        self._children[node] = {int(self._tokens[start + k]): tail}
        self._end[node] = start + k
        self._requests_at[tail], self._requests_at[node] = self._requests_at[node], []
        for request in self._requests_at[tail]:
            self._request_end[request] = tail
        return tail

    def _append_child(self, parent: int, tokens: np.ndarray, prov: np.ndarray, logp: np.ndarray) -> int:
        start = self._reserve(len(tokens))
        end = start + len(tokens)
        self._tokens[start:end] = tokens
        self._prov[start:end] = prov
        self._logp[start:end] = logp
        node = self._new_node(parent, start, end)
        self._children[parent][int(tokens[0])] = node
        return node

    def _new_node(self, parent: int, start: int, end: int) -> int:
        self._start.append(start)
        self._end.append(end)
        self._parent.append(parent)
        self._children.append({})
        self._requests_at.append([])
        return len(self._start) - 1

    def _reserve(self, extra: int) -> int:
        start = self._size
        need = start + extra
        if need > len(self._tokens):
            # half again what is needed: the next calls of the execution, which extend this one, fit
            capacity = max(need + need // 2, len(self._tokens) * 3 // 2)
            for name in ("_tokens", "_prov", "_logp"):
                old = getattr(self, name)
                new = np.empty(capacity, dtype=old.dtype)  # the caller writes [start, need); beyond is never read
                new[:start] = old[:start]
                setattr(self, name, new)
        self._size = need
        return start

    # -- store ---------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Unique tokens stored (every position once)."""
        return self._size

    def _view(self, array: np.ndarray) -> np.ndarray:
        view = array[: self._size].view()
        view.setflags(write=False)
        return view

    @property
    def tokens(self) -> np.ndarray:
        return self._view(self._tokens)

    @property
    def provenance(self) -> np.ndarray:
        return self._view(self._prov)

    @property
    def logprobs(self) -> np.ndarray:
        """Behaviour log-probability per position (NaN where never sampled)."""
        return self._view(self._logp)

    @property
    def trainable(self) -> np.ndarray:
        return self._prov[: self._size] == _SAMPLED

    # -- nodes ---------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """Nodes excluding the virtual root."""
        return len(self._start) - 1

    def node_range(self, node: int) -> tuple[int, int]:
        return self._start[node], self._end[node]

    def parent(self, node: int) -> int:
        return self._parent[node]

    def children(self, node: int) -> list[int]:
        return sorted(self._children[node].values())

    def roots(self) -> list[int]:
        return self.children(ROOT)

    def leaves(self) -> list[int]:
        return [n for n in range(1, len(self._start)) if not self._children[n]]

    def path(self, node: int) -> list[int]:
        """Nodes from the root down to ``node`` (virtual root excluded)."""
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = self._parent[node]
        return nodes[::-1]

    def path_positions(self, node: int) -> np.ndarray:
        ranges = [np.arange(self._start[n], self._end[n]) for n in self.path(node)]
        return np.concatenate(ranges) if ranges else np.zeros(0, dtype=np.int64)

    def path_tokens(self, node: int) -> np.ndarray:
        return np.concatenate([self._tokens[self._start[n] : self._end[n]] for n in self.path(node)])

    # -- requests ------------------------------------------------------------

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def request(self, index: int) -> RequestInfo:
        return self._requests[index]

    def request_end(self, index: int) -> int:
        return self._request_end[index]

    def request_index(self, request_id: str) -> int:
        try:
            return self._request_index[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} is not in the tree of {self.execution_id!r}") from None

    def requests_at(self, node: int) -> list[int]:
        return list(self._requests_at[node])

    def requests_on_path(self, node: int) -> list[int]:
        """Requests ending on the path root -> ``node``, root first."""
        return [r for n in self.path(node) for r in self._requests_at[n]]

    def request_sequence(self, index: int) -> np.ndarray:
        return self.path_tokens(self._request_end[index])

    def request_input_ids(self, index: int) -> np.ndarray:
        return self.request_sequence(index)[: self._requests[index].input_len]
