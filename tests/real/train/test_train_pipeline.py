"""End to end: records on disk -> buffer -> admission -> micro-steps -> loss.

The sum of the micro-steps' losses, each computed only from what the micro-step
carries, must equal docs/trajectories.md#execution-level-loss evaluated directly on each execution's union of
frozen targets: packing preserves per-execution weights and clip decisions.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from gyre.trajectory.admission import admit_trajectories
from gyre.trajectory.evaluation import EvaluationBinding, EvaluationResult
from gyre.trajectory.groups import TrajectoryBuffer, group_advantages
from gyre.real.store.microstep_queue import DirectoryMicroStepQueue
from gyre.trajectory.packing import StreamPacker, execution_rng
from gyre.trajectory.harness_roles import ClaudeCodeRoles
from gyre.real.store.tito_log import ExecutionStore

from trajectory.harness_model import ToyHarness

torch = pytest.importorskip("torch")
from gyre.real.train.loss import execution_level_loss  # noqa: E402

N, B, SEED = 3, 2, 5


def current_logprob(behavior: np.ndarray) -> np.ndarray:
    """Stand-in for the current policy: a fixed function of each target's recorded value."""
    return np.minimum(behavior * 0.98 + 0.01 * np.sin(behavior * 50), 0.0)


def record_groups(store: ExecutionStore, rng: random.Random) -> dict[str, list[str]]:
    groups = {}
    for g in range(B):
        ids = [f"g{g}-x{i}" for i in range(N)]
        for execution_id in ids:
            harness = ToyHarness(execution_id)
            agents = [harness.start_agent("main", rng), harness.start_agent("sub-agent", rng)]
            for turn in range(rng.randint(4, 9)):
                store.append(harness.step(rng.choice(agents), rng))
                if turn == 3:
                    store.append(harness.compact(agents[1], rng))
                    store.append(harness.retry(agents[0], rng))
        groups[f"g{g}"] = ids
    store.close()
    return groups


def direct_loss(ready, roles) -> float:
    total = 0.0
    for execution_id, tree, advantage in ready:
        admitted = admit_trajectories(tree, roles, execution_rng(SEED, execution_id))
        targets = np.concatenate([t.targets for t in admitted]) if admitted else np.zeros(0, int)
        if not len(targets):
            continue
        behavior = tree.logprobs[targets]
        logp = current_logprob(behavior)
        s = np.exp(np.mean(logp - behavior))
        keep = 0.0 if (advantage > 0 and s > 1.005) or (advantage < 0 and s < 0.995) else 1.0
        token = np.minimum(100.0, -keep * np.minimum(np.exp(logp - behavior), 5.0) * advantage * logp)
        total += token.sum() / len(targets)
    return total / (B * N)


def micro_step_loss(step) -> float:
    ids = sorted({row.execution_id for row in step.rows})
    local = {e: i for i, e in enumerate(ids)}
    adv = {row.execution_id: row.advantage for row in step.rows}
    behavior = np.concatenate([row.behavior_logprobs for row in step.rows])
    mask = np.concatenate([row.target_mask for row in step.rows])
    logp = np.where(mask, current_logprob(behavior), -1.0)
    index = np.concatenate([np.full(row.num_tokens, local[row.execution_id]) for row in step.rows])
    loss, _ = execution_level_loss(torch.tensor(logp), torch.tensor(behavior), torch.tensor(mask),
                                   torch.tensor(index), torch.tensor([adv[e] for e in ids], dtype=torch.float64),
                                   num_executions=step.batch_executions)
    return float(loss)


def test_micro_step_losses_sum_to_the_direct_execution_level_loss(tmp_path):
    rng = random.Random(1)
    store = ExecutionStore(tmp_path / "records", fsync=True)
    groups = record_groups(store, rng)
    buffer = TrajectoryBuffer(N)
    advantages = {}
    for group_id, ids in groups.items():
        buffer.open_group(group_id, 0, ids, deadline=100.0)
        rewards = [float(rng.random() < 0.5) + 0.1 * i for i in range(N)]
        advantages.update(zip(ids, group_advantages(rewards)))
        for execution_id, reward in zip(ids, rewards):
            for record in store.read(execution_id):
                buffer.add(record)
            binding = EvaluationBinding(execution_id, "v1", "main")
            buffer.close_execution(execution_id, 1.0, binding)
            buffer.record_evaluation(EvaluationResult(binding, reward, True), 2.0)
    trees = {e: buffer.tree(e) for ids in groups.values() for e in ids}
    roles = ClaudeCodeRoles()
    queue = DirectoryMicroStepQueue(tmp_path / "queue")
    packer = StreamPacker(buffer, roles, groups_per_batch=B, token_budget=2000, seed=SEED)
    assert [packer.step(queue) for _ in range(B + 1)] == ["pulled", "closed", "waiting"]
    assert queue.batch_closed(0)
    steps = []
    while (s := queue.claim(f"cell{len(steps) % 2}")) is not None:
        steps.append(s)
    assert len(steps) > 1
    assert all(row.advantage == pytest.approx(advantages[row.execution_id]) for s in steps for row in s.rows)
    expected = direct_loss([(e, tree, advantages[e]) for e, tree in trees.items()], roles)
    assert sum(micro_step_loss(s) for s in steps) == pytest.approx(expected, rel=1e-9, abs=1e-12)
