"""The trajectory tree's fast paths (tree.py: a short span compared as bytes, a merge skipped where
nothing would change) build the same tree as the code before them, kept here as ``_Reference``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gyre.trajectory.records import ModelCall, Provenance
from gyre.trajectory.tree import TrajectoryTree

PROVENANCES = [int(p) for p in Provenance]


class _Reference(TrajectoryTree):
    """``add`` as it was before the fast paths: every span compared in NumPy, every range merged."""

    def _common_prefix(self, start, seq, pos, span):
        differs = self._tokens[start : start + span] != seq[pos : pos + span]
        first = int(differs.argmax())
        return first if differs[first] else span

    def _merge_range(self, incoming, stored, lo, hi):
        self._merge_provenance(stored, *incoming.slice(lo, hi))


@st.composite
def histories(draw):
    """Calls of one execution: each input a prefix of an earlier call's sequence (or nothing) then new
    tokens from a small alphabet (so outputs reappear in inputs, and inputs in outputs), provenance
    arrays sometimes, long spans sometimes (the bytes comparison's limit), and repeats of an earlier
    call's exact sequence (a range already SAMPLED that other provenance may raise)."""
    tokens = st.integers(0, 5)
    sequences: list[list[int]] = []
    pairs: list[tuple[list[int], list[int]]] = []
    calls = []
    for i in range(draw(st.integers(1, 12))):
        base: list[int] = []
        if sequences and draw(st.booleans()):
            earlier = draw(st.sampled_from(sequences))
            base = earlier[: draw(st.integers(0, len(earlier)))]
        if draw(st.integers(0, 9)) == 0:
            base = base + [7] * 1100  # past the span compared as bytes
        inp = base + draw(st.lists(tokens, max_size=4))
        inp = inp or [draw(tokens)]
        out = draw(st.lists(tokens, max_size=5))
        if pairs and draw(st.integers(0, 3)) == 0:  # a repeat: the same sequence, maybe other provenance
            inp, out = draw(st.sampled_from(pairs))
        in_prov = out_prov = None
        if draw(st.integers(0, 3)) == 0:
            in_prov = np.array(draw(st.lists(st.sampled_from([0, 2]), min_size=len(inp), max_size=len(inp))))
        if draw(st.integers(0, 3)) == 0:
            out_prov = np.array(draw(st.lists(st.sampled_from(PROVENANCES), min_size=len(out), max_size=len(out))))
        calls.append(ModelCall(execution_id="e", request_id=f"r{i}", input_ids=np.array(inp, dtype=np.int32),
                               output_ids=np.array(out, dtype=np.int32), policy_version=0,
                               output_logprobs=-0.1 * (1 + i + np.arange(len(out))),
                               input_provenance=in_prov, output_provenance=out_prov))
        sequences.append(inp + out)
        pairs.append((inp, out))
    return calls


@settings(max_examples=examples(400), deadline=None)
@given(histories())
def test_fast_paths_build_the_same_tree(calls):
    fast, reference = TrajectoryTree("e"), _Reference("e")
    for call in calls:
        assert fast.add(call) == reference.add(call)
    assert fast.tokens.tolist() == reference.tokens.tolist()
    assert fast.provenance.tolist() == reference.provenance.tolist()
    np.testing.assert_array_equal(fast.logprobs, reference.logprobs)  # NaN where never sampled, in both
    assert fast.num_nodes == reference.num_nodes
    for node in range(1, fast.num_nodes + 1):
        assert fast.node_range(node) == reference.node_range(node)
        assert fast.parent(node) == reference.parent(node)
        assert fast.children(node) == reference.children(node)
    assert [fast.request_end(i) for i in range(len(calls))] == [reference.request_end(i) for i in range(len(calls))]
