"""Synthetic rollout-duration traces from named, calibrated presets.

The model, per query q and execution j (hours unless stated):

* difficulty ``D_q = exp(mu_q + sigma_q * Z_q)``; natural duration
  ``T_qj = D_q * exp(sigma_e * Z_qj)``. A shared difficulty makes the N
  executions of a query finish close together: terminations cluster.
* overall timeout: each query draws a propensity
  ``p_q = expit(a + b * Z'_q)``; each execution times out overall with
  probability p_q. It ran its harness, then its evaluation kept failing until
  the total budget was spent: ``duration = budget_h``, no valid reward. The
  per-query propensity clusters these too (a flaky task image, a heavy
  evaluator), heavier for larger b.
* otherwise it fails with probability ``failed_rate`` (nothing evaluable, e.g.
  an image pull error) at a uniform point of its capped natural duration;
* otherwise it ends at ``min(T_qj, ceiling_h)``; reaching the ceiling gives
  outcome harness_timeout (still scored), else completed.
* model calls: ``call_count = round(active_s / call_s * LN)``, active time
  being the harness's own time (the capped natural duration for an overall
  timeout); tokens: ``call_count * tokens_per_call * LN``, of which
  ``output_share`` are output. Each LN is a mean-one lognormal factor.

Invariants: every random number comes from the generator passed in, drawn in
one fixed order (``draw_variates``), so equal seeds give identical traces; a
harness timeout lasts exactly ``ceiling_h``, an overall timeout exactly
``budget_h > ceiling_h``, anything else less than ``ceiling_h``; a preset's
``targets`` are the statistics (``traces.stats`` keys) its fitted parameters
reproduce for N = 16. Other N work but change the slowest-of-N statistics.

Fitting (``gyre trace fit``, ``traces.stats.fit_model``): the five shape
parameters (mu_q, sigma_q, sigma_e, a, b) solve five duration targets with
scipy.optimize.least_squares on fixed common random numbers (100,000 queries
x 16), then ``tokens_per_call`` is set so that the mean token count matches.
Everything else in a preset is an assumption stated in its docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
import pandas as pd
from scipy.special import expit

from gyre.formats.trace import OUTCOMES, Outcome, Trace

HOUR_S = 3600.0
_CODE = {name: code for code, name in enumerate(OUTCOMES)}


@dataclass(frozen=True, kw_only=True)
class DurationModel:
    """Parameters of the generator; see the module docstring for the model."""

    difficulty_log_mean: float  # mu_q, ln hours
    difficulty_log_sd: float  # sigma_q
    execution_log_sd: float  # sigma_e
    overall_logit_mean: float  # a
    overall_logit_sd: float  # b
    ceiling_h: float  # harness timeout
    budget_h: float  # total time budget = duration of an overall timeout
    failed_rate: float
    call_s: float  # mean seconds per model call, tool time included
    tokens_per_call: float
    output_share: float
    call_log_sd: float = 0.2
    token_log_sd: float = 0.3

    def __post_init__(self) -> None:
        if not 0 < self.ceiling_h < self.budget_h:
            raise ValueError("need 0 < ceiling_h < budget_h")
        if not (0 <= self.failed_rate < 1 and 0 <= self.output_share <= 1):
            raise ValueError("failed_rate and output_share must be fractions")


@dataclass(frozen=True)
class Variates:
    """Standard random draws for ``queries`` x ``N``; a model maps them to a trace."""

    difficulty: np.ndarray  # (Q,) standard normal
    overall_propensity: np.ndarray  # (Q,) standard normal
    noise: np.ndarray  # (Q, N) standard normal
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
        overall_propensity=rng.standard_normal(queries),
        noise=rng.standard_normal(shape),
        overall_draw=rng.random(shape),
        failed_draw=rng.random(shape),
        failed_point=rng.random(shape),
        call_noise=rng.standard_normal(shape),
        token_noise=rng.standard_normal(shape),
    )


def realize_durations(model: DurationModel, v: Variates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(durations_s, outcome codes, active_s) grids; codes index ``OUTCOMES``."""
    log_t = model.difficulty_log_mean + model.difficulty_log_sd * v.difficulty[:, None]
    natural_h = np.exp(log_t + model.execution_log_sd * v.noise)
    capped_h = np.minimum(natural_h, model.ceiling_h)
    propensity = expit(model.overall_logit_mean + model.overall_logit_sd * v.overall_propensity)
    overall = v.overall_draw < propensity[:, None]
    failed = ~overall & (v.failed_draw < model.failed_rate)
    active_h = np.where(failed, v.failed_point * capped_h, capped_h)
    duration_h = np.where(overall, model.budget_h, active_h)
    codes = np.where(natural_h >= model.ceiling_h, _CODE[Outcome.HARNESS_TIMEOUT], _CODE[Outcome.COMPLETED])
    codes = np.where(failed, _CODE[Outcome.FAILED], codes)
    codes = np.where(overall, _CODE[Outcome.OVERALL_TIMEOUT], codes).astype(np.int8)
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


@dataclass(frozen=True, kw_only=True)
class TracePreset:
    """A named generator setting: model parameters plus the targets they reproduce."""

    name: str
    model: DurationModel
    targets: Mapping[str, float]
    summary: str = ""
    N: int = 16

    def describe(self) -> str:
        """Distribution, assumptions, parameters and targets as plain text."""
        lines = [f"preset {self.name} (N = {self.N})", "", self.summary, "", "parameters:"]
        for field in dataclasses.fields(self.model):
            lines.append(f"  {field.name:<20} = {getattr(self.model, field.name):.6g}")
        lines += ["targets (trace_stats keys):"]
        lines += [f"  {key:<30} = {value:.6g}" for key, value in self.targets.items()]
        return "\n".join(lines)


PRESETS: dict[str, TracePreset] = {}


class UnknownPresetError(ValueError):
    """A preset name that is not in ``PRESETS``; the message lists the known ones."""


def _preset(builder: Callable[[], TracePreset]) -> Callable[[], TracePreset]:
    """Register the preset a function builds; its docstring becomes the summary."""
    preset = builder()
    preset = dataclasses.replace(
        preset, summary=inspect.getdoc(builder) or "", targets=MappingProxyType(dict(preset.targets))
    )
    PRESETS[preset.name] = preset
    return builder


def get_preset(name: str | TracePreset) -> TracePreset:
    if isinstance(name, TracePreset):
        return name
    if name not in PRESETS:
        known = ", ".join(sorted(PRESETS))
        raise UnknownPresetError(f"unknown trace preset {name!r}; known presets: {known}")
    return PRESETS[name]


def generate_trace(preset: str | TracePreset, queries: int, rng: np.random.Generator, N: int = 16) -> Trace:
    """Draw a synthetic trace of ``queries`` groups of N executions from a preset."""
    chosen = get_preset(preset)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if int(queries) != queries or queries < 1 or int(N) != N or N < 1:
        raise ValueError(f"queries and N must be positive integers, got {queries!r} and {N!r}")
    variates = draw_variates(rng, int(queries), int(N))
    durations_s, codes, active_s = realize_durations(chosen.model, variates)
    frame = pd.DataFrame(
        {
            "query_id": np.repeat(np.arange(queries, dtype=np.int64), N),
            "execution_index": np.tile(np.arange(N, dtype=np.int64), queries),
            "duration_s": durations_s.ravel(),
            "outcome": pd.Categorical.from_codes(codes.ravel(), categories=OUTCOMES),
            **{k: v.ravel() for k, v in realize_counts(chosen.model, variates, active_s).items()},
        }
    )
    return Trace(frame, N=int(N), source=f"preset:{chosen.name}")


def default_trace() -> Trace:
    """The simulator's built-in trace: nl2repo-122b, 400 queries, seed 0."""
    return generate_trace("nl2repo-122b", 400, np.random.default_rng(0))


# ---------------------------------------------------------------- presets --
# Fitted parameters below come from `gyre trace fit --preset NAME` (100,000
# queries x 16, seed 20240601, scipy.optimize.least_squares, relative
# residuals); assumptions (ceiling, budget, failure rate, call time, token
# targets) are set by hand and stated in each docstring.


@_preset
def nl2repo_122b() -> TracePreset:
    """NL2Repo with Qwen 3.6 122B (SPEC section 5): build a repository from a spec.

    Calibrated to the measured profile: mean execution 1.93 h, mean query
    (slowest of 16) 2.96 h, 9.51 % of queries above 4 h, harness timeouts
    6.25 %, overall timeouts 0.87 %.
    Assumptions: the harness ceiling is 4 h and the total budget 4.5 h (4 h of
    harness plus 30 min of evaluation retries), so a query exceeds 4 h exactly
    when one of its executions times out overall; 0.5 % of executions fail
    outright; a model call takes 18 s with its tool time (~390 calls per
    execution); an execution processes ~1M tokens, 5 % of them output.
    Fitted: median query difficulty exp(0.533) = 1.70 h, spread between
    queries sigma_q = 0.49 and within a group sigma_e = 0.28 (log scale);
    overall-timeout propensity expit(-6.25 + 1.82 Z).
    """
    return TracePreset(
        name="nl2repo-122b",
        model=DurationModel(
            difficulty_log_mean=0.5329,
            difficulty_log_sd=0.4857,
            execution_log_sd=0.2811,
            overall_logit_mean=-6.2522,
            overall_logit_sd=1.8222,
            ceiling_h=4.0,
            budget_h=4.5,
            failed_rate=0.005,
            call_s=18.0,
            tokens_per_call=2620.4945,
            output_share=0.05,
        ),
        targets={
            "mean_execution_h": 1.93,
            "mean_query_h": 2.96,
            "queries_over_4h": 0.0951,
            "harness_timeout_rate": 0.0625,
            "overall_timeout_rate": 0.0087,
            "failed_rate": 0.005,
            "mean_tokens": 1.0e6,
        },
    )


@_preset
def nl2repo_2_4t() -> TracePreset:
    """NL2Repo with Qwen 3.8 2.4T (SPEC section 5): the same task, a slower model.

    Calibrated to the measured shape: 61.1 % of queries above 4 h and 38.2 % of
    queries whose longest execution ends in an overall timeout.
    Assumptions (the source gives no more): the relaxed harness ceiling is 6 h,
    the total budget 6.5 h; mean execution 3.0 h; 10 % harness timeouts and 5 %
    overall timeouts, so durations pile up at the ceiling and the budget
    (p90 = ceiling); 0.5 % failures; 30 s per model call; ~1M tokens per
    execution, 5 % output. Fitted: median difficulty exp(0.876) = 2.40 h, a
    wide spread between queries (sigma_q = 0.72) and a narrow one within a
    group (sigma_e = 0.15): easy queries end well under 4 h, hard ones run to
    the ceiling together; overall-timeout propensity expit(-3.82 + 1.48 Z).
    """
    return TracePreset(
        name="nl2repo-2.4t",
        model=DurationModel(
            difficulty_log_mean=0.8760,
            difficulty_log_sd=0.7196,
            execution_log_sd=0.1548,
            overall_logit_mean=-3.8187,
            overall_logit_sd=1.4849,
            ceiling_h=6.0,
            budget_h=6.5,
            failed_rate=0.005,
            call_s=30.0,
            tokens_per_call=2958.5767,
            output_share=0.05,
        ),
        targets={
            "queries_over_4h": 0.611,
            "slowest_overall_timeout_share": 0.382,
            "mean_execution_h": 3.0,
            "harness_timeout_rate": 0.10,
            "overall_timeout_rate": 0.05,
            "failed_rate": 0.005,
            "mean_tokens": 1.0e6,
        },
    )


@_preset
def deepswe() -> TracePreset:
    """DeepSWE-like software-engineering tasks (fix an issue in a repository).

    SPEC section 5 gives only the cluster (24 nodes, 6 cells, B = 48, N = 16)
    and says these tasks are shorter; every target here is an assumption:
    mean execution 0.40 h, mean query (slowest of 16) 0.85 h, harness ceiling
    1.5 h with 3 % harness timeouts, total budget 2 h with 0.5 % overall
    timeouts that cluster (5 % of queries have one), 1 % failures; 12 s per
    model call (~120 calls); ~300k tokens per execution, 5 % output.
    Fitted: median difficulty exp(-1.277) = 0.28 h, sigma_q = 0.74,
    sigma_e = 0.52; overall-timeout propensity expit(-7.76 + 2.34 Z).
    """
    return TracePreset(
        name="deepswe",
        model=DurationModel(
            difficulty_log_mean=-1.2769,
            difficulty_log_sd=0.7370,
            execution_log_sd=0.5185,
            overall_logit_mean=-7.7582,
            overall_logit_sd=2.3411,
            ceiling_h=1.5,
            budget_h=2.0,
            failed_rate=0.01,
            call_s=12.0,
            tokens_per_call=2550.1302,
            output_share=0.05,
        ),
        targets={
            "mean_execution_h": 0.40,
            "mean_query_h": 0.85,
            "harness_timeout_rate": 0.03,
            "overall_timeout_rate": 0.005,
            "slowest_overall_timeout_share": 0.05,
            "failed_rate": 0.01,
            "mean_tokens": 3.0e5,
        },
    )


@_preset
def terminalbench() -> TracePreset:
    """TerminalBench-like terminal tasks (drive a shell to reach a goal state).

    SPEC section 5 gives only the cluster (24 nodes, 6 cells, B = 48, N = 16)
    and says these tasks are shorter; every target here is an assumption:
    mean execution 0.25 h, mean query (slowest of 16) 0.55 h, harness ceiling
    1 h with 4 % harness timeouts, total budget 1.25 h with 0.5 % overall
    timeouts that cluster (5 % of queries have one), 1.5 % failures (container
    set-up); 8 s per model call (~110 calls); ~150k tokens per execution, 8 %
    output. Fitted: median difficulty exp(-1.863) = 0.16 h, sigma_q = 0.90,
    sigma_e = 0.59; overall-timeout propensity expit(-7.76 + 2.34 Z).
    """
    return TracePreset(
        name="terminalbench",
        model=DurationModel(
            difficulty_log_mean=-1.8625,
            difficulty_log_sd=0.8986,
            execution_log_sd=0.5899,
            overall_logit_mean=-7.7583,
            overall_logit_sd=2.3413,
            ceiling_h=1.0,
            budget_h=1.25,
            failed_rate=0.015,
            call_s=8.0,
            tokens_per_call=1360.0449,
            output_share=0.08,
        ),
        targets={
            "mean_execution_h": 0.25,
            "mean_query_h": 0.55,
            "harness_timeout_rate": 0.04,
            "overall_timeout_rate": 0.005,
            "slowest_overall_timeout_share": 0.05,
            "failed_rate": 0.015,
            "mean_tokens": 1.5e5,
        },
    )
