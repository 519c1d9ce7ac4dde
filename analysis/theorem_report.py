"""Text and JSON views of a ``TheoremReport`` (``gyre theorem``).

The text has four parts: the boundary-dispatch table (the theorem, full
simulator), the named Colocate/Async preset rows, the continuous-dispatch
table (group-level model beside its closed form and beside boundary), and a
verdict with the tolerance, the run length and the wall time. The JSON holds
every row with its staleness distributions, the grid and the verdict.

Invariant: the verdict line says PASS exactly when ``report.passed``.
"""

from __future__ import annotations

import math
from typing import Any

from gyre.analysis.theorem import TheoremReport
from gyre.sim.report import format_table

BOUNDARY_COLUMNS = (("trace", "trace"), ("B", "B"), ("N", "N"), ("phi", "phi"), ("mu", "mu"),
                    ("case", "case"), ("predicted", "E[d] pred"), ("measured", "E[d] meas"),
                    ("error", "error"), ("token_weighted_mean", "tok-wtd"), ("p50", "p50"), ("p90", "p90"),
                    ("p99", "p99"), ("max", "max"), ("groups", "groups"))
CONTINUOUS_COLUMNS = (("trace", "trace"), ("B", "B"), ("N", "N"), ("phi", "phi"), ("mu", "mu"),
                      ("continuous_predicted", "cont pred"), ("continuous_measured", "cont meas"),
                      ("continuous_error", "error"), ("continuous_token_weighted_mean", "tok-wtd"),
                      ("continuous_p90", "p90"), ("continuous_max", "max"),
                      ("model_boundary_measured", "bnd model"), ("measured", "bnd sim"),
                      ("difference", "cont-bnd"), ("predicted_difference", "pred diff"))


def _table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> str:
    shown = [{label: _value(key, row.get(key)) for key, label in columns} for row in rows]
    return format_table([label for _, label in columns], shown)


_INTEGRAL = {"B", "N", "mu", "p50", "p90", "p99", "max", "min", "groups", "continuous_p90", "continuous_max",
             "predicted_difference"}


def _value(key: str, value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if key in _INTEGRAL and isinstance(value, (int, float)):
        return int(value)
    if key == "phi":
        return f"{value:g}"
    return value


def _header(report: TheoremReport) -> list[str]:
    g = report.grid
    return [
        "Theorem A.1 under boundary dispatch: steady-state group-weighted mean staleness E[d] = phi + (mu-1)/2",
        f"grid: phi in {list(g.phis)}, mu in {list(g.mus)}, (B, N) in {list(g.shapes)}, traces {list(g.traces)}, "
        f"schedule preset {g.preset}, trace seed {g.seed}",
        f"run length: {g.steps} steps per run; steady-state window: whole bursts after ceil(phi/mu)+2 warm-up "
        "bursts (first..last step shown per row in the JSON)",
        f"tolerance: |measured - predicted| <= {g.tolerance} for every row (boundary and continuous)",
        "not covered by the identity, reported beside it: token-weighted mean (tok-wtd), percentiles "
        "p50/p90/p99 and the maximum",
    ]


def format_report(report: TheoremReport) -> str:
    """The full plain-text report."""
    grid_rows = [r for r in report.rows if r["kind"] == "grid"]
    named_rows = [r for r in report.rows if r["kind"] == "named"]
    parts = ["\n".join(_header(report)), "", "Boundary dispatch, full simulator",
             _table(grid_rows, BOUNDARY_COLUMNS)]
    if named_rows:
        parts += ["", "Named special cases: Colocate (phi = 0, global switch) and Async (mu = 1, static split) "
                  "method presets", _table(named_rows, BOUNDARY_COLUMNS)]
    if grid_rows:
        parts += ["", "Continuous dispatch at equal depth Q = (phi+mu)B (refill on every consumption), "
                  "full simulator (dispatch=continuous)", "closed form: E[d] = phi + mu + (mu-1)/2; "
                  "difference from boundary = mu", _table(grid_rows, CONTINUOUS_COLUMNS)]
    parts += ["", *verdict_lines(report)]
    return "\n".join(parts)


def verdict_lines(report: TheoremReport) -> list[str]:
    g = report.grid
    lines = [
        f"max |error|, boundary (simulator): {report.max_abs_error('error'):.4f}",
        f"max |error|, continuous (simulator): {report.max_abs_error('continuous_error'):.4f}",
        f"max |queue model - simulator|: boundary {_max_model_gap(report, ''):.4f}, "
        f"continuous {_max_model_gap(report, 'continuous_'):.4f}",
        f"runs: {len(report.rows)} of {g.steps} steps each; wall time {report.wall_s:.1f} s",
    ]
    failures = report.failures
    if failures:
        names = ", ".join(f"{r['trace']} B={r['B']} N={r['N']} phi={r['phi']} mu={r['mu']} ({r['preset']})"
                          for r in failures[:5])
        lines.append(f"FAIL: {len(failures)} row(s) miss their prediction by more than {g.tolerance}: {names}")
    else:
        lines.append(f"PASS: every measured mean is within {g.tolerance} of its prediction")
    return lines


def _max_model_gap(report: TheoremReport, prefix: str) -> float:
    model = "model_continuous_measured" if prefix else "model_boundary_measured"
    gaps = [abs(r[model] - r[f"{prefix}measured"]) for r in report.rows if model in r]
    return max(gaps) if gaps else float("nan")


def report_json(report: TheoremReport) -> dict[str, Any]:
    """Everything in the report as JSON-ready data (NaN becomes None)."""
    g = report.grid
    return {
        "identity": "E[d] = phi + (mu - 1) / 2 (boundary); phi + mu + (mu - 1) / 2 (continuous)",
        "grid": {"phis": list(g.phis), "mus": list(g.mus), "shapes": [list(s) for s in g.shapes],
                 "traces": list(g.traces), "steps": g.steps, "seed": g.seed, "preset": g.preset,
                 "named": list(g.named)},
        "tolerance": g.tolerance,
        "max_abs_error": {"boundary": report.max_abs_error("error"),
                          "continuous": report.max_abs_error("continuous_error")},
        "passed": report.passed,
        "wall_seconds": round(report.wall_s, 3),
        "rows": [_clean(row) for row in report.rows],
    }


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value
