"""Plain-text tables for simulation summaries and grids."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

_SUMMARY_ROWS = (
    ("preset", "schedule preset", "{}"),
    ("trace", "trace", "{}"),
    ("steps", "steps", "{}"),
    ("total_hours", "total time (h)", "{:.3f}"),
    ("mean_step_hours", "time per step (h)", "{:.3f}"),
    ("staleness_mean", "staleness, group mean (all steps)", "{:.3f}"),
    ("staleness_steady_mean", "staleness, steady-state group mean", "{:.3f}"),
    ("steady_steps", "  over steps", "{}"),
    ("staleness_predicted", "  predicted E[d] (Theorem A.1)", "{:.3f}"),
    ("staleness_token_weighted_mean", "staleness, token-weighted mean", "{:.3f}"),
    ("staleness_max", "staleness, max", "{}"),
    ("transitions", "role transitions", "{}"),
    ("reroutes", "rerouted executions", "{}"),
    ("slack", "slack: idle share of training-role node time", "{:.3f}"),
    ("events", "events to the policy core", "{}"),
    ("wall_seconds", "simulator wall time (s)", "{:.2f}"),
)


_IN_SECONDS = {"total_hours": ("total_s", "total time (s)", "{:.2f}"),
               "mean_step_hours": ("mean_step_s", "time per step (s)", "{:.2f}")}


def format_summary(summary: dict[str, Any]) -> str:
    width = max(len(label) for _, label, _ in _SUMMARY_ROWS)
    lines = []
    seconds = summary.get("units") == "s"  # a real run's trace: its own units
    for key, label, fmt in _SUMMARY_ROWS:
        if seconds and key in _IN_SECONDS:
            key, label, fmt = _IN_SECONDS[key]
        value = summary.get(key)
        lines.append(f"{label:<{width}}  {'-' if value is None else fmt.format(value)}")
    realized = summary.get("realized_profile")
    if realized and realized.get("executions"):
        lines.append(f"realized profile ({realized['executions']} executions, {realized['queries']} queries):")
        lines += [f"  {name.replace('_', ' '):<{width - 2}}  {'-' if value is None else f'{value:.4f}'}"
                  for name, value in realized.items() if name not in ("executions", "queries")]
    exposure = summary.get("training_exposure")
    if exposure and exposure.get("bursts"):
        lines.append(f"training per burst ({exposure['bursts']} bursts): exposed {exposure['exposed_s_mean']:.0f} s "
                     f"mean, rollout hides it with a margin of {exposure['margin_s_mean']:.0f} s mean "
                     f"(min share {exposure['margin_share_min']})")
    waits = summary.get("switch_waits")
    if waits and waits["all"]["switches"]:
        w = waits["all"]
        lines.append(f"switches to training: {w['switches']}; outstanding at them: {w['outstanding_stuck']} stuck at "
                     f"a ceiling, {w['outstanding_progressing']} progressing; waited {w['stuck_tail_s_mean']:.0f} s "
                     "mean after the last progressing execution ended")
    breakdown = summary.get("time_breakdown_hours")
    if breakdown:
        lines.append("where the time goes (h; any execution running makes an instant rollout, so training hidden")
        lines.append("  behind rollout is not 'training exposed' here; the per-burst 'exposed' above is):")
        lines += [f"  {name.replace('_', ' '):<{width - 2}}  {hours:.3f}" for name, hours in breakdown.items()]
    return "\n".join(lines)


def format_table(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """Fixed-width table; floats with 3 decimals."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    out += ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
