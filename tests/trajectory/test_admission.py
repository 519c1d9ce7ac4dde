"""Bounded admission by role priority (admission.py); the state machine is in test_tree_machine.py."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.trajectory.admission import Admission, AdmissionError, admit_trajectories
from gyre.trajectory.records import ModelCall
from gyre.trajectory.harness_roles import GenericRoles
from gyre.trajectory.tree import TrajectoryTree

ROLES = GenericRoles()


def call(rid, inp, out, **hints):
    return ModelCall(execution_id="e1", request_id=rid, input_ids=np.array(inp), output_ids=np.array(out),
                     output_logprobs=-0.5 * np.ones(len(out)), policy_version=0, role_hints=hints)


def tree_of(*calls, close=True):
    tree = TrajectoryTree.from_records(calls, "e1")
    if close:
        tree.close()
    return tree


def shared_prefix_tree():
    """One main chain with two continuations (sharing 4 sampled tokens) and a sub-agent."""
    return tree_of(
        call("m1", [1, 2], [3, 4, 5, 6], agent="main"),
        call("m2", [1, 2, 3, 4, 5, 6, 7], [8] * 6, agent="main"),  # leaf A: 4 + 6 sampled
        call("m3", [1, 2, 3, 4, 5, 6, 9], [10] * 2, agent="main"),  # leaf B: 4 + 2 sampled
        call("s1", [50, 51], [52] * 3, agent="sub-agent"),  # leaf C
        call("aux", [60], [61] * 50, role="auxiliary"),  # never admitted
    )


def test_priority_then_masking_reweights_and_nothing_is_trained_twice():
    tree = shared_prefix_tree()
    admitted = admit_trajectories(tree, ROLES, np.random.default_rng(0), j_max=5)
    assert [t.role for t in admitted] == ["main", "main", "sub-agent"]
    sizes = sorted(t.num_targets for t in admitted[:2])
    assert sizes in ([2, 10], [6, 6])  # the second main draw gets only its own suffix
    all_targets = np.concatenate([t.targets for t in admitted])
    assert len(all_targets) == len(set(all_targets.tolist())) == sum(t.num_targets for t in admitted)
    assert sum(t.num_targets for t in admitted) == 4 + 6 + 2 + 3


def test_draw_is_proportional_to_unmasked_trainable_tokens():
    tree = shared_prefix_tree()
    first = [Admission(tree, ROLES, np.random.default_rng(seed)).draw().num_targets for seed in range(2000)]
    share_a = np.mean(np.array(first) == 10)
    assert abs(share_a - 10 / 16) < 0.04


def test_j_max_bounds_admission_and_same_seed_same_result():
    tree = shared_prefix_tree()
    assert len(admit_trajectories(tree, ROLES, np.random.default_rng(1), j_max=1)) == 1
    runs = [[(t.leaf, t.targets.tolist()) for t in admit_trajectories(tree, ROLES, np.random.default_rng(7))]
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_frozen_targets_are_read_only():
    admitted = admit_trajectories(shared_prefix_tree(), ROLES, np.random.default_rng(0))
    with pytest.raises(ValueError):
        admitted[0].targets[0] = 0


def test_external_only_tree_admits_nothing():
    tree = tree_of(call("a", [1, 2, 3], [], agent="main"))
    assert admit_trajectories(tree, ROLES, np.random.default_rng(0)) == []


@pytest.mark.parametrize("j_max", [-1, 0, 2.5, True, "5"])
def test_bad_j_max_raises(j_max):
    with pytest.raises(AdmissionError, match="j_max must be a positive integer"):
        Admission(shared_prefix_tree(), ROLES, np.random.default_rng(0), j_max)


def test_open_tree_and_global_rng_are_refused():
    with pytest.raises(AdmissionError, match="still open"):
        Admission(tree_of(call("a", [1], [2]), close=False), ROLES, np.random.default_rng(0))
    with pytest.raises(AdmissionError, match="numpy.random.Generator"):
        Admission(shared_prefix_tree(), ROLES, np.random)
