"""Closed forms for boundary and continuous dispatch against the group-level queue model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gyre.analysis.dispatch import QueueModel, fifo_pmf, lag_groups, predicted_mean, simulate_queue
from gyre.analysis.staleness import staleness_stats
from gyre.staleness import steady_window


def _pmf_mean(pmf: pd.Series) -> float:
    return float((pmf.index.to_numpy() * pmf.to_numpy()).sum())


def test_closed_forms_by_hand():
    assert predicted_mean("boundary", 0.5, 3) == 1.5      # Gyre at E[d] = 1.5
    assert predicted_mean("boundary", 0.0, 4) == 1.5      # Colocate
    assert predicted_mean("boundary", 1.5, 1) == 1.5      # Async
    assert predicted_mean("continuous", 0.0, 1) == 1.0    # refilled during the step, one version behind
    assert predicted_mean("continuous", 0.5, 3) == 4.5
    assert lag_groups("boundary", 32, 0.5, 3) == 16 and lag_groups("continuous", 32, 0.5, 3) == 112
    with pytest.raises(ValueError):
        predicted_mean("eager", 0.5, 3)


def test_fifo_pmf_for_gyre_by_hand():
    # B = 2, (0.5, 3): L = 1; r = 0..5 -> d = floor(r/2) + 3*[r < 1] = 3, 0, 1, 1, 2, 2
    pmf = fifo_pmf("boundary", 2, 0.5, 3)
    assert pmf.to_dict() == pytest.approx({0: 1 / 6, 1: 2 / 6, 2: 2 / 6, 3: 1 / 6})


@settings(max_examples=examples(40), deadline=None)
@given(B=st.sampled_from([2, 4, 8]), phi_groups=st.integers(0, 20), mu=st.integers(1, 5),
       policy=st.sampled_from(["boundary", "continuous"]))
def test_fifo_model_matches_closed_form_exactly(B, phi_groups, mu, policy):
    phi = phi_groups / B
    steps = 12 * mu + 2 * (phi_groups // B + 3) * mu
    groups = simulate_queue(QueueModel(B=B, phi=phi, mu=mu, policy=policy), np.zeros(1), steps)
    window = steady_window(phi, mu, steps)
    stats = staleness_stats(groups, window)
    assert stats["mean"] == pytest.approx(predicted_mean(policy, phi, mu), abs=1e-9)
    pmf = fifo_pmf(policy, B, phi, mu)
    assert _pmf_mean(pmf) == pytest.approx(predicted_mean(policy, phi, mu), abs=1e-9)
    assert stats["max"] == pmf.index.max()
    assert (groups["staleness"].dropna() >= 0).all()


@pytest.mark.parametrize("phi, mu", [(0.0, 1), (0.5, 3), (1.5, 2), (2.5, 5)])
def test_heavy_tailed_readiness_keeps_the_means_and_the_gap_of_mu(phi, mu):
    rng = np.random.default_rng(7)
    rollout_s = rng.lognormal(mean=8.5, sigma=0.8, size=500)
    steps = 60
    window = steady_window(phi, mu, steps)
    means = {}
    for policy in ("boundary", "continuous"):
        model = QueueModel(B=8, phi=phi, mu=mu, policy=policy, train_s_per_group=300.0, publish_s=30.0,
                           capacity_groups=18)
        means[policy] = staleness_stats(simulate_queue(model, rollout_s, steps), window)["mean"]
        assert means[policy] == pytest.approx(predicted_mean(policy, phi, mu), abs=0.05)
    assert means["continuous"] - means["boundary"] == pytest.approx(mu, abs=0.1)


def test_every_group_consumed_at_most_once_and_tokens_follow_the_trace():
    model = QueueModel(B=4, phi=0.5, mu=2, policy="continuous", capacity_groups=5)
    groups = simulate_queue(model, np.array([5.0, 50.0, 500.0]), 10, tokens=np.array([1.0, 2.0, 3.0]))
    consumed = groups.dropna(subset=["v_t"])
    assert len(consumed) == 40 and consumed["group_id"].is_unique
    assert groups["tokens"].tolist()[:4] == [1.0, 2.0, 3.0, 1.0]
    assert (consumed["consumed_at_s"] >= consumed["ready_at_s"]).all()


def test_invalid_models_are_rejected():
    with pytest.raises(ValueError):
        QueueModel(B=3, phi=0.5, mu=1)  # phi * B not whole
    with pytest.raises(ValueError):
        QueueModel(B=4, phi=0.5, mu=1, policy="lazy")
    with pytest.raises(ValueError):
        simulate_queue(QueueModel(B=4, phi=0.5, mu=1), np.array([]), 3)
