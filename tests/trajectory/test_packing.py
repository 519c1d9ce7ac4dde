"""Materialization into token rows (rows.py) and stream packing (packing.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.trajectory.admission import AdmittedTrajectory, admit_trajectories
from gyre.trajectory.evaluation import EvaluationBinding, EvaluationResult
from gyre.trajectory.groups import TrajectoryBuffer
from gyre.real.store.microstep_queue import InMemoryMicroStepQueue
from gyre.trajectory.packing import ExecutionBundle, StreamPacker, pack_bundles
from gyre.trajectory.harness_roles import ClaudeCodeRoles, GenericRoles
from gyre.trajectory.rows import TokenRow, materialize

from .harness_model import ToyHarness
from .test_admission import shared_prefix_tree


def test_rows_carry_path_tokens_targets_and_execution_weight():
    tree = shared_prefix_tree()
    admitted = admit_trajectories(tree, GenericRoles(), np.random.default_rng(0))
    rows = materialize(tree, admitted, advantage=0.5, group_id="g1")
    total = sum(t.num_targets for t in admitted)
    for row, trajectory in zip(rows, admitted):
        positions = tree.path_positions(trajectory.leaf)
        assert np.array_equal(row.input_ids, tree.tokens[positions])
        assert np.array_equal(positions[row.target_mask], trajectory.targets)
        assert np.array_equal(row.behavior_logprobs[row.target_mask], tree.logprobs[trajectory.targets])
        assert not row.behavior_logprobs[~row.target_mask].any()
        assert not row.target_mask[0]
        assert (row.advantage, row.execution_targets, row.weight) == (0.5, total, 1.0 / total)


def test_materialize_rejects_inconsistent_input():
    tree = shared_prefix_tree()
    admitted = admit_trajectories(tree, GenericRoles(), np.random.default_rng(0))
    wrong_leaf = AdmittedTrajectory("e1", admitted[-1].leaf, "main", 0, admitted[0].targets)
    with pytest.raises(ValueError, match="not on its path"):
        materialize(tree, [wrong_leaf], 1.0, "g")
    with pytest.raises(ValueError, match="must be finite"):
        materialize(tree, admitted, float("nan"), "g")


def bundle(name: str, size: int) -> ExecutionBundle:
    row = TokenRow(name, "g", 1, np.zeros(size, np.int32), np.zeros(size, bool), np.zeros(size), 0.0, 0.0, 0)
    return ExecutionBundle(name, (row,))


@given(sizes=st.lists(st.integers(1, 300), max_size=40), budget=st.integers(1, 256))
def test_pack_bundles_places_each_bundle_once_within_budget(sizes, budget):
    bundles = [bundle(f"e{i}", s) for i, s in enumerate(sizes)]
    bins = pack_bundles(bundles, budget)
    placed = [b.execution_id for bin_ in bins for b in bin_]
    assert sorted(placed) == sorted(b.execution_id for b in bundles)
    for bin_ in bins:
        load = sum(b.num_tokens for b in bin_)
        assert load <= budget or len(bin_) == 1
    assert len(bins) <= max(1, len(bundles))


def toy_group(buffer, group_id, n, seed, version=0):
    """Open a group of n toy executions, record their calls, close and score them."""
    ids = [f"{group_id}-x{i}" for i in range(n)]
    buffer.open_group(group_id, version, ids, deadline=1e9)
    rng = random.Random(seed)
    for i, execution_id in enumerate(ids):
        harness = ToyHarness(execution_id)
        agents = [harness.start_agent("main", rng), harness.start_agent("sub-agent", rng)]
        for turn in range(rng.randint(3, 8)):
            buffer.add(harness.step(rng.choice(agents), rng))
            if turn == 2:
                buffer.add(harness.compact(agents[0], rng))
        binding = EvaluationBinding(execution_id, "v1", "main")
        buffer.close_execution(execution_id, 1.0, binding)
        buffer.record_evaluation(EvaluationResult(binding, float(rng.random() < 0.5), True), 2.0)
    return ids


class RecordingSink(InMemoryMicroStepQueue):
    def __init__(self):
        super().__init__()
        self.events = []

    def put(self, step):
        self.events.append(("put", step.batch_id))
        super().put(step)

    def close_batch(self, batch_id, num_steps):
        self.events.append(("close", batch_id, num_steps))
        super().close_batch(batch_id, num_steps)


def run_packer(order, budget=1500):
    buffer = TrajectoryBuffer(3)
    for g in order:
        toy_group(buffer, g, 3, seed=int(g[1:]))
    packer = StreamPacker(buffer, ClaudeCodeRoles(), groups_per_batch=2, token_budget=budget, seed=11)
    sink = RecordingSink()
    statuses = [packer.step(sink) for _ in range(len(order) + 1)]
    steps = []
    while (step := sink.claim("w0")) is not None:
        steps.append(step)
    return statuses, sink, steps, budget


def test_stream_packer_emits_every_row_once_and_closes_batches_after_their_puts():
    statuses, sink, steps, budget = run_packer(["g1", "g2", "g3", "g4"])
    assert statuses == ["pulled", "closed", "pulled", "closed", "waiting"]
    closes = [e for e in sink.events if e[0] == "close"]
    assert [c[1] for c in closes] == [0, 1]
    for batch_id, num_steps in ((c[1], c[2]) for c in closes):
        puts = [i for i, e in enumerate(sink.events) if e == ("put", batch_id)]
        assert len(puts) == num_steps and max(puts) < sink.events.index(("close", batch_id, num_steps))
    assert all(step.batch_executions == 2 * 3 for step in steps)
    seen = [(row.execution_id, row.leaf) for step in steps for row in step.rows]
    assert len(seen) == len(set(seen))
    for step in steps:  # an execution's rows never span micro-steps; budget holds but for lone bundles
        executions = {row.execution_id for row in step.rows}
        assert all(sum(r.execution_id == e for s in steps for r in s.rows)
                   == sum(r.execution_id == e for r in step.rows) for e in executions)
        assert step.num_tokens <= budget or len(executions) == 1


def test_admission_does_not_depend_on_pull_order():
    def targets(order):
        _, _, steps, _ = run_packer(order)
        return {(row.execution_id, row.leaf): row.target_mask.tobytes() for step in steps for row in step.rows}

    assert targets(["g1", "g2", "g3", "g4"]) == targets(["g4", "g3", "g2", "g1"])


def test_bad_packer_settings_raise():
    with pytest.raises(ValueError, match="groups_per_batch"):
        StreamPacker(TrajectoryBuffer(1), GenericRoles(), groups_per_batch=0, token_budget=10, seed=0)
    with pytest.raises(ValueError, match="token_budget"):
        pack_bundles([], 0)


def test_full_micro_steps_stream_out_before_the_batch_completes():
    buffer = TrajectoryBuffer(3)
    for g in ("g1", "g2"):
        toy_group(buffer, g, 3, seed=int(g[1:]))
    packer = StreamPacker(buffer, ClaudeCodeRoles(), groups_per_batch=2, token_budget=1500, seed=11)
    sink = RecordingSink()
    assert packer.step(sink) == "pulled"
    assert sink.events and all(e == ("put", 0) for e in sink.events)
    assert packer.step(sink) == "closed" and sink.events[-1][0] == "close"
