"""Unit tests of the trajectory tree (tree.py, tree_stats.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gyre.trajectory.records import ModelCall, Provenance
from gyre.trajectory.tree import ROOT, TrajectoryTree, TreeError
from gyre.trajectory.tree_stats import tree_stats

from .harness_model import ToyHarness

EXT, SAM, EVA = int(Provenance.EXTERNAL), int(Provenance.SAMPLED), int(Provenance.EVALUATOR)


def call(request_id, inp, out, *, execution="e1", in_prov=None, out_prov=None, hints=None):
    return ModelCall(execution_id=execution, request_id=request_id, input_ids=np.array(inp),
                     output_ids=np.array(out, dtype=np.int64), output_logprobs=-0.1 * (1 + np.arange(len(out))),
                     policy_version=0, input_provenance=in_prov, output_provenance=out_prov, role_hints=hints or {})


def check_reproduces(tree, calls):
    for i, c in enumerate(calls):
        assert np.array_equal(tree.request_sequence(i), c.sequence)
        assert np.array_equal(tree.request_input_ids(i), c.input_ids)


def test_chain_reuses_previous_output_as_same_tokens():
    tree = TrajectoryTree("e1")
    a = call("a", [1, 2, 3], [4, 5])
    b = call("b", [1, 2, 3, 4, 5, 6, 7], [8])
    tree.add(a)
    placement = tree.add(b)
    assert placement.matched_tokens == 5 and placement.new_tokens == 3
    assert tree.num_tokens == 8 and len(tree.leaves()) == 1
    # tokens 4, 5 were sampled by a and reappear in b's input: still trainable, once
    assert tree.provenance.tolist() == [EXT, EXT, EXT, SAM, SAM, EXT, EXT, SAM]
    check_reproduces(tree, [a, b])


def test_divergence_splits_a_node_and_positions_do_not_move():
    tree = TrajectoryTree("e1")
    a = call("a", [1, 2, 3, 4], [5, 6])
    b = call("b", [1, 2, 9], [7])
    tree.add(a)
    before = tree.tokens.copy()
    placement = tree.add(b)
    assert placement.split
    assert np.array_equal(tree.tokens[: len(before)], before)
    assert len(tree.roots()) == 1 and len(tree.leaves()) == 2
    branch = tree.roots()[0]
    assert tree.node_range(branch) == (0, 2) and len(tree.children(branch)) == 2
    check_reproduces(tree, [a, b])


def test_request_ending_inside_a_node_splits_it_and_is_not_a_leaf():
    tree = TrajectoryTree("e1")
    a = call("a", [1, 2, 3, 4, 5], [6])
    b = call("b", [1, 2], [3])  # a's prefix, ends inside a's node
    tree.add(a)
    tree.add(b)
    assert tree.request_end(1) not in tree.leaves()
    assert tree.provenance[2] == SAM  # b sampled position 2, which a supplied as input
    assert tree.logprobs[2] == pytest.approx(-0.1)
    check_reproduces(tree, [a, b])


def test_retry_with_same_input_branches_on_the_output():
    tree = TrajectoryTree("e1")
    calls = [call("a", [1, 2], [3, 4, 5]), call("b", [1, 2], [3, 4, 9]), call("c", [1, 2], [3, 4, 5])]
    for c in calls:
        tree.add(c)
    assert len(tree.leaves()) == 2
    assert tree.request_end(0) == tree.request_end(2)  # identical request lands on the same node
    assert tree.num_tokens == 6
    check_reproduces(tree, calls)


def test_unmatched_request_attaches_to_the_root():
    tree = TrajectoryTree("e1")
    tree.add(call("a", [1, 2], [3]))
    tree.add(call("b", [7, 8], [9]))
    assert len(tree.roots()) == 2
    assert all(tree.parent(r) == ROOT for r in tree.roots())


def test_provenance_is_order_independent_max():
    calls = [
        call("a", [1, 2, 3], [4, 5]),
        call("b", [1, 2], [3, 4]),  # samples position 2 that a got as input
        call("c", [1, 2, 3, 4, 5, 6], [7], in_prov=np.array([0, 0, 0, 2, 0, 0])),  # marks 4 as evaluator text
    ]
    results = []
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        tree = TrajectoryTree("e1")
        for i in order:
            tree.add(calls[i])
        by_token = {int(t): int(p) for t, p in zip(tree.tokens, tree.provenance)}
        results.append(by_token)
    assert results[0] == results[1] == results[2]
    assert results[0][3] == SAM and results[0][4] == EVA and results[0][5] == SAM and results[0][6] == EXT


def test_forced_output_tokens_are_not_trainable():
    tree = TrajectoryTree("e1")
    tree.add(call("a", [1], [2, 3], out_prov=np.array([EXT, SAM])))
    assert tree.provenance.tolist() == [EXT, EXT, SAM]


def test_cost_follows_depth_not_history():
    tree = TrajectoryTree("e1")
    rng = np.random.default_rng(0)
    long_history = list(rng.integers(100, 10_000, size=50_000))
    tree.add(call("big", long_history, [1]))
    for i in range(20):  # a deep, separate branch
        prefix = [5] + list(range(10, 10 + 3 * i))
        tree.add(call(f"chain{i}", prefix, [10 + 3 * i, 11 + 3 * i, 12 + 3 * i]))
    placement = tree.add(call("next", [5] + list(range(10, 70)) + [99], [98]))
    assert placement.visited_nodes <= len(tree.path(placement.end_node))
    assert placement.new_tokens == 2
    assert placement.visited_nodes < 25


def test_bad_requests_raise_clearly():
    tree = TrajectoryTree("e1")
    tree.add(call("a", [1], [2]))
    with pytest.raises(TreeError, match="already in the tree"):
        tree.add(call("a", [1], [3]))
    with pytest.raises(TreeError, match="belongs to execution 'e2'"):
        tree.add(call("b", [1], [2], execution="e2"))
    tree.close()
    with pytest.raises(TreeError, match="closed"):
        tree.add(call("c", [1], [2]))
    with pytest.raises(KeyError, match="'zz'"):
        tree.request_index("zz")


def test_stats_of_a_small_tree():
    tree = TrajectoryTree("e1")
    for c in (call("a", [1, 2, 3], [4]), call("b", [1, 2, 5], [6]), call("c", [9], [8])):
        tree.add(c)
    stats = tree_stats(tree)
    assert (stats.nodes, stats.roots, stats.leaves, stats.requests) == (4, 2, 3, 3)
    assert stats.unique_tokens == 8 and stats.trainable_tokens == 3
    assert stats.expanded_tokens == 4 + 4 + 2
    assert stats.node_occurrences == 2 + 2 + 1 and stats.repeated_node_occurrences == 1
    assert [(p.depth_nodes, p.depth_tokens, p.branches) for p in stats.shared_prefixes] == [(1, 2, 2)]
    assert "4 (2 roots, 3 leaves)" in stats.format()


def test_restoring_tool_calls_avoids_false_branches():
    leaves = {}
    for restore in (True, False):
        harness = ToyHarness(restore=restore)
        rng = random.Random(7)
        agent = harness.start_agent("main", rng)
        tree = TrajectoryTree("exec-1")
        calls = [harness.step(agent, rng) for _ in range(12)]
        for c in calls:
            tree.add(c)
        check_reproduces(tree, calls)
        leaves[restore] = len(tree.leaves())
    assert leaves[True] == 1
    assert leaves[False] > 1
