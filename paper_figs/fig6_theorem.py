"""Figure 6: measured against predicted staleness over the Theorem A.1 grid.

Left: steady-state group-weighted mean staleness against its closed form for
every grid point (``gyre theorem``'s grid: phi x mu x (B, N) x traces), for
boundary dispatch (full simulator, circles; named Colocate/Async preset rows,
squares) and continuous dispatch at equal depth (full simulator,
triangles; closed form phi + mu + (mu-1)/2). Middle: the error of each point
with the tolerance band. Right: what the identity does not fix, for boundary
dispatch: the token-weighted mean, the 90th percentile and the maximum
against the predicted mean.

Data: ``analysis.theorem.run_theorem(TheoremGrid())`` (quick: ``SMALL_GRID``
with fewer steps). ``figure_data(quick)`` computes what the figure draws (a
``TheoremData``), ``theorem_data(report)`` does so for any ``TheoremReport``
and ``draw(data)`` turns it into a Figure.

Invariants: ``grid`` and ``named`` are the report's rows (``error`` =
``measured`` - ``predicted``); ``x`` and ``continuous_x`` are the predicted
means plus a per-(trace, B) offset of at most 0.02 * (pairs - 1) versions,
so coincident points stay visible.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gyre.analysis.plotting import POLICY_COLORS, house_style, new_figure, run_as_script, save_figure, style_axes
from gyre.analysis.theorem import SMALL_GRID, TheoremGrid, TheoremReport, run_theorem

STEM = "fig6_theorem"


@dataclass(frozen=True)
class TheoremData:
    """What figure 6 draws (see the module docstring for the invariants)."""

    grid: pd.DataFrame  # E0 grid rows of the report, plus x and continuous_x
    named: pd.DataFrame  # named preset rows of the report
    tolerance: float
    title: str


def simulate(quick: bool = False) -> TheoremReport:
    grid = dataclasses.replace(SMALL_GRID, steps=24) if quick else TheoremGrid()
    return run_theorem(grid, jobs=1 if quick else min(4, os.cpu_count() or 1))


def figure_data(quick: bool = False) -> TheoremData:
    """The data of figure 6, from the report of ``simulate(quick)``."""
    return theorem_data(simulate(quick))


def theorem_data(report: TheoremReport) -> TheoremData:
    """The report's rows with plotting positions, its tolerance and the figure's title."""
    grid, named = report.frame("grid"), report.frame("named")
    grid = grid.assign(x=grid["predicted"] + _jitter(grid), continuous_x=grid["continuous_predicted"] + _jitter(grid))
    return TheoremData(grid, named, report.grid.tolerance, _title(report))


def _title(report: TheoremReport) -> str:
    g = report.grid
    return (f"Theorem A.1 over {len(report.rows)} runs of {g.steps} steps: phi in {list(g.phis)}, "
            f"mu in {list(g.mus)},\n(B, N) in {list(g.shapes)}, traces {', '.join(g.traces)}; "
            f"max |error| boundary {report.max_abs_error('error'):.3f}, "
            f"continuous {report.max_abs_error('continuous_error'):.3f}")


def _jitter(frame, column: str = "trace") -> np.ndarray:
    """Small horizontal offsets per trace and shape so coincident points stay visible."""
    keys = list(dict.fromkeys(zip(frame[column], frame["B"])))
    index = np.array([keys.index(k) for k in zip(frame[column], frame["B"])])
    return (index - (len(keys) - 1) / 2) * 0.04


def _measured_panel(ax, grid, named) -> None:
    ax.scatter(grid["x"], grid["measured"], s=14, marker="o", facecolors="none",
               edgecolors=POLICY_COLORS["boundary"], label="boundary, simulator", zorder=3)
    if len(named):
        ax.scatter(named["predicted"], named["measured"], s=30, marker="s", color="black",
                   label="Colocate / Async presets")
    ax.scatter(grid["continuous_x"], grid["continuous_measured"], s=14, marker="^",
               color=POLICY_COLORS["continuous"], label="continuous, simulator")
    top = float(np.nanmax(grid[["measured", "continuous_measured"]].to_numpy())) + 0.5
    ax.plot([0, top], [0, top], color="black", lw=0.8, ls=":", label="measured = predicted")
    ax.set_xlabel("predicted mean staleness (versions)")
    ax.set_ylabel("measured mean staleness (versions)")
    ax.set_title("Steady-state group-weighted mean")
    ax.legend(frameon=False, loc="upper left", fontsize=7)


def _error_panel(ax, grid, named, tolerance: float) -> None:
    ax.axhspan(-tolerance, tolerance, color="#EEEEEE", label=f"tolerance ±{tolerance}")
    ax.scatter(grid["x"], grid["error"], s=14, facecolors="none",
               edgecolors=POLICY_COLORS["boundary"], label="boundary, simulator")
    if len(named):
        ax.scatter(named["predicted"], named["error"], s=30, marker="s", color="black", label="presets")
    ax.scatter(grid["continuous_x"], grid["continuous_error"], s=14, marker="^",
               color=POLICY_COLORS["continuous"], label="continuous, simulator")
    ax.set_ylim(-2 * tolerance, 2 * tolerance)
    ax.set_xlabel("predicted mean staleness (versions)")
    ax.set_ylabel("measured - predicted (versions)")
    ax.set_title("Error")
    ax.legend(frameon=False, loc="lower right", fontsize=7)


def _uncovered_panel(ax, grid) -> None:
    x = grid["x"]
    ax.scatter(x, grid["max"], s=14, marker="v", color="#444444", label="maximum")
    ax.scatter(x, grid["p90"], s=14, marker="_", color="#2E86AB", label="90th percentile")
    ax.scatter(x, grid["token_weighted_mean"], s=10, marker="o", color="#E07B39", label="token-weighted mean")
    right = float(np.nanmax(grid["predicted"])) + 0.3
    ax.plot([0, right], [0, right], color="black", lw=0.8, ls=":", label="predicted group mean")
    ax.set_xlabel("predicted mean staleness (versions)")
    ax.set_ylabel("staleness (versions)")
    ax.set_title("Boundary dispatch: beyond the identity")
    ax.legend(frameon=False, loc="upper left", fontsize=7)


def draw(data: TheoremData) -> Figure:
    """Figure 6 from its data: measured against predicted, the error, and what the identity leaves free."""
    with house_style():
        fig, axes = new_figure(12.0, 4.0, 1, 3)
        _measured_panel(axes[0], data.grid, data.named)
        _error_panel(axes[1], data.grid, data.named, data.tolerance)
        _uncovered_panel(axes[2], data.grid)
        for ax in axes:
            style_axes(ax)
        fig.suptitle(data.title)
        return fig


def main(out_dir: Path, quick: bool = False, data=None, save=save_figure) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) and ``save`` it as PNG and SVG."""
    with house_style():
        return save(draw(figure_data(quick) if data is None else data), Path(out_dir), STEM)


if __name__ == "__main__":
    run_as_script(main)
