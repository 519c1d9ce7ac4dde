"""Execution-level objective (gyre.real.train.loss) against a naive loop, and split invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from gyre.real.train.loss import execution_level_loss  # noqa: E402

F64 = torch.float64


def naive_loss(logp, behavior, mask, index, adv, num_executions):
    """docs/trajectories.md#execution-level-loss written out token by token, one execution at a time."""
    total = 0.0 * logp.sum()  # keeps the graph when no execution has targets
    values = logp.detach()
    ratios, keeps = [], []
    for i in range(len(adv)):
        tokens = [u for u in range(len(logp)) if mask[u] and index[u] == i]
        a = float(adv[i])
        if not tokens:
            ratios.append(1.0)
            keeps.append(1.0)
            continue
        s = math.exp(sum(float(values[u]) - float(behavior[u]) for u in tokens) / len(tokens))
        m = 0.0 if (a > 0 and s > 1.005) or (a < 0 and s < 0.995) else 1.0
        execution = torch.zeros(())
        for u in tokens:
            w = min(math.exp(float(values[u]) - float(behavior[u])), 5.0)
            execution = execution + torch.minimum(-m * w * a * logp[u], torch.tensor(100.0))
        total = total + execution / len(tokens)
        ratios.append(s)
        keeps.append(m)
    return total / num_executions, ratios, keeps


def random_batch(seed, n_tokens, n_exec):
    rng = np.random.default_rng(seed)
    behavior = -rng.exponential(1.0, n_tokens)
    scale = rng.choice([1e-4, 3e-3, 0.3, 3.0], n_tokens)  # ratios near the clip interval and far from it
    logp = np.minimum(behavior + rng.normal(0, 1, n_tokens) * scale, 0)
    unlikely = rng.random(n_tokens) < 0.05  # very unlikely tokens: their token loss hits the cap of 100
    behavior[unlikely] = -80.0
    logp[unlikely] = -80.0 + rng.normal(0, 1e-3, unlikely.sum())
    mask = rng.random(n_tokens) < 0.7
    index = rng.integers(0, n_exec, n_tokens)
    adv = rng.normal(0, 1.5, n_exec) * (rng.random(n_exec) < 0.9)
    behavior[~mask] = np.nan  # non-targets carry no behaviour value
    return (torch.tensor(logp, requires_grad=True), torch.tensor(behavior), torch.tensor(mask),
            torch.tensor(index), torch.tensor(adv))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tokens=st.integers(1, 80), n_exec=st.integers(1, 6), extra=st.integers(0, 3))
def test_loss_and_gradient_equal_the_naive_loop(seed, n_tokens, n_exec, extra):
    logp, behavior, mask, index, adv = random_batch(seed, n_tokens, n_exec)
    loss, stats = execution_level_loss(logp, behavior, mask, index, adv, num_executions=n_exec + extra)
    (grad,) = torch.autograd.grad(loss, logp)
    expected, ratios, keeps = naive_loss(logp, behavior, mask, index, adv, n_exec + extra)
    (expected_grad,) = torch.autograd.grad(expected, logp, allow_unused=True, materialize_grads=True)
    assert torch.allclose(loss, expected, rtol=1e-10, atol=1e-12)
    assert torch.allclose(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert np.allclose(stats.sequence_ratio.numpy(), ratios, rtol=1e-12)
    assert stats.clip_mask.tolist() == keeps


def layout(rng, targets, n_rows):
    """Spread one execution's targets (index, logp, behavior) over rows padded with context tokens."""
    order = rng.permutation(len(targets))
    cuts = np.sort(rng.choice(np.arange(1, max(len(targets), 2)), size=min(n_rows - 1, max(len(targets) - 1, 0)),
                          replace=False)) if len(targets) > 1 else []
    rows = []
    for part in np.split(order, cuts):
        context = rng.integers(1, 4)
        logp = np.concatenate([-rng.random(context), [targets[k][1] for k in part]])
        behavior = np.concatenate([np.full(context, np.nan), [targets[k][2] for k in part]])
        mask = np.concatenate([np.zeros(context, bool), np.ones(len(part), bool)])
        rows.append((logp, behavior, mask, [targets[k][0] for k in part]))
    return rows


def flatten(rows_by_exec, rng):
    rows = [(e, row) for e, exec_rows in enumerate(rows_by_exec) for row in exec_rows]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    logp = np.concatenate([r[0] for _, r in rows])
    behavior = np.concatenate([r[1] for _, r in rows])
    mask = np.concatenate([r[2] for _, r in rows])
    index = np.concatenate([np.full(len(r[0]), e) for e, r in rows])
    ids = np.concatenate([np.concatenate([np.full(len(r[0]) - len(r[3]), -1), r[3]]) for _, r in rows])
    return torch.tensor(logp, requires_grad=True), torch.tensor(behavior), torch.tensor(mask), torch.tensor(index), ids


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_exec=st.integers(1, 5))
def test_split_among_trajectories_and_order_do_not_matter(seed, n_exec):
    rng = np.random.default_rng(seed)
    executions = []
    for e in range(n_exec):
        n = int(rng.integers(0, 12))
        behavior = -rng.exponential(1.0, n)
        logp = np.minimum(behavior + rng.normal(0, rng.choice([1e-3, 0.1]), n), 0)
        executions.append([(f"{e}:{k}", logp[k], behavior[k]) for k in range(n)])
    adv = torch.tensor(rng.normal(0, 1, n_exec))
    results = []
    for _ in range(2):
        rows = [layout(rng, targets, int(rng.integers(1, 6))) for targets in executions]
        logp, behavior, mask, index, ids = flatten(rows, rng)
        loss, stats = execution_level_loss(logp, behavior, mask, index, adv, num_executions=n_exec)
        (grad,) = torch.autograd.grad(loss, logp)
        grads = {ids[u]: float(grad[u]) for u in range(len(ids)) if mask[u]}
        results.append((float(loss.detach()), stats.sequence_ratio.tolist(), stats.clip_mask.tolist(), grads))
    (l1, s1, m1, g1), (l2, s2, m2, g2) = results
    assert l1 == pytest.approx(l2, rel=1e-12, abs=1e-15)
    assert s1 == pytest.approx(s2, rel=1e-12) and m1 == m2
    assert g1.keys() == g2.keys() and all(g1[k] == pytest.approx(g2[k], rel=1e-12, abs=1e-15) for k in g1)


def test_execution_spread_over_micro_steps_sums_to_the_whole():
    logp, behavior, mask, index, adv = random_batch(3, 60, 3)
    whole, stats = execution_level_loss(logp, behavior, mask, index, adv, num_executions=4)
    half = torch.arange(60) < 30
    parts = []
    for part in (half, ~half):
        part_loss, _ = execution_level_loss(
            logp, behavior, mask & part, index, adv, num_executions=4, target_counts=stats.target_counts,
            sequence_log_ratio=torch.log(stats.sequence_ratio))
        parts.append(part_loss)
    assert torch.allclose(parts[0] + parts[1], whole, rtol=1e-12)


def test_zero_targets_contribute_zero_but_count_in_the_batch():
    logp = torch.tensor([-1.0, -2.0], dtype=F64, requires_grad=True)
    behavior = torch.tensor([-1.0, -2.0], dtype=F64)
    mask = torch.tensor([True, True])
    index = torch.tensor([0, 0])
    adv = torch.tensor([1.0, -3.0], dtype=F64)  # execution 1 has no targets
    loss, stats = execution_level_loss(logp, behavior, mask, index, adv, num_executions=4)
    assert loss.item() == pytest.approx((1.0 * 1 + 1.0 * 2) / 2 / 4)
    assert stats.sequence_ratio.tolist() == [1.0, 1.0] and stats.target_counts.tolist() == [2.0, 0.0]
    assert stats.clip_fraction == 0.0


def test_clip_mask_is_one_decision_per_execution():
    behavior = torch.tensor([-1.0, -1.0, -1.0, -1.0], dtype=F64)
    logp = torch.tensor([-0.99, -1.0, -1.02, -1.0], dtype=F64, requires_grad=True)  # exec 0 s>1.005, exec 1 s<0.995
    index = torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, dtype=torch.bool)
    for adv, clipped in (([1.0, 1.0], [0.0, 1.0]), ([-1.0, -1.0], [1.0, 0.0])):
        _, stats = execution_level_loss(logp, behavior, mask, index, torch.tensor(adv, dtype=F64), num_executions=2)
        assert stats.clip_mask.tolist() == clipped and stats.clip_fraction == 0.5


@pytest.mark.parametrize("change, message", [
    (dict(behavior=torch.zeros(3)), "behavior_logprobs has shape"),
    (dict(mask=torch.ones(4)), "bool tensor"),
    (dict(num_executions=1), "num_executions"),
    (dict(index=torch.tensor([0, 0, 5, 0])), "execution_index"),
    (dict(behavior=torch.tensor([-1.0, float("nan"), -1.0, -1.0])), "finite"),
    (dict(adv=torch.zeros(2, 2)), "advantages must be 1-D"),
])
def test_bad_inputs_raise(change, message):
    args = dict(logp=torch.zeros(4, requires_grad=True), behavior=torch.zeros(4), mask=torch.ones(4, dtype=torch.bool),
                index=torch.zeros(4, dtype=torch.long), adv=torch.ones(2), num_executions=2)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        execution_level_loss(args["logp"], args["behavior"], args["mask"], args["index"], args["adv"],
                             num_executions=args["num_executions"])


def test_float32_inputs_stay_float32_and_mixed_behavior_dtype_is_accepted():
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)  # float32, like a model's output
    behavior = torch.tensor([-1.0, -2.1, -0.5], dtype=F64)  # recorded in float64
    loss, stats = execution_level_loss(logp, behavior, torch.tensor([False, True, True]), torch.tensor([0, 0, 1]),
                                       torch.tensor([1.0, -1.0]), num_executions=2)
    loss.backward()
    assert loss.dtype == torch.float32 and logp.grad.dtype == torch.float32 and logp.grad[0] == 0
    assert stats.sequence_ratio.dtype == torch.float32
