"""Achieved statistics of a trace, their comparison with targets, and the fit.

Definitions (every statistic is over all executions or all queries, whatever
their outcome; hours are 3,600 s):

* ``mean_execution_h``: mean execution duration;
* ``mean_query_h``: mean over queries of the slowest execution of the group
  (a group is ready only when its last execution ends);
* ``queries_over_4h``: share of queries whose slowest execution lasts > 4 h;
* ``harness_timeout_rate``, ``overall_timeout_rate``, ``failed_rate``: shares
  of executions with that outcome;
* ``slowest_overall_timeout_share``: share of queries whose slowest execution
  (any of them, on a tie) ended in an overall timeout;
* ``p50/p90/p99_execution_h``: execution duration quantiles (linear);
* ``mean_tokens`` (input + output), ``mean_input_tokens``,
  ``mean_output_tokens``, ``mean_call_count``: present only when the trace
  has those columns.

Tolerance (the yardstick of the preset tests and of the table's last column):
keys ending in ``_rate`` or containing ``share``/``over`` are fractions and
must lie within 1.5 percentage points; every other key within 5 % relative.

``fit_model`` re-derives a preset's hard-coded parameters: it solves the
preset's duration targets for the five shape parameters on common random
numbers, then scales ``tokens_per_call`` to the token target.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from gyre.formats.trace import COUNT_COLUMNS, OUTCOMES, Outcome, Trace
from gyre.sim.traces.presets import (
    HOUR_S,
    DurationModel,
    Variates,
    draw_variates,
    realize_counts,
    realize_durations,
)

RATE_TOLERANCE = 0.015  # absolute, on fractions
RELATIVE_TOLERANCE = 0.05
FITTED_FIELDS = (
    "difficulty_log_mean",
    "difficulty_log_sd",
    "execution_log_sd",
    "overall_logit_mean",
    "overall_logit_sd",
)
_LOG_FIELDS = {"difficulty_log_sd", "execution_log_sd"}  # fitted on log scale

# key -> (label, kind); kind picks the printed unit
METRICS: dict[str, tuple[str, str]] = {
    "mean_execution_h": ("mean execution", "h"),
    "mean_query_h": ("mean query (slowest of N)", "h"),
    "queries_over_4h": ("queries > 4 h", "%"),
    "harness_timeout_rate": ("harness timeout rate", "%"),
    "overall_timeout_rate": ("overall timeout rate", "%"),
    "failed_rate": ("failed rate", "%"),
    "slowest_overall_timeout_share": ("slowest in overall timeout", "%"),
    "p50_execution_h": ("p50 execution", "h"),
    "p90_execution_h": ("p90 execution", "h"),
    "p99_execution_h": ("p99 execution", "h"),
    "mean_tokens": ("mean tokens", "tokens"),
    "mean_input_tokens": ("mean input tokens", "tokens"),
    "mean_output_tokens": ("mean output tokens", "tokens"),
    "mean_call_count": ("mean call count", "count"),
}


DURATION_KEYS = tuple(k for k in METRICS if "token" not in k and "call" not in k)


def is_fraction(key: str) -> bool:
    return key.endswith("_rate") or "share" in key or "_over_" in key


def within_tolerance(key: str, achieved: float, target: float) -> bool:
    """Whether an achieved statistic meets its target under the stated tolerance."""
    if is_fraction(key):
        return abs(achieved - target) <= RATE_TOLERANCE
    return abs(achieved - target) <= RELATIVE_TOLERANCE * abs(target)


def duration_stats(durations_s: np.ndarray, outcomes: np.ndarray) -> dict[str, float]:
    """Duration statistics of a (queries, N) grid; outcomes are names or codes."""
    if outcomes.dtype.kind in "iu":
        outcomes = np.asarray(OUTCOMES)[outcomes]
    slowest = durations_s.max(axis=1)
    overall = outcomes == Outcome.OVERALL_TIMEOUT
    slowest_is_overall = (overall & (durations_s == slowest[:, None])).any(axis=1)
    p50, p90, p99 = np.quantile(durations_s, [0.5, 0.9, 0.99]) / HOUR_S
    return {
        "mean_execution_h": float(durations_s.mean() / HOUR_S),
        "mean_query_h": float(slowest.mean() / HOUR_S),
        "queries_over_4h": float((slowest > 4 * HOUR_S).mean()),
        "harness_timeout_rate": float((outcomes == Outcome.HARNESS_TIMEOUT).mean()),
        "overall_timeout_rate": float(overall.mean()),
        "failed_rate": float((outcomes == Outcome.FAILED).mean()),
        "slowest_overall_timeout_share": float(slowest_is_overall.mean()),
        "p50_execution_h": float(p50),
        "p90_execution_h": float(p90),
        "p99_execution_h": float(p99),
    }


def count_stats(counts: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Means of whichever token/call columns are present."""
    stats = {f"mean_{k}": float(np.mean(v)) for k, v in counts.items() if k in COUNT_COLUMNS}
    if "input_tokens" in counts and "output_tokens" in counts:
        stats["mean_tokens"] = float(np.mean(counts["input_tokens"] + counts["output_tokens"]))
    return stats


def trace_stats(trace: Trace) -> dict[str, float]:
    """All statistics of a trace, plus its shape (queries, executions, N)."""
    stats: dict[str, float] = {"queries": trace.queries, "executions": trace.queries * trace.N, "N": trace.N}
    stats.update(duration_stats(trace.durations_s, trace.outcomes))
    present = {c: trace.column(c) for c in COUNT_COLUMNS if trace.column(c) is not None}
    stats.update(count_stats(present))
    return stats


def _format_value(value: float, kind: str) -> str:
    if kind == "%":
        return f"{100 * value:.2f}%"
    if kind == "h":
        return f"{value:.3f} h"
    if kind == "tokens":
        return f"{value / 1e6:.3f}M" if value >= 1e5 else f"{value:,.0f}"
    return f"{value:.1f}"


def _tolerance_text(key: str) -> str:
    return f"+-{100 * RATE_TOLERANCE:.1f} pp" if is_fraction(key) else f"+-{100 * RELATIVE_TOLERANCE:.0f}%"


def format_stats_table(stats: Mapping[str, float], targets: Mapping[str, float] | None = None) -> str:
    """A plain-text table: achieved values, and target/tolerance/verdict if given."""
    header = ["metric", "achieved"] + (["target", "tolerance", "ok"] if targets else [])
    rows = [header]
    for key, (label, kind) in METRICS.items():
        if key not in stats:
            continue
        row = [label, _format_value(stats[key], kind)]
        if targets and key in targets:
            ok = within_tolerance(key, stats[key], targets[key])
            row += [_format_value(targets[key], kind), _tolerance_text(key), "yes" if ok else "NO"]
        rows.append(row + [""] * (len(header) - len(row)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    shape = f"{int(stats.get('queries', 0))} queries x N = {int(stats.get('N', 0))}"
    return "\n".join([shape, *lines])


def _to_params(model: DurationModel) -> np.ndarray:
    values = [getattr(model, f) for f in FITTED_FIELDS]
    return np.array([np.log(v) if f in _LOG_FIELDS else v for f, v in zip(FITTED_FIELDS, values)])


def _from_params(model: DurationModel, x: np.ndarray) -> DurationModel:
    values = {f: float(np.exp(v) if f in _LOG_FIELDS else v) for f, v in zip(FITTED_FIELDS, x)}
    values["overall_logit_sd"] = abs(values["overall_logit_sd"])  # Z is symmetric
    return dataclasses.replace(model, **values)


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
    return fitted
