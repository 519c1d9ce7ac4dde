"""Figure 5: staleness distributions per method, by group and by token.

Async, Colocate and Gyre at E[d] = 1.5 (top row) and E[d] = 1 (bottom row),
48 steps each on the NL2Repo 122B cluster (quick: 6 steps). Left: share of
consumed groups at each staleness d; right: share of consumed *tokens* at
each d. The legend gives each method's group mean (which Theorem A.1 fixes),
token-weighted mean and maximum, which it does not. Statistics use the
steady-state window of whole bursts (``staleness.steady_window``); a run too
short for one (quick mode) uses all consumed groups, and the title says so.

``plot(runs, out_dir)`` draws any {E[d] label: {method: Run}}.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gyre.analysis.plotting import METHOD_COLORS, house_style, new_figure, save_figure, style_axes, run_as_script
from gyre.analysis.runs import Run, consumed_groups, run_from_result
from gyre.analysis.staleness import staleness_distribution, staleness_stats, steady_window, token_distribution

STEM = "fig5_staleness"
SETTINGS = {"1.5": {"Async": "async-1.5", "Colocate": "colocate-1.5", "Gyre": "gyre-1.5"},
            "1": {"Async": "async-1", "Colocate": "colocate-1", "Gyre": "gyre-1"}}


def simulate(quick: bool = False, steps: int = 48) -> dict[str, dict[str, Run]]:
    from gyre.sim.runner import run_simulation

    steps = 6 if quick else steps
    return {ed: {label: run_from_result(run_simulation(preset, "nl2repo-122b", steps=steps, seed=0), name=label)
                 for label, preset in methods.items()} for ed, methods in SETTINGS.items()}


def window_of(run: Run) -> tuple[int, int] | None:
    """The steady-state window of a run, or None when the run is too short for one."""
    cfg, steps = run.config, int(run.steps["end_s"].notna().sum())
    try:
        return steady_window(float(cfg["phi"]), int(cfg["mu"]), steps)
    except (KeyError, ValueError):
        return None


def _bars(ax, runs: dict[str, Run], by_tokens: bool) -> None:
    width = 0.8 / max(1, len(runs))
    for i, (label, run) in enumerate(runs.items()):
        groups, window = consumed_groups(run), window_of(run)
        dist = (token_distribution if by_tokens else staleness_distribution)(groups, window)
        stats = staleness_stats(groups, window)
        legend = (f"{label}: mean {stats['mean']:.2f}, tok-wtd {stats['token_weighted_mean']:.2f}, "
                  f"max {stats['max']:.0f}")
        ax.bar(dist.index.to_numpy() + (i - (len(runs) - 1) / 2) * width, 100 * dist.to_numpy(), width=width,
               color=METHOD_COLORS.get(label), label=legend)
    ax.set_xlabel("staleness d = v_t - v_d (policy versions)")
    ax.set_ylabel(f"share of consumed {'tokens' if by_tokens else 'groups'} (%)")
    ax.xaxis.set_major_locator(_integer_locator())
    style_axes(ax)


def _integer_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def plot(runs: dict[str, dict[str, Run]], out_dir: Path) -> list[Path]:
    with house_style():
        fig, axes = new_figure(9.0, 3.1 * len(runs), len(runs), 2, squeeze=False)
        for row, (ed, methods) in enumerate(runs.items()):
            steady = all(window_of(r) is not None for r in methods.values())
            scope = "steady state" if steady else "all consumed groups (run too short for a steady state)"
            for col, by_tokens in enumerate((False, True)):
                ax = axes[row][col]
                _bars(ax, methods, by_tokens)
                ax.set_title(f"E[d] = {ed}: {'token' if by_tokens else 'group'}-weighted, {scope}", fontsize=9)
                ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
                ax.legend(frameon=False, loc="upper right", fontsize=7)
        return save_figure(fig, out_dir, STEM)


def main(out_dir: Path, quick: bool = False) -> list[Path]:
    return plot(simulate(quick), Path(out_dir))


if __name__ == "__main__":
    run_as_script(main)
