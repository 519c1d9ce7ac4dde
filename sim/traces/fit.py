"""Fitting a duration model to a preset's targets (``gyre trace fit``).

``fit_model`` re-derives a preset's hard-coded parameters: it solves the
preset's duration targets for the six shape parameters ``FITTED_FIELDS``
with ``scipy.optimize.least_squares`` (relative residuals) on common random
numbers, then scales ``tokens_per_call`` to the token target. The ceiling,
the budget, the failure rate and the call/token shape are never fitted: they
are the preset's stated assumptions.

Invariants: a fit is a pure function of (start model, targets, queries, seed,
N); fitted fractions stay in (0, 1) and spreads positive (they are searched
as logits and logarithms); with ``jmax1_token_share`` and
``jmax5_token_share`` among the targets, ``calls_per_branch`` and
``branch_weight`` are then solved for them on the first ``TRAJECTORY_QUERIES``
queries of the same sample (``traces.trajectories``); the preset's bounds are not fitted, the preset's
own targets (e.g. a share of queries holding a timeout below the bound) keep
them, and the tests check them.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
from scipy.special import expit, logit

from gyre.sim.traces.model import DurationModel, Variates, draw_variates, realize_counts, realize_durations
from gyre.sim.traces.stats import DURATION_KEYS, count_stats, duration_stats

FITTED_FIELDS = (
    "difficulty_log_mean",
    "difficulty_log_sd",
    "execution_log_sd",
    "hard_share",
    "stuck_rate",
    "overall_share",
)
_LOG_FIELDS = {"difficulty_log_sd", "execution_log_sd"}  # searched on a log scale
_LOGIT_FIELDS = {"hard_share", "stuck_rate", "overall_share"}  # searched as logits
TRAJECTORY_QUERIES = 10_000
TRAJECTORY_FIELDS = ("calls_per_branch", "branch_weight")
_EDGE = 1e-4  # fractions are kept inside [_EDGE, 1 - _EDGE] while searching


def _to_params(model: DurationModel) -> np.ndarray:
    def one(field: str) -> float:
        value = getattr(model, field)
        if field in _LOG_FIELDS:
            return float(np.log(max(value, 1e-3)))
        if field in _LOGIT_FIELDS:
            return float(logit(np.clip(value, _EDGE, 1 - _EDGE)))
        return float(value)

    return np.array([one(f) for f in FITTED_FIELDS])


def _from_params(model: DurationModel, x: np.ndarray) -> DurationModel:
    def one(field: str, v: float) -> float:
        if field in _LOG_FIELDS:
            return float(np.exp(v))
        if field in _LOGIT_FIELDS:
            return float(expit(v))
        return float(v)

    return dataclasses.replace(model, **{f: one(f, v) for f, v in zip(FITTED_FIELDS, x)})


def _scale_tokens(model: DurationModel, variates: Variates, mean_tokens: float) -> DurationModel:
    """Set ``tokens_per_call`` so the sample's mean token count is ``mean_tokens``."""
    _, _, active_s = realize_durations(model, variates)
    probe = dataclasses.replace(model, tokens_per_call=1000.0)
    achieved = count_stats(realize_counts(probe, variates, active_s))["mean_tokens"]
    return dataclasses.replace(model, tokens_per_call=float(1000.0 * mean_tokens / achieved))


def fit_model(
    model: DurationModel,
    targets: Mapping[str, float],
    *,
    queries: int = 100_000,
    seed: int = 20240601,
    N: int = 16,
) -> DurationModel:
    """Solve the duration targets for ``FITTED_FIELDS`` starting from ``model``.

    Every evaluation maps the same standard draws (common random numbers), so
    the objective moves only with the parameters. It is still piecewise
    constant at the scale of single executions crossing a threshold, hence
    finite-difference steps of 3 % rather than the default ~1e-8.
    """
    from scipy.optimize import least_squares

    keys = [k for k in targets if k in DURATION_KEYS and k != "failed_rate"]  # failed_rate is assumed
    variates = draw_variates(np.random.default_rng(seed), queries, N)

    def residuals(x: np.ndarray) -> np.ndarray:
        durations_s, codes, _ = realize_durations(_from_params(model, x), variates)
        achieved = duration_stats(durations_s, codes)
        return np.array([(achieved[k] - targets[k]) / max(abs(targets[k]), 1e-3) for k in keys])

    fitted = _from_params(model, least_squares(residuals, _to_params(model), diff_step=0.03).x)
    if "mean_tokens" in targets:
        fitted = _scale_tokens(fitted, variates, targets["mean_tokens"])
    if "jmax1_token_share" in targets and "jmax5_token_share" in targets:
        fitted = _fit_trajectories(fitted, variates, targets, seed)
    return fitted


def _fit_trajectories(model: DurationModel, variates: Variates, targets: Mapping[str, float],
                      seed: int) -> DurationModel:
    from gyre.formats.trace import Outcome
    from gyre.sim.traces.model import CODE
    from gyre.sim.traces.trajectories import fit_trajectory_model

    _, codes, active_s = realize_durations(model, variates)
    counts = realize_counts(model, variates, active_s)
    rows = slice(0, TRAJECTORY_QUERIES)
    trains = (codes == CODE[Outcome.COMPLETED]) | (codes == CODE[Outcome.HARNESS_TIMEOUT])
    tokens = counts["input_tokens"] + counts["output_tokens"]
    split = fit_trajectory_model(model.trajectory_model(), counts["call_count"][rows], tokens[rows], trains[rows],
                                 {1: targets["jmax1_token_share"], 5: targets["jmax5_token_share"]}, seed)
    return dataclasses.replace(model, calls_per_branch=split.calls_per_branch, branch_weight=split.branch_weight)
