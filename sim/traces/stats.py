"""Achieved statistics of a trace and their comparison with a preset's targets.

Definitions (every statistic is over all executions or all queries, whatever
their outcome; hours are 3,600 s; a *timeout* is a harness or overall
timeout):

* ``mean_execution_h``: mean execution duration;
* ``mean_query_h``: mean over queries of the slowest execution of the group
  (a group is ready only when its last execution ends);
* ``queries_over_4h``: share of queries whose slowest execution lasts > 4 h;
* ``harness_timeout_rate``, ``overall_timeout_rate``, ``failed_rate``: shares
  of executions with that outcome;
* ``slowest_overall_timeout_share``: share of queries whose slowest execution
  (any of them, on a tie) ended in an overall timeout;
* ``queries_with_timeout``: share of queries holding at least one timeout;
* ``independent_timeout_queries``: the same share had the trace's timeouts
  struck executions independently, ``1 - (1 - t)^N`` with t the share of
  executions that timed out (the docs/workload.md#hard-queries counterfactual, ~64 % for 122B);
* ``timeouts_per_timed_out_query``: mean number of timeouts in a query that
  holds one (out of N);
* ``queries_at_ceiling``: share of queries whose slowest execution (any, on
  a tie) is a timeout, i.e. whose duration is pinned to the ceiling or the
  budget rather than set by a completion;
* ``near_ceiling_share``: share of executions lasting at least
  ``NEAR_CEILING`` of the harness ceiling (timeouts included); the ceiling is
  read off the trace as the shortest harness timeout; absent without one;
* ``tie_share``: the largest share of completed and failed executions that
  end at one single duration value (a pile-up check; ~1/count when none);
* ``p50/p90/p99_execution_h``: execution duration quantiles (linear);
* ``mean_tokens`` (input + output), ``mean_input_tokens``,
  ``mean_output_tokens``, ``mean_call_count``: only when the trace has those
  columns;
* ``jmax1_token_share``, ``jmax5_token_share``: share of the trained tokens
  that admission keeps when capped at J_max = 1 or 5 trajectories per
  execution (docs/workload.md#training-cost-and-slack: 41.4 % and 74.8 % of the uncapped forward-backward
  time), over the executions that train (completed, harness timeout); only
  when the trace has ``trajectory_tokens``;
* ``mean_trajectories``: mean candidate trajectories per execution (same).

Tolerance (the yardstick of the preset tests and of the table): fractions
(metrics printed in %) must lie within 1.5 percentage points of their target;
every other key within 5 % relative. A *bound* (``<= value``) is met when the
achieved value does not exceed it, with no tolerance.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from gyre.formats.trace import COUNT_COLUMNS, OUTCOMES, Outcome, Trace
from gyre.sim.traces.model import HOUR_S

RATE_TOLERANCE = 0.015  # absolute, on fractions
RELATIVE_TOLERANCE = 0.05
NEAR_CEILING = 0.8

# key -> (label, kind); kind picks the printed unit
METRICS: dict[str, tuple[str, str]] = {
    "mean_execution_h": ("mean execution", "h"),
    "mean_query_h": ("mean query (slowest of N)", "h"),
    "queries_over_4h": ("queries > 4 h", "%"),
    "harness_timeout_rate": ("harness timeout rate", "%"),
    "overall_timeout_rate": ("overall timeout rate", "%"),
    "failed_rate": ("failed rate", "%"),
    "slowest_overall_timeout_share": ("slowest in overall timeout", "%"),
    "queries_with_timeout": ("queries holding a timeout", "%"),
    "independent_timeout_queries": ("  same, timeouts independent", "%"),
    "timeouts_per_timed_out_query": ("timeouts per such query", "count"),
    "queries_at_ceiling": ("queries at ceiling/budget", "%"),
    "near_ceiling_share": (f"executions >= {NEAR_CEILING:.0%} of ceiling", "%"),
    "tie_share": ("largest tie, completed/failed", "%"),
    "p50_execution_h": ("p50 execution", "h"),
    "p90_execution_h": ("p90 execution", "h"),
    "p99_execution_h": ("p99 execution", "h"),
    "mean_tokens": ("mean tokens", "tokens"),
    "mean_input_tokens": ("mean input tokens", "tokens"),
    "mean_output_tokens": ("mean output tokens", "tokens"),
    "mean_call_count": ("mean call count", "count"),
    "jmax1_token_share": ("trained tokens kept, J_max = 1", "%"),
    "jmax5_token_share": ("trained tokens kept, J_max = 5", "%"),
    "mean_trajectories": ("mean trajectories per execution", "count"),
}

DURATION_KEYS = tuple(k for k in METRICS if "token" not in k and "call" not in k and "trajector" not in k)


def is_fraction(key: str) -> bool:
    return METRICS[key][1] == "%" if key in METRICS else key.endswith("_rate") or "share" in key


def within_tolerance(key: str, achieved: float, target: float) -> bool:
    """Whether an achieved statistic meets its target under the stated tolerance."""
    if is_fraction(key):
        return abs(achieved - target) <= RATE_TOLERANCE
    return abs(achieved - target) <= RELATIVE_TOLERANCE * abs(target)


def _largest_tie(values: np.ndarray) -> float:
    if values.size == 0:
        return 0.0
    _, counts = np.unique(values, return_counts=True)
    return float(counts.max() / values.size)


def duration_stats(durations_s: np.ndarray, outcomes: np.ndarray) -> dict[str, float]:
    """Duration statistics of a (queries, N) grid; outcomes are names or codes."""
    if outcomes.dtype.kind in "iu":
        outcomes = np.asarray(OUTCOMES)[outcomes]
    N = durations_s.shape[1]
    slowest = durations_s.max(axis=1)
    is_slowest = durations_s == slowest[:, None]
    harness = outcomes == Outcome.HARNESS_TIMEOUT
    overall = outcomes == Outcome.OVERALL_TIMEOUT
    timeout = harness | overall
    per_query = timeout.sum(axis=1)
    finished = (outcomes == Outcome.COMPLETED) | (outcomes == Outcome.FAILED)
    p50, p90, p99 = np.quantile(durations_s, [0.5, 0.9, 0.99]) / HOUR_S
    stats = {
        "mean_execution_h": float(durations_s.mean() / HOUR_S),
        "mean_query_h": float(slowest.mean() / HOUR_S),
        "queries_over_4h": float((slowest > 4 * HOUR_S).mean()),
        "harness_timeout_rate": float(harness.mean()),
        "overall_timeout_rate": float(overall.mean()),
        "failed_rate": float((outcomes == Outcome.FAILED).mean()),
        "slowest_overall_timeout_share": float((overall & is_slowest).any(axis=1).mean()),
        "queries_with_timeout": float((per_query > 0).mean()),
        "independent_timeout_queries": float(1 - (1 - timeout.mean()) ** N),
        "timeouts_per_timed_out_query": float(per_query[per_query > 0].mean()) if per_query.any() else 0.0,
        "queries_at_ceiling": float((timeout & is_slowest).any(axis=1).mean()),
        "tie_share": _largest_tie(durations_s[finished]),
        "p50_execution_h": float(p50),
        "p90_execution_h": float(p90),
        "p99_execution_h": float(p99),
    }
    if harness.any():
        stats["near_ceiling_share"] = float((durations_s >= NEAR_CEILING * durations_s[harness].min()).mean())
    return stats


def count_stats(counts: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Means of whichever token/call columns are present."""
    stats = {f"mean_{k}": float(np.mean(v)) for k, v in counts.items() if k in COUNT_COLUMNS}
    if "input_tokens" in counts and "output_tokens" in counts:
        stats["mean_tokens"] = float(np.mean(counts["input_tokens"] + counts["output_tokens"]))
    return stats


def trace_stats(trace: Trace) -> dict[str, float]:
    """All statistics of a trace, plus its shape (queries, executions, N)."""
    n = trace.N
    assert n is not None  # a Trace sets N when it is built
    stats: dict[str, float] = {"queries": trace.queries, "executions": trace.queries * n, "N": n}
    stats.update(duration_stats(trace.durations_s, trace.outcomes))
    present = {c: trace.column(c) for c in COUNT_COLUMNS if trace.column(c) is not None}
    stats.update(count_stats(present))
    stats.update(trajectory_stats(trace))
    return stats


def trajectory_stats(trace: Trace) -> dict[str, float]:
    """Kept-token shares under J_max = 1 and 5, and trajectories per execution (empty without the column)."""
    sizes = trace.trajectory_sizes()
    if sizes is None:
        return {}
    trains = np.isin(trace.outcomes, (Outcome.COMPLETED.value, Outcome.HARNESS_TIMEOUT.value))

    def trained_tokens(j_max: int) -> float:
        kept = trace.kept_tokens(j_max)
        assert kept is not None  # the trace has the trajectory column (sizes above)
        return kept[trains].sum()

    total = trained_tokens(int(sizes[1].max()))
    out = {"mean_trajectories": float(sizes[1].mean())}
    for j in (1, 5):
        out[f"jmax{j}_token_share"] = float(trained_tokens(j) / total) if total else 1.0
    return out


def fit_error(key: str, achieved: float, target: float) -> str:
    """Achieved minus target: in percentage points for fractions, else relative."""
    if is_fraction(key):
        return f"{100 * (achieved - target):+.2f} pp"
    return f"{100 * (achieved - target) / abs(target):+.1f}%" if target else f"{achieved - target:+.3g}"


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


def format_stats_table(
    stats: Mapping[str, float],
    targets: Mapping[str, float] | None = None,
    *,
    sources: Mapping[str, str] | None = None,
    bounds: Mapping[str, float] | None = None,
) -> str:
    """A plain-text table of achieved values; with targets (or bounds), each
    target, its source ("paper" or "ours", the first word of ``sources``),
    the fit error, the tolerance and a verdict beside the achieved value."""
    targets, bounds, sources = dict(targets or {}), dict(bounds or {}), dict(sources or {})
    compared = bool(targets or bounds)
    header = ["metric", "target", "source", "achieved", "error", "tolerance", "ok"] if compared else [
        "metric", "achieved"]
    rows = [header]
    for key, (label, kind) in METRICS.items():
        if key not in stats:
            continue
        value = _format_value(stats[key], kind)
        if not compared:
            rows.append([label, value])
        elif key in targets:
            ok = within_tolerance(key, stats[key], targets[key])
            rows.append([label, _format_value(targets[key], kind), sources.get(key, "").split(":")[0], value,
                         fit_error(key, stats[key], targets[key]), _tolerance_text(key), "yes" if ok else "NO"])
        elif key in bounds:
            ok = stats[key] <= bounds[key]
            rows.append([label, "<= " + _format_value(bounds[key], kind), sources.get(key, "").split(":")[0],
                         value, fit_error(key, stats[key], bounds[key]), "bound", "yes" if ok else "NO"])
        else:
            rows.append([label, "", "", value, "", "", ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    shape = f"{int(stats.get('queries', 0))} queries x N = {int(stats.get('N', 0))}"
    return "\n".join([shape, *lines])
