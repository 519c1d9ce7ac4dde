"""Figure 5: staleness distributions per method, by group and by token.

Async, Colocate and Gyre at E[d] = 1.5 (top row) and E[d] = 1 (bottom row),
48 steps each on the NL2Repo 122B cluster (quick: 12 steps, the shortest run
that has a steady-state window for every method). Left: share of
consumed groups at each staleness d; right: share of consumed *tokens* at
each d. The legend gives each method's group mean (which Theorem A.1 fixes),
token-weighted mean and maximum, which it does not. Statistics use the
steady-state window of whole bursts (``gyre.staleness.steady_window``); a run too
short for one uses all consumed groups, and the title says so.

``figure_data(quick)`` computes what the figure draws (a ``StalenessData``),
``staleness_data(runs)`` does so for any {E[d] label: {method: Run}} and
``draw(data)`` turns it into a Figure.

Invariants: per (E[d], method, weight) the ``share`` column sums to 1 over the
staleness values; ``stats`` holds the legend's numbers over the same groups
(window ``window_first``..``window_stop``, NaN when the run has none) and the
prediction phi + (mu - 1) / 2 of the run's own (phi, mu).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gyre.analysis.plotting import METHOD_COLORS, house_style, new_figure, run_as_script, save_figure, style_axes
from gyre.analysis.runs import Run, consumed_groups, run_from_result
from gyre.analysis.staleness import staleness_distribution, staleness_stats, token_distribution
from gyre.staleness import predicted_staleness, steady_window

STEM = "fig5_staleness"
SETTINGS = {"1.5": {"Async": "async-1.5", "Colocate": "colocate-1.5", "Gyre": "gyre-1.5"},
            "1": {"Async": "async-1", "Colocate": "colocate-1", "Gyre": "gyre-1"}}
#: Quick runs: the shortest length with a steady-state window for all six methods.
QUICK_STEPS = 12
BAR_COLUMNS = ["ed", "method", "weight", "staleness", "share", "x", "width"]


@dataclass(frozen=True)
class StalenessData:
    """What figure 5 draws (see the module docstring for the invariants)."""

    bars: pd.DataFrame  # ed, method, weight ("groups" | "tokens"), staleness, share, x, width
    stats: pd.DataFrame  # ed, method, phi, mu, predicted, window_first, window_stop, groups, mean, ...


def simulate(quick: bool = False, steps: int = 48) -> dict[str, dict[str, Run]]:
    from gyre.sim.runner import run_simulation

    steps = QUICK_STEPS if quick else steps
    return {ed: {label: run_from_result(run_simulation(preset, "nl2repo-122b", steps=steps, seed=0), name=label)
                 for label, preset in methods.items()} for ed, methods in SETTINGS.items()}


def figure_data(quick: bool = False) -> StalenessData:
    """The data of figure 5, from the six runs of ``simulate(quick)``."""
    return staleness_data(simulate(quick))


def window_of(run: Run) -> tuple[int, int] | None:
    """The steady-state window of a run, or None when the run is too short for one."""
    cfg, steps = run.config, int(run.steps["end_s"].notna().sum())
    try:
        return steady_window(float(cfg["phi"]), int(cfg["mu"]), steps)
    except (KeyError, ValueError):
        return None


def staleness_data(runs: dict[str, dict[str, Run]]) -> StalenessData:
    """Bars and legend statistics of every run, E[d] rows and methods in the given order."""
    bars, stats = [], []
    for ed, methods in runs.items():
        width = 0.8 / max(1, len(methods))
        for i, (label, run) in enumerate(methods.items()):
            groups, window = consumed_groups(run), window_of(run)
            offset = (i - (len(methods) - 1) / 2) * width
            bars += [_bar_rows(dist(groups, window), offset, width).assign(ed=ed, method=label, weight=weight)
                     for weight, dist in (("groups", staleness_distribution), ("tokens", token_distribution))]
            stats.append(_stats_row(ed, label, run, groups, window))
    return StalenessData(pd.concat(bars, ignore_index=True)[BAR_COLUMNS], pd.DataFrame(stats))


def _bar_rows(dist: pd.Series, offset: float, width: float) -> pd.DataFrame:
    """One bar per staleness value of a distribution, shifted by the method's offset."""
    return pd.DataFrame({"staleness": dist.index, "share": dist.to_numpy(), "x": dist.index.to_numpy() + offset,
                         "width": width})


def _stats_row(ed: str, label: str, run: Run, groups: pd.DataFrame, window: tuple[int, int] | None) -> dict:
    phi, mu = float(run.config["phi"]), int(run.config["mu"])
    first, stop = window or (np.nan, np.nan)
    return {"ed": ed, "method": label, "phi": phi, "mu": mu, "predicted": predicted_staleness(phi, mu),
            "window_first": first, "window_stop": stop, **staleness_stats(groups, window)}


def _bars(ax, data: StalenessData, ed: str, weight: str) -> None:
    bars = data.bars[(data.bars["ed"] == ed) & (data.bars["weight"] == weight)]
    for stats in data.stats[data.stats["ed"] == ed].itertuples():
        mine = bars[bars["method"] == stats.method]
        legend = (f"{stats.method}: mean {stats.mean:.2f}, tok-wtd {stats.token_weighted_mean:.2f}, "
                  f"max {stats.max:.0f}")
        ax.bar(mine["x"].to_numpy(), 100 * mine["share"].to_numpy(), width=mine["width"].to_numpy(),
               color=METHOD_COLORS.get(stats.method), label=legend)
    ax.set_xlabel("staleness d = v_t - v_d (policy versions)")
    ax.set_ylabel(f"share of consumed {weight} (%)")
    ax.xaxis.set_major_locator(_integer_locator())
    style_axes(ax)


def _integer_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def draw(data: StalenessData) -> Figure:
    """Figure 5 from its data: one row per E[d], group-weighted left, token-weighted right."""
    eds = list(dict.fromkeys(data.stats["ed"]))
    with house_style():
        fig, axes = new_figure(9.0, 3.1 * len(eds), len(eds), 2, squeeze=False)
        for row, ed in enumerate(eds):
            steady = bool(data.stats.loc[data.stats["ed"] == ed, "window_first"].notna().all())
            scope = "steady state" if steady else "all consumed groups (run too short for a steady state)"
            for col, weight in enumerate(("groups", "tokens")):
                ax = axes[row][col]
                _bars(ax, data, ed, weight)
                ax.set_title(f"E[d] = {ed}: {weight[:-1]}-weighted, {scope}", fontsize=9)
                ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
                ax.legend(frameon=False, loc="upper right", fontsize=7)
        return fig


def main(out_dir: Path, quick: bool = False, data=None, save=save_figure) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) and ``save`` it as PNG and SVG."""
    with house_style():
        return save(draw(figure_data(quick) if data is None else data), Path(out_dir), STEM)


if __name__ == "__main__":
    run_as_script(main)
