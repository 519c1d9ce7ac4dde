"""Figure 2: query and execution duration distributions (NL2Repo, Qwen 3.6 122B).

Left: execution durations; right: query durations (the slowest of a query's N
executions, which is what a rollout group waits for). Histograms of the share
of executions / queries per 0.25 h bin; the last bar collects everything at
4.45 h and above (overall timeouts end at the 4.5 h budget). Dotted line: the
4 h harness timeout; annotations give the mean and the share above 4 h.

Data: the simulator's input trace, ``nl2repo-122b`` generated with seed 0
(2,000 queries x 16; quick: 200), i.e. exactly the durations the simulator
runs (no slowdown model is on by default). ``plot(execution_h, query_h,
out_dir)`` draws any pair of duration arrays in hours.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gyre.analysis.plotting import HOUR_S, house_style, new_figure, save_figure, style_axes, run_as_script

STEM = "fig2_durations"
OVERFLOW_H = 4.45
BIN_H = 0.25
TIMEOUT_H = 4.0


def durations(quick: bool = False, trace: str = "nl2repo-122b") -> tuple[np.ndarray, np.ndarray]:
    """(execution hours, query hours) of the simulator's generated trace."""
    from gyre.sim.trace_presets import generate_trace

    generated = generate_trace(trace, 200 if quick else 2000, np.random.default_rng(0), N=16)
    grid_h = generated.durations_s / HOUR_S
    return grid_h.ravel(), grid_h.max(axis=1)


def binned_shares(hours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(left edges, shares in %) with 0.25 h bins up to 4.45 h and one overflow bin at 4.45 h."""
    edges = np.append(np.arange(0.0, OVERFLOW_H - 1e-9, BIN_H), OVERFLOW_H)
    clipped = np.minimum(hours, OVERFLOW_H)
    counts, _ = np.histogram(clipped, bins=np.append(edges, np.inf))
    return edges, 100.0 * counts / max(1, hours.size)


def _panel(ax, hours: np.ndarray, title: str, unit: str) -> None:
    edges, shares = binned_shares(hours)
    widths = np.append(np.diff(edges), BIN_H)
    colours = ["#4C8BD6"] * (len(edges) - 1) + ["#D1495B"]
    ax.bar(edges, shares, width=widths * 0.95, align="edge", color=colours)
    ax.axvline(TIMEOUT_H, color="black", ls=":", lw=1.0, label="4 h harness timeout")
    ax.set_xticks([0, 1, 2, 3, 4, OVERFLOW_H + BIN_H / 2], ["0", "1", "2", "3", "4", f"≥{OVERFLOW_H}"])
    ax.set_xlabel("duration (h)")
    ax.set_ylabel(f"share of {unit} (%)")
    ax.set_title(title)
    text = f"n = {hours.size:,}\nmean {hours.mean():.2f} h\n> 4 h: {100 * (hours > TIMEOUT_H).mean():.2f}%"
    ax.text(0.03, 0.97, text, transform=ax.transAxes, va="top", fontsize=8)
    ax.legend(loc="upper right", frameon=False)
    style_axes(ax)


def plot(execution_h: np.ndarray, query_h: np.ndarray, out_dir: Path) -> list[Path]:
    with house_style():
        fig, (left, right) = new_figure(8.0, 3.2, 1, 2)
        _panel(left, execution_h, "executions", "executions")
        _panel(right, query_h, "queries (slowest of N = 16)", "queries")
        fig.suptitle("NL2Repo rollout durations; last bar collects 4.45 h and above")
        return save_figure(fig, out_dir, STEM)


def main(out_dir: Path, quick: bool = False) -> list[Path]:
    return plot(*durations(quick), Path(out_dir))


if __name__ == "__main__":
    run_as_script(main)
