"""Figure 2: query and execution duration distributions (NL2Repo, Qwen 3.6 122B).

Left: execution durations; right: query durations (the slowest of a query's N
executions, which is what a rollout group waits for). Histograms of the share
of executions / queries per 0.25 h bin; the last bar collects everything at
and above the harness ceiling (5 h for this preset: harness timeouts end
there, overall timeouts at the 5.5 h budget; both read from the trace preset).
Dotted line: 4 h, the mark docs/workload.md#workload-profile counts long queries against (9.51% of
queries exceed it); dashed line: the harness ceiling. Annotations give the
mean and the share above 4 h.

Data: the simulator's input trace, ``nl2repo-122b`` generated with seed 0
(2,000 queries x 16; quick: 200), i.e. exactly the durations the simulator
runs (no slowdown model is on by default). ``figure_data(quick)`` gives the
two ``Histogram`` panels the figure draws; ``histogram(hours)`` builds one for
any duration array in hours and ``draw(panels)`` turns them into a Figure.

Invariants of a ``Histogram``: ``bins.count`` sums to ``n`` (every duration
falls in exactly one bin: [left, left + 0.25 h), the last one [ceiling, inf));
``bins.share_pct`` is ``100 * count / n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gyre.analysis.plotting import HOUR_S, house_style, new_figure, run_as_script, save_figure, style_axes
from gyre.sim.traces.presets import get_preset

STEM = "fig2_durations"
TRACE = "nl2repo-122b"
CEILING_H = get_preset(TRACE).model.ceiling_h
OVERFLOW_H = CEILING_H
BIN_H = 0.25
TIMEOUT_H = 4.0  # docs/workload.md#workload-profile: the share of queries above 4 h
QUERY_TITLE = "queries (slowest of N = 16)"


@dataclass(frozen=True)
class Histogram:
    """One panel: the bins (left_h, width_h, count, share_pct) and the annotated statistics."""

    bins: pd.DataFrame
    n: int
    mean_h: float
    over_timeout_pct: float


def durations(quick: bool = False, trace: str = TRACE) -> tuple[np.ndarray, np.ndarray]:
    """(execution hours, query hours) of the simulator's generated trace."""
    from gyre.sim.traces.presets import generate_trace

    generated = generate_trace(trace, 200 if quick else 2000, np.random.default_rng(0), N=16)
    grid_h = generated.durations_s / HOUR_S
    return grid_h.ravel(), grid_h.max(axis=1)


def binned_counts(hours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(left edges, counts) with 0.25 h bins up to the ceiling and one overflow bin from it."""
    edges = np.append(np.arange(0.0, OVERFLOW_H - 1e-9, BIN_H), OVERFLOW_H)
    counts, _ = np.histogram(np.minimum(hours, OVERFLOW_H), bins=np.append(edges, np.inf))
    return edges, counts


def histogram(hours: np.ndarray) -> Histogram:
    """One panel's data for durations in hours."""
    edges, counts = binned_counts(hours)
    bins = pd.DataFrame({"left_h": edges, "width_h": np.append(np.diff(edges), BIN_H), "count": counts,
                         "share_pct": 100.0 * counts / max(1, hours.size)})
    return Histogram(bins, int(hours.size), float(hours.mean()), float(100 * (hours > TIMEOUT_H).mean()))


def figure_data(quick: bool = False) -> dict[str, Histogram]:
    """{"executions": ..., QUERY_TITLE: ...}: the two panels, left to right."""
    execution_h, query_h = durations(quick)
    return {"executions": histogram(execution_h), QUERY_TITLE: histogram(query_h)}


def _panel(ax, hist: Histogram, title: str, unit: str) -> None:
    bins = hist.bins
    colours = ["#4C8BD6"] * (len(bins) - 1) + ["#D1495B"]
    ax.bar(bins["left_h"], bins["share_pct"], width=bins["width_h"] * 0.95, align="edge", color=colours)
    ax.axvline(TIMEOUT_H, color="black", ls=":", lw=1.0, label="4 h (the profile's long-query mark)")
    ax.axvline(CEILING_H, color="black", ls="--", lw=1.0, label=f"{CEILING_H:g} h harness ceiling")
    ax.set_xticks([0, 1, 2, 3, 4, OVERFLOW_H + BIN_H / 2], ["0", "1", "2", "3", "4", f"≥{OVERFLOW_H:g}"])
    ax.set_xlabel("duration (h)")
    ax.set_ylabel(f"share of {unit} (%)")
    ax.set_title(title)
    text = f"n = {hist.n:,}\nmean {hist.mean_h:.2f} h\n> 4 h: {hist.over_timeout_pct:.2f}%"
    ax.text(0.03, 0.97, text, transform=ax.transAxes, va="top", fontsize=8)
    ax.legend(loc="center right", frameon=False, fontsize=7)
    style_axes(ax)


def draw(panels: dict[str, Histogram]) -> Figure:
    """Figure 2 from its two panels (titles are the keys; the first is executions, the second queries)."""
    with house_style():
        fig, axes = new_figure(8.0, 3.2, 1, 2)
        for ax, (title, hist), unit in zip(axes, panels.items(), ("executions", "queries")):
            _panel(ax, hist, title, unit)
        fig.suptitle(f"NL2Repo rollout durations; last bar collects the {CEILING_H:g} h ceiling and above")
        return fig


def main(out_dir: Path, quick: bool = False, data=None, save=save_figure) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) and ``save`` it as PNG and SVG."""
    with house_style():
        return save(draw(figure_data(quick) if data is None else data), Path(out_dir), STEM)


if __name__ == "__main__":
    run_as_script(main)
