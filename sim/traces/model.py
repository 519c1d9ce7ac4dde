"""The duration model behind the synthetic trace presets.

Per query q and execution j (hours unless stated):

* difficulty: one standard normal ``u_q`` per query. It sets the duration
  scale ``D_q = exp(mu_q + sigma_q * u_q)`` and whether the query is *hard*:
  the hardest ``hard_share`` of queries are those on which the harness can
  get stuck.
* quotas: the rare classes (hard queries, stuck executions in them, outright
  failures, overall timeouts among the stopped) are drawn as quotas: in
  every block of ``BLOCK_QUERIES`` (50) consecutive queries, the cells with
  the lowest uniform draws (the highest difficulty), as many as the
  cumulative expected count says (``quota``). Each cell is still equally
  likely, but a run that sees only the first few hundred queries of a trace
  sees the stated rates to within half an execution per class, instead of
  a binomial spread (the 0.87 % overall timeouts are ~56 of 6,400
  executions: +-13 % by chance alone). docs/simulator.md section 3.
* natural duration ``T_qj = D_q * exp(sigma_e * Z_qj)``: a shared scale makes
  the N executions of a query finish close together (terminations cluster).
* stuck: in a hard query each execution gets stuck with probability
  ``stuck_rate`` (a quota over the block's hard executions) and runs to the harness ceiling whatever its T_qj. So
  harness timeouts are concentrated in hard queries and, inside them, most
  executions time out together (docs/workload.md#hard-queries). A non-stuck execution whose T_qj
  reaches the ceiling is stopped there too (rare once fitted).
* overall timeout: an execution stopped at the ceiling has only
  ``budget_h - ceiling_h`` left for its evaluation; with probability
  ``overall_share`` its evaluation never returns a valid reward inside the
  budget: outcome overall_timeout, duration ``budget_h``, no reward. Other
  stopped executions end as harness_timeout at ``ceiling_h`` (still scored).
  Either way the harness stops at ``ceiling_h``: ``active_s`` (the trace's
  ``harness_s``) is the ceiling, and an overall timeout's duration adds its
  ``budget_h - ceiling_h`` of evaluation retries, which use no rollout engine.
  Executions that end before the ceiling have hours of budget left and are
  assumed always to get a valid reward (ours: the paper gives no split).
* failure: first of all, an execution fails outright with probability
  ``failed_rate`` (nothing evaluable, e.g. an image pull error) at a uniform
  point of its capped natural duration.
* model calls: ``call_count = round(active_s / call_s * LN)``, active time
  being the harness's own time (the ceiling for an overall timeout); tokens:
  ``call_count * tokens_per_call * LN``, of which ``output_share`` are output.
  Each LN is a mean-one lognormal factor.
* trajectories: the execution's tokens split over its candidate
  trajectories in admission order (``traces.trajectories``:
  ``calls_per_branch``, ``branch_weight``, ``branch_log_sd``), drawn after
  all the variates above, so adding them left every other column unchanged.

Invariants: every random number comes from the generator passed in, drawn in
one fixed order (``draw_variates``), so equal seeds give identical traces; a
harness timeout lasts exactly ``ceiling_h``, an overall timeout exactly
``budget_h > ceiling_h`` with its harness stopped at ``ceiling_h``;
``active_s <= durations_s``, equal except for overall timeouts; a completed or failed execution strictly less than
``ceiling_h`` and with a continuous distribution (no pile-up at one value);
only hard queries hold stuck executions; every prefix of whole blocks holds
the quota classes' expected counts to within half a cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre.formats.trace import OUTCOMES, Outcome
from gyre.sim.traces.trajectories import TrajectoryModel

HOUR_S = 3600.0
CODE = {name: code for code, name in enumerate(OUTCOMES)}


@dataclass(frozen=True, kw_only=True)
class DurationModel:
    """Parameters of the generator; see the module docstring for the model."""

    difficulty_log_mean: float  # mu_q, ln hours
    difficulty_log_sd: float  # sigma_q
    execution_log_sd: float  # sigma_e
    hard_share: float  # share of queries on which the harness can get stuck
    stuck_rate: float  # per-execution probability of getting stuck, in a hard query
    overall_share: float  # P(overall timeout | stopped at the ceiling)
    ceiling_h: float  # harness timeout
    budget_h: float  # total time budget = duration of an overall timeout
    failed_rate: float
    call_s: float  # mean seconds per model call, tool time included
    tokens_per_call: float
    output_share: float
    call_log_sd: float = 0.2
    token_log_sd: float = 0.3
    # trajectory split (traces.trajectories); defaults: the nl2repo-122b fit to the J_max shares of
    # docs/workload.md#training-cost-and-slack
    calls_per_branch: float = 54.91
    branch_weight: float = 0.2092
    branch_log_sd: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.ceiling_h < self.budget_h:
            raise ValueError("need 0 < ceiling_h < budget_h")
        fractions = ("hard_share", "stuck_rate", "overall_share", "failed_rate", "output_share")
        if not all(0 <= getattr(self, name) <= 1 for name in fractions) or self.failed_rate == 1:
            raise ValueError(f"{', '.join(fractions)} must be fractions (failed_rate < 1)")
        if self.difficulty_log_sd < 0 or self.execution_log_sd < 0:
            raise ValueError("log standard deviations must be >= 0")
        self.trajectory_model()  # checks the split's parameters

    def trajectory_model(self) -> TrajectoryModel:
        return TrajectoryModel(calls_per_branch=self.calls_per_branch, branch_weight=self.branch_weight,
                               branch_log_sd=self.branch_log_sd)


@dataclass(frozen=True)
class Variates:
    """Standard random draws for ``queries`` x ``N``; a model maps them to a trace."""

    difficulty: np.ndarray  # (Q,) standard normal
    noise: np.ndarray  # (Q, N) standard normal
    stuck_draw: np.ndarray  # (Q, N) uniform
    overall_draw: np.ndarray  # (Q, N) uniform
    failed_draw: np.ndarray  # (Q, N) uniform
    failed_point: np.ndarray  # (Q, N) uniform
    call_noise: np.ndarray  # (Q, N) standard normal
    token_noise: np.ndarray  # (Q, N) standard normal


def draw_variates(rng: np.random.Generator, queries: int, N: int) -> Variates:
    """All randomness of one trace, in a fixed order."""
    shape = (queries, N)
    return Variates(
        difficulty=rng.standard_normal(queries),
        noise=rng.standard_normal(shape),
        stuck_draw=rng.random(shape),
        overall_draw=rng.random(shape),
        failed_draw=rng.random(shape),
        failed_point=rng.random(shape),
        call_noise=rng.standard_normal(shape),
        token_noise=rng.standard_normal(shape),
    )


BLOCK_QUERIES = 50  # quotas hold in every run of this many consecutive queries (see the module docstring)


def quota(eligible: np.ndarray, score: np.ndarray, share: float, block: int = BLOCK_QUERIES) -> np.ndarray:
    """Bool mask: in each block of ``block`` consecutive rows, the eligible cells with the lowest scores.

    A block takes ``rint(share * E_k) - rint(share * E_{k-1})`` cells, ``E_k`` the eligible cells in
    blocks 0..k, so every prefix of whole blocks holds its expected count to within half a cell."""
    shape = eligible.shape
    rows = (np.arange(shape[0]) // block).reshape(-1, *([1] * (len(shape) - 1)))
    blocks = np.broadcast_to(rows, shape).ravel()
    e, s = eligible.ravel(), score.ravel()
    n_blocks = int(blocks.max()) + 1 if blocks.size else 0
    cumulative = np.rint(share * np.cumsum(np.bincount(blocks[e], minlength=n_blocks)))
    take = np.diff(cumulative, prepend=0.0).astype(np.int64)
    order = np.lexsort((s, ~e, blocks))  # by block, eligible first, lowest score first
    in_order = blocks[order]
    rank = np.arange(order.size) - np.searchsorted(in_order, np.arange(n_blocks))[in_order]
    picked = np.zeros(e.size, bool)
    picked[order] = e[order] & (rank < take[in_order])
    return picked.reshape(shape)


def hard_queries(model: DurationModel, difficulty: np.ndarray) -> np.ndarray:
    """(Q,) bool: in each block of queries, the hardest ``hard_share`` by difficulty (a quota)."""
    if model.hard_share <= 0:
        return np.zeros(difficulty.shape, bool)
    return quota(np.ones(difficulty.shape, bool), -difficulty, model.hard_share)


def realize_durations(model: DurationModel, v: Variates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(durations_s, outcome codes, active_s) grids; codes index ``OUTCOMES``."""
    log_scale = model.difficulty_log_mean + model.difficulty_log_sd * v.difficulty
    with np.errstate(over="ignore"):  # a fit may try huge spreads: inf is just "past the ceiling"
        natural_h = np.exp(log_scale[:, None] + model.execution_log_sd * v.noise)
    capped_h = np.minimum(natural_h, model.ceiling_h)
    everyone = np.ones(natural_h.shape, bool)
    failed = quota(everyone, v.failed_draw, model.failed_rate)
    hard = np.broadcast_to(hard_queries(model, v.difficulty)[:, None], natural_h.shape)
    stuck = quota(hard, v.stuck_draw, model.stuck_rate)
    stopped = ~failed & (stuck | (natural_h >= model.ceiling_h))
    overall = quota(stopped, v.overall_draw, model.overall_share)
    active_h = np.where(failed, v.failed_point * capped_h, np.where(stopped, model.ceiling_h, capped_h))
    duration_h = np.where(overall, model.budget_h, active_h)
    codes = np.full(natural_h.shape, CODE[Outcome.COMPLETED], np.int8)
    codes[failed] = CODE[Outcome.FAILED]
    codes[stopped] = CODE[Outcome.HARNESS_TIMEOUT]
    codes[overall] = CODE[Outcome.OVERALL_TIMEOUT]
    return duration_h * HOUR_S, codes, active_h * HOUR_S


def _mean_one(sd: float, z: np.ndarray) -> np.ndarray:
    return np.exp(sd * z - sd * sd / 2)


def realize_counts(model: DurationModel, v: Variates, active_s: np.ndarray) -> dict[str, np.ndarray]:
    """Per-execution call and token counts, growing with the harness's active time."""
    calls = np.rint(active_s / model.call_s * _mean_one(model.call_log_sd, v.call_noise))
    tokens = np.rint(calls * model.tokens_per_call * _mean_one(model.token_log_sd, v.token_noise))
    output = np.rint(tokens * model.output_share)
    return {
        "input_tokens": (tokens - output).astype(np.int64),
        "output_tokens": output.astype(np.int64),
        "call_count": calls.astype(np.int64),
    }
