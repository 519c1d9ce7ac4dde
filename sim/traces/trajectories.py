"""How an execution's tokens split over its candidate trajectories, and what J_max keeps.

docs/trajectories.md give the mechanism: an execution's trajectory tree has one
leaf per candidate trajectory; admission takes the main agent's class first,
then draws leaves with probability proportional to their unmasked trainable
tokens, and stops after ``J_max``. docs/workload.md#training-cost-and-slack gives the outcome to reproduce:
the forward-backward time per step with ``J_max = 1`` is 41.4 % of the
uncapped baseline, with ``J_max = 5`` 74.8 %. The model (ours) per execution:

* rows: the execution's trainable rows hold its trace tokens ``T`` (input
  + output; shared prefixes are counted once, the rest of the tree is
  folded into the sizes);
* count: ``R = 1 + Poisson(call_count / calls_per_branch)`` candidate
  trajectories: compactions and sub-agents branch the tree as calls
  accumulate (the example of docs/trajectories.md#trajectory-trees: 636 requests, 10 leaves);
* sizes: the main trajectory has weight 1, every other one
  ``branch_weight * LN`` (LN a mean-one lognormal of log-sd
  ``branch_log_sd``); sizes are ``T * w / sum(w)`` rounded, the rounding
  remainder going to the main one, so they sum to ``T`` exactly;
* admission order: the main trajectory first, then the others as a
  size-biased random permutation (the draw of docs/trajectories.md#admission proportional to tokens),
  drawn by exponential races ``E / w``;
* tokens kept under a cap ``J``: the sum of the first ``J`` sizes.

The fit (``fit_trajectory_model``) solves ``calls_per_branch`` and
``branch_weight`` for the two docs/workload.md#training-cost-and-slack shares, measured token-weighted over
the executions that train (completed and harness-timed-out: an excluded
execution trains nothing, a failed one only a reward-0 placeholder).

Invariants: sizes are positive integers summing to the execution's tokens
(an execution with 0 tokens has one empty trajectory); the first size is the
main trajectory; every random number comes from the generator passed in, in
one fixed order (counts, then weights, then races); kept tokens grow with J
and equal T once J >= R.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np

# paper: docs/workload.md#training-cost-and-slack, forward-backward time vs uncapped
SPEC51_KEPT_SHARE = {1: 0.414, 5: 0.748}


@dataclass(frozen=True, kw_only=True)
class TrajectoryModel:
    """Parameters of the split; see the module docstring."""

    calls_per_branch: float
    branch_weight: float
    branch_log_sd: float = 0.5

    def __post_init__(self) -> None:
        if not (self.calls_per_branch > 0 and self.branch_weight > 0 and self.branch_log_sd >= 0):
            raise ValueError(f"need calls_per_branch > 0, branch_weight > 0, branch_log_sd >= 0: {self}")


@dataclass(frozen=True)
class Ragged:
    """Trajectory sizes of many executions: ``sizes`` flat, ``counts`` per execution (admission order)."""

    sizes: np.ndarray  # int64, sum(counts) entries
    counts: np.ndarray  # int64, >= 1 per execution

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.counts)[:-1]))

    def kept(self, j_max: int) -> np.ndarray:
        """Per execution: tokens of its first ``j_max`` trajectories."""
        if int(j_max) != j_max or j_max < 1:
            raise ValueError(f"j_max must be a positive integer, got {j_max!r}")
        rank = np.arange(self.sizes.size) - np.repeat(self.starts, self.counts)
        kept = np.where(rank < j_max, self.sizes, 0)
        return np.add.reduceat(kept, self.starts) if self.sizes.size else np.zeros(0, np.int64)

    def as_json(self) -> list[str]:
        """One JSON list per execution, e.g. ``[41000,9000]`` (one join, one split: no per-row loop)."""
        text = list(map(str, self.sizes.tolist()))
        ends = np.cumsum(self.counts).tolist()
        out, start = [], 0
        for end in ends:
            out.append("[" + ",".join(text[start:end]) + "]")
            start = end
        return out

    @classmethod
    def from_json(cls, cells: list[str]) -> Ragged:
        lists = json.loads("[" + ",".join(cells) + "]")
        counts = np.fromiter((len(x) for x in lists), np.int64, len(lists))
        flat = [v for x in lists for v in x]
        return cls(np.asarray(flat, dtype=np.int64), counts)


def realize_trajectories(model: TrajectoryModel, rng: np.random.Generator, call_count: np.ndarray,
                         tokens: np.ndarray) -> Ragged:
    """Trajectory sizes, in admission order, for executions with these call and token counts (flat arrays)."""
    calls = np.asarray(call_count, dtype=float).ravel()
    total = np.asarray(tokens, dtype=np.int64).ravel()
    counts = 1 + _poisson_inverse(rng.random(calls.size), calls / model.calls_per_branch)
    counts[total == 0] = 1
    branches = int((counts - 1).sum())
    sd = model.branch_log_sd
    weight = model.branch_weight * np.exp(sd * rng.standard_normal(branches) - sd * sd / 2)
    race = rng.standard_exponential(branches) / weight
    owner = np.repeat(np.arange(counts.size), counts - 1)
    order = np.argsort(owner + race / (1.0 + race), kind="stable")  # within an execution: size-biased order
    weights = np.ones(int(counts.sum()))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    branch_slots = np.ones(weights.size, bool)
    branch_slots[starts] = False
    weights[branch_slots] = weight[order]
    per_exec = np.add.reduceat(weights, starts)
    share = weights / np.repeat(per_exec, counts)
    sizes = np.floor(share * np.repeat(total, counts)).astype(np.int64)
    sizes[starts] += total - np.add.reduceat(sizes, starts)  # remainder to the main trajectory
    return Ragged(sizes, counts)


def _poisson_inverse(u: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Poisson(lam) by inversion of uniforms u: a monotone map, so fits see common random numbers."""
    out = np.zeros(u.size, np.int64)
    small = lam <= 50
    if (~small).any():
        from scipy.stats import poisson  # here: scipy.stats is most of `import gyre.sim.runner`, rarely needed

        out[~small] = poisson.ppf(u[~small], lam[~small]).astype(np.int64)
    idx = np.flatnonzero(small)
    p = np.exp(-lam[idx])
    cdf = p.copy()
    k = 0
    while idx.size:
        more = u[idx] > cdf
        idx, p, cdf = idx[more], p[more], cdf[more]
        k += 1
        out[idx] = k
        p = p * lam[idx] / k
        cdf = cdf + p
        if k > 400:  # cdf rounding: never loop forever
            break
    return out


def kept_shares(ragged: Ragged, trains: np.ndarray, caps: tuple[int, ...] = (1, 5)) -> dict[int, float]:
    """Token-weighted share kept under each cap, over the executions that train."""
    trains = np.asarray(trains, bool).ravel()
    total = np.add.reduceat(ragged.sizes, ragged.starts)[trains].sum()
    return {j: float(ragged.kept(j)[trains].sum() / total) for j in caps}


def fit_trajectory_model(model: TrajectoryModel, call_count: np.ndarray, tokens: np.ndarray, trains: np.ndarray,
                         targets: dict[int, float] = SPEC51_KEPT_SHARE, seed: int = 20240601) -> TrajectoryModel:
    """Solve ``calls_per_branch`` and ``branch_weight`` for the kept shares (common random numbers)."""
    from scipy.optimize import least_squares

    caps = tuple(sorted(targets))

    def build(x: np.ndarray) -> TrajectoryModel:
        return dataclasses.replace(model, calls_per_branch=float(np.exp(x[0])), branch_weight=float(np.exp(x[1])))

    def residuals(x: np.ndarray) -> np.ndarray:
        shares = kept_shares(realize_trajectories(build(x), np.random.default_rng(seed), call_count, tokens),
                             trains, caps)
        return np.array([shares[j] - targets[j] for j in caps])

    start = np.log([model.calls_per_branch, model.branch_weight])
    return build(least_squares(residuals, start, diff_step=0.05).x)
