"""Figure 1: role timeline of one burst of Gyre (E0).

Top: one row per cell, coloured by role over time (rollout, training, and the
two transition directions), with step spans, publications (dashed lines: the
core publishes to the rollout engines) and satellites joining a step already
in flight (triangles, labelled with the step they join). Bottom: executions
running in rollout over the same window, which shows why cells may switch:
the waterlevel falls as long executions finish.

Data: ``gyre sim --preset E0 --steps 12`` (quick: 6 steps); the burst shown
is the one after the first with the most satellite joins (``busiest_burst``).
``figure_data(quick)`` computes everything the figure draws (a
``TimelineData``); ``timeline_data(run)`` does so for any run and
``draw(data)`` turns it into a Figure without computing anything else.

Invariants: ``roles`` holds every role interval of the run (per cell they
tile [0, end of run]); ``bars`` are those intervals clipped to the window
[t0, t1] (the burst plus 2% margins), with switches widened to at least
``MIN_SWITCH_WIDTH`` of the window, in drawing order (switches last); all x
positions are hours from t0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from gyre.analysis.plotting import (
    HOUR_S,
    ROLE_COLORS,
    ROLE_LABELS,
    house_style,
    new_figure,
    run_as_script,
    save_figure,
    style_axes,
)
from gyre.analysis.runs import Run, run_from_result
from gyre.analysis.timeline import burst_span, publications, running_executions, satellite_joins

STEM = "fig1_role_timeline"
#: Switches last seconds in a burst of hours; draw each at least this share of the window wide.
MIN_SWITCH_WIDTH = 0.008


@dataclass(frozen=True)
class TimelineData:
    """What figure 1 draws (see the module docstring for the invariants)."""

    name: str
    burst: int
    mu: int
    cells: int
    t0_s: float
    t1_s: float
    burst_start_s: float
    roles: pd.DataFrame  # cell, role, start_s, end_s: every role interval of the run
    bars: pd.DataFrame  # cell, role, x_h, width_h: the drawn rectangles
    steps: pd.DataFrame  # step, left_h, right_h: the burst's completed steps, clipped to the window
    publications: pd.DataFrame  # version, x_h: publications starting inside the window
    joins: pd.DataFrame  # cell, step, x_h: satellite joins inside the window
    load: pd.DataFrame  # time_s, x_h, running: executions running from time_s (x_h on the axis) on


def simulate(quick: bool = False) -> Run:
    from gyre.sim.runner import run_simulation

    return run_from_result(run_simulation("E0", "nl2repo-122b", steps=6 if quick else 12, seed=0), name="E0")


def figure_data(quick: bool = False) -> TimelineData:
    """The data of figure 1, from the E0 run of ``simulate(quick)``."""
    return timeline_data(simulate(quick))


def busiest_burst(run: Run) -> int:
    """The completed burst after the first with the most satellite joins (earliest on ties; 0 if none)."""
    mu = int(run.config.get("mu", 1))
    done = int(run.steps["end_s"].notna().sum()) // mu
    joins = satellite_joins(run)["step"] // mu
    candidates = list(range(1, done)) or [0]
    return max(candidates, key=lambda b: (int((joins == b).sum()), -b))


def timeline_data(run: Run, burst: int | None = None) -> TimelineData:
    """Everything figure 1 draws for burst ``burst`` of ``run`` (default: ``busiest_burst``)."""
    burst = busiest_burst(run) if burst is None else burst
    start, end = burst_span(run, burst)
    t0, t1 = start - 0.02 * (end - start), end + 0.02 * (end - start)  # margins show both publications
    mu = int(run.config.get("mu", 1))
    roles = run.roles[["cell", "role", "start_s", "end_s"]].reset_index(drop=True)
    return TimelineData(
        name=run.name or "run", burst=burst, mu=mu, cells=int(run.roles["cell"].max()) + 1, t0_s=t0, t1_s=t1,
        burst_start_s=start, roles=roles, bars=_bars(roles, t0, t1),
        steps=_steps(run, t0, t1, range(burst * mu, (burst + 1) * mu)),
        publications=_in_window(publications(run), "start_s", t0, t1)[["version", "x_h"]],
        joins=_in_window(satellite_joins(run), "joined_at_s", t0, t1)[["cell", "step", "x_h"]],
        load=_load(run, t0))


def _bars(roles: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """Role intervals clipped to [t0, t1], switches widened and drawn last."""
    switches_last = roles.assign(is_switch=roles["role"].str.startswith("to_")).sort_values("is_switch")
    rows = []
    for row in switches_last.itertuples():
        start, end = max(row.start_s, t0), min(row.end_s, t1)
        if end <= start:
            continue
        if row.is_switch:  # widen few-second switches so they stay visible
            end = start + max(end - start, (t1 - t0) * MIN_SWITCH_WIDTH)
        rows.append({"cell": int(row.cell), "role": row.role, "x_h": (start - t0) / HOUR_S,
                     "width_h": (end - start) / HOUR_S})
    return pd.DataFrame(rows, columns=["cell", "role", "x_h", "width_h"])


def _steps(run: Run, t0: float, t1: float, shown: range) -> pd.DataFrame:
    steps = run.steps[run.steps["step"].isin(list(shown)) & run.steps["end_s"].notna()]
    return pd.DataFrame({"step": steps["step"].astype(int),
                         "left_h": (steps["start_s"].clip(lower=t0) - t0) / HOUR_S,
                         "right_h": (steps["end_s"].clip(upper=t1) - t0) / HOUR_S}).reset_index(drop=True)


def _in_window(frame: pd.DataFrame, column: str, t0: float, t1: float) -> pd.DataFrame:
    inside = frame[(frame[column] >= t0) & (frame[column] <= t1)]
    return inside.assign(x_h=(inside[column] - t0) / HOUR_S).reset_index(drop=True)


def _load(run: Run, t0: float) -> pd.DataFrame:
    load = running_executions(run)
    return pd.DataFrame({"time_s": load["time_s"], "x_h": (load["time_s"] - t0) / HOUR_S, "running": load["running"]})


def _draw_roles(ax, data: TimelineData) -> None:
    for row in data.bars.itertuples():
        ax.broken_barh([(row.x_h, row.width_h)], (row.cell - 0.4, 0.8), facecolors=ROLE_COLORS[row.role],
                       edgecolor="none")
    for role, colour in ROLE_COLORS.items():
        ax.bar(0, 0, color=colour, label=ROLE_LABELS[role])


def _draw_markers(ax, data: TimelineData) -> None:
    for s in data.steps.itertuples():
        ax.annotate("", xy=(s.left_h, data.cells - 0.2), xytext=(s.right_h, data.cells - 0.2),
                    arrowprops={"arrowstyle": "|-|", "color": "#444444", "lw": 0.8, "mutation_scale": 3})
        ax.text((s.left_h + s.right_h) / 2, data.cells + 0.2, f"step {s.step}", ha="center", va="center",
                fontsize=7)
    for i, x in enumerate(data.publications["x_h"]):
        ax.axvline(x, color="black", ls="--", lw=1.0, label="publication (new weights to rollout)" if i == 0 else None)
    joins = data.joins
    ax.scatter(joins["x_h"], joins["cell"], marker=">", s=40, color="black", zorder=5,
               label="satellite joins an in-flight step")
    for j in joins.itertuples():
        ax.text(j.x_h, j.cell + 0.45, f"joins step {j.step}", fontsize=6.5, va="bottom")


def draw(data: TimelineData) -> Figure:
    """Figure 1 from its data: the role rows on top, running executions below."""
    with house_style():
        fig, (ax, ax_load) = new_figure(7.5, 5.2, 2, 1, sharex=True, height_ratios=(3, 1.2))
        _draw_roles(ax, data)
        _draw_markers(ax, data)
        first = data.burst * data.mu
        ax.set_yticks(range(data.cells), [f"cell {c}" + (" (core)" if c == 0 else "") for c in range(data.cells)])
        ax.set_ylim(-0.6, data.cells + 0.5)
        ax.invert_yaxis()
        ax.set_title(f"{data.name}: cell roles over burst {data.burst} (steps {first}..{first + data.mu - 1})")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, frameon=False,
                  title=f"switches (a few seconds) are drawn at least {MIN_SWITCH_WIDTH:.1%} of the window wide",
                  title_fontsize=7)
        ax_load.step(data.load["x_h"], data.load["running"], where="post", color=ROLE_COLORS["rollout"])
        ax_load.set_xlim(0, (data.t1_s - data.t0_s) / HOUR_S)
        ax_load.set_ylim(bottom=0)
        ax_load.set_xlabel(f"time (h) from {data.t0_s / HOUR_S:.2f} h into the run; the burst starts at "
                           f"{(data.burst_start_s - data.t0_s) / HOUR_S:.2f} h on this axis")
        ax_load.set_ylabel("running\nexecutions")
        style_axes(ax_load)
        return fig


def main(out_dir: Path, quick: bool = False, data=None, save=save_figure) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) and ``save`` it as PNG and SVG."""
    with house_style():
        return save(draw(figure_data(quick) if data is None else data), Path(out_dir), STEM)


if __name__ == "__main__":
    run_as_script(main)
